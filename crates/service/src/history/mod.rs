//! Reading a team's history from Prometheus, two ways:
//! - remote-read (`POST /api/v1/read`; Prometheus, Mimir, Cortex): raw samples, a
//!   snappy-compressed protobuf [`proto::ReadRequest`] answered by every series' samples in one
//!   message (`SAMPLES`) or by frames of chunks as the server reads them
//!   (`STREAMED_XOR_CHUNKS`, asked first: the server keeps one frame in memory rather than the
//!   whole answer). Backtests read it ([`backtest`]).
//! - the query API (`GET /api/v1/query_range`; Thanos and VictoriaMetrics serve it too): a
//!   selector's value at every step, far fewer samples than raw when the step is a rule's
//!   window. A warm start reads it ([`warm`]).
//!
//! Requests are tried again with backoff when the server is down, overloaded (429) or failing
//! (5xx), and refused at once with its reason otherwise. Both page a long range by time, so
//! that it is read in bounded memory on both sides.

pub mod backtest;
pub mod proto;
pub mod query;
pub mod selector;
pub mod warm;
pub mod xor;

use crate::backoff::Backoff;
use proto::{ChunkedReadResponse, LabelMatcher, Query, ReadRequest, ReadResponse, TimeSeries};
use std::time::Duration;
use vigil_engine::event::Millis;

/// Why history could not be read, and whether trying again may help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusError {
    pub message: String,
    pub retryable: bool,
}

impl std::fmt::Display for PrometheusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PrometheusError {}

fn fatal(message: String) -> PrometheusError {
    PrometheusError { message, retryable: false }
}

/// How the server is told who reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Auth {
    #[default]
    None,
    Basic {
        user: String,
        password: String,
    },
    Bearer(String),
}

impl Auth {
    /// Basic auth when a user is given (with its password, empty when none), else a bearer
    /// token when one is, else none.
    pub fn of(user: Option<&str>, password: Option<&str>, token: Option<&str>) -> Auth {
        match (user, token) {
            (Some(user), _) => Auth::Basic { user: user.into(), password: password.unwrap_or_default().into() },
            (None, Some(token)) => Auth::Bearer(token.into()),
            (None, None) => Auth::None,
        }
    }
}

/// Which answer to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// Frames of chunks, the server's memory bounded by a frame (`SAMPLES` taken if it
    /// answers so).
    #[default]
    Streamed,
    /// Every series' samples in one message, built in the server's memory up to its
    /// `--storage.remote.read-sample-limit`.
    Samples,
}

/// A Prometheus server's read APIs.
#[derive(Clone)]
pub struct Prometheus {
    http: reqwest::Client,
    /// The server's base URL (or the prefix it is served under), without a trailing `/`.
    base: String,
    auth: Auth,
    mode: ReadMode,
    /// Tries of a request that fails in a way worth trying again, the first included.
    tries: u32,
    backoff: Backoff,
}

/// The remote-read endpoint.
const READ: &str = "/api/v1/read";
/// The remote-read API's version header, as Prometheus' own client sends it.
const VERSION: &str = "0.1.0";
/// Largest frame of a streamed answer taken (Prometheus sends frames of about 1 MiB).
const MAX_FRAME: u64 = 64 << 20;

impl Prometheus {
    /// `url` is the server's base (`http://prometheus:9090`), or its remote-read endpoint
    /// (`.../api/v1/read`).
    pub fn new(url: &str, auth: Auth, mode: ReadMode, timeout: Duration) -> Result<Prometheus, PrometheusError> {
        let trimmed = url.trim_end_matches('/');
        if !(trimmed.starts_with("http://") || trimmed.starts_with("https://")) {
            return Err(fatal(format!("`{}` is not an http:// or https:// URL", crate::redact::redact(url))));
        }
        let base = trimmed.strip_suffix(READ).unwrap_or(trimmed).to_string();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| fatal(format!("cannot build an HTTP client: {e}")))?;
        let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        Ok(Prometheus { http, base, auth, mode, tries: 5, backoff })
    }

    /// At most `tries` tries of a request (the first included), `first` apart and doubling.
    pub fn with_retries(mut self, tries: u32, first: Duration) -> Prometheus {
        self.tries = tries.max(1);
        self.backoff = Backoff::new(first, Duration::from_secs(30));
        self
    }

    /// An endpoint of the server, its password and query hidden, for messages.
    pub fn endpoint(&self, path: &str) -> String {
        crate::redact::redact(&format!("{}{path}", self.base))
    }

    /// `call` tried as [`Prometheus`] says: again after a failure worth trying again.
    async fn tried<T, F>(&self, what: &str, mut call: impl FnMut() -> F) -> Result<T, PrometheusError>
    where
        F: std::future::Future<Output = Result<T, PrometheusError>>,
    {
        let mut attempt = 0;
        loop {
            match call().await {
                Err(e) if e.retryable && attempt + 1 < self.tries => {
                    let wait = self.backoff.nth_with_jitter(attempt);
                    tracing::warn!(error = %e, wait_ms = wait.as_millis() as u64, "{what} failed; trying again");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Sends a request to `path`, authenticated; its answer when it is a success.
    async fn send(&self, request: reqwest::RequestBuilder, path: &str) -> Result<reqwest::Response, PrometheusError> {
        let request = match &self.auth {
            Auth::None => request,
            Auth::Basic { user, password } => request.basic_auth(user, Some(password)),
            Auth::Bearer(token) => request.bearer_auth(token),
        };
        let at = self.endpoint(path);
        let response = request.send().await.map_err(|e| PrometheusError {
            message: format!("{at}: {}", crate::redact::error_chain(&e.without_url())),
            retryable: true,
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        let retryable = status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
        Err(PrometheusError {
            message: format!("{at} answered {status}: {}", text.trim().chars().take(500).collect::<String>()),
            retryable,
        })
    }

    /// The whole body of an answer.
    async fn body(&self, response: reqwest::Response, path: &str) -> Result<Vec<u8>, PrometheusError> {
        match response.bytes().await {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(e) => Err(PrometheusError {
                message: format!(
                    "{}: the answer broke off: {}",
                    self.endpoint(path),
                    crate::redact::error_chain(&e.without_url())
                ),
                retryable: true,
            }),
        }
    }

    /// The series that `matchers` select, with their raw samples from `start` to `end` (ms,
    /// both included), by remote-read.
    pub async fn read(
        &self,
        matchers: &[LabelMatcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<TimeSeries>, PrometheusError> {
        self.tried("a remote read", || self.read_once(matchers, start, end)).await
    }

    async fn read_once(
        &self,
        matchers: &[LabelMatcher],
        start: i64,
        end: i64,
    ) -> Result<Vec<TimeSeries>, PrometheusError> {
        let accepted = match self.mode {
            ReadMode::Streamed => vec![proto::STREAMED_XOR_CHUNKS, proto::SAMPLES],
            ReadMode::Samples => vec![proto::SAMPLES],
        };
        let query = Query { start_timestamp_ms: start, end_timestamp_ms: end, matchers: matchers.to_vec() };
        let request = ReadRequest { queries: vec![query], accepted_response_types: accepted };
        let body = snap::raw::Encoder::new()
            .compress_vec(&prost::Message::encode_to_vec(&request))
            .map_err(|e| fatal(format!("cannot compress the read request: {e}")))?;
        let request = self
            .http
            .post(format!("{}{READ}", self.base))
            .header("Content-Type", "application/x-protobuf")
            .header("Content-Encoding", "snappy")
            .header("X-Prometheus-Remote-Read-Version", VERSION)
            .body(body);
        let response = self.send(request, READ).await?;
        let streamed = response
            .headers()
            .get("Content-Type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/x-streamed-protobuf"));
        let bytes = self.body(response, READ).await?;
        let read = if streamed { frames(&bytes, start, end) } else { samples(&bytes) };
        read.map_err(|e| fatal(format!("{}: {e}", self.endpoint(READ))))
    }
}

/// Learns into `families` the types and units `prometheus` describes; a server that does not
/// answer is said in the log, and its series are kinded by name.
async fn learn_metadata(prometheus: &Prometheus, families: &vigil_formats::metric_kind::Families) {
    match prometheus.metadata().await {
        Ok(described) => {
            tracing::info!(families = described.len(), "metric types read from the server's metadata");
            for (name, family, unit) in described {
                families.learn(&name, family, &unit);
            }
        }
        Err(e) => tracing::warn!(error = %e, "the server's metadata cannot be read: series are kinded by name"),
    }
}

/// A `SAMPLES` answer: one snappy-compressed [`ReadResponse`].
fn samples(body: &[u8]) -> Result<Vec<TimeSeries>, String> {
    let raw = snap::raw::Decoder::new().decompress_vec(body).map_err(|e| format!("the answer is not snappy: {e}"))?;
    let response: ReadResponse =
        prost::Message::decode(raw.as_slice()).map_err(|e| format!("not a read response: {e}"))?;
    Ok(response.results.into_iter().flat_map(|r| r.timeseries).collect())
}

/// A streamed answer: frames of `[uvarint length][CRC-32C of the data, big-endian][data]`,
/// each a [`ChunkedReadResponse`]. A series longer than a frame goes on in the next; its
/// samples are kept from `start` to `end` (a chunk may hold some outside).
fn frames(mut body: &[u8], start: i64, end: i64) -> Result<Vec<TimeSeries>, String> {
    let castagnoli = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    let mut out: Vec<TimeSeries> = Vec::new();
    let mut frame = 0;
    while !body.is_empty() {
        frame += 1;
        let len = prost::encoding::decode_varint(&mut body).map_err(|e| format!("frame {frame}: its length: {e}"))?;
        if len > MAX_FRAME || body.len() < 4 + len as usize {
            return Err(format!("frame {frame}: {len} bytes, {} left in the answer", body.len().saturating_sub(4)));
        }
        let (crc, rest) = body.split_at(4);
        let (data, rest) = rest.split_at(len as usize);
        body = rest;
        if castagnoli.checksum(data) != u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) {
            return Err(format!("frame {frame}: its checksum does not match"));
        }
        let response: ChunkedReadResponse =
            prost::Message::decode(data).map_err(|e| format!("frame {frame}: not a chunked read response: {e}"))?;
        for series in response.chunked_series {
            let mut samples = Vec::new();
            for chunk in series.chunks.iter().filter(|c| c.r#type == proto::XOR) {
                let decoded = xor::decode(&chunk.data).map_err(|e| format!("frame {frame}: {e}"))?;
                samples.extend(decoded.into_iter().filter(|s| (start..=end).contains(&s.timestamp)));
            }
            match out.last_mut() {
                Some(last) if last.labels == series.labels => last.samples.extend(samples),
                _ => out.push(TimeSeries { labels: series.labels, samples }),
            }
        }
    }
    Ok(out)
}

/// The team's Prometheus and the series of it that Vigil reads: a warm start's history, and what
/// "why didn't it page?" replays.
#[derive(Clone)]
pub struct Source {
    pub prometheus: Prometheus,
    /// A series selector (PromQL).
    pub selector: String,
    /// History read back from the start (a warm start) or from an incident (a question).
    pub lookback: Duration,
    pub hosts: vigil_formats::remote_write::HostLabels,
}

/// A time as a backtest's --start and --end and a question's --from and --to take it, in ms
/// since the epoch: RFC 3339, Unix seconds, `now` or `now-7d` (the wall clock's `now`).
pub fn parse_time(s: &str, now: Millis) -> Result<Millis, String> {
    let s = s.trim();
    if s == "now" {
        return Ok(now);
    }
    if let Some(ago) = s.strip_prefix("now-") {
        let d = vigil_engine::settings::parse_duration(ago)?;
        return Ok(now - d.as_millis() as Millis);
    }
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() {
            return Ok((secs * 1000.0).round() as Millis);
        }
    }
    vigil_engine::event::parse_time(s)
        .ok_or_else(|| format!("`{s}` is not a time: write RFC 3339 (2026-11-22T00:00:00Z), Unix seconds or now-7d"))
}

#[cfg(test)]
mod tests {
    use super::parse_time;

    #[test]
    fn times_read_as_rfc_3339_unix_seconds_or_before_now() {
        let now = 1_800_000_000_000;
        assert_eq!(parse_time("2026-11-22T00:00:00Z", now), Ok(1_795_305_600_000));
        assert_eq!(parse_time("1795305600.5", now), Ok(1_795_305_600_500));
        assert_eq!(parse_time("now", now), Ok(now));
        assert_eq!(parse_time("now-7d", now), Ok(now - 7 * 86_400_000));
        assert!(parse_time("yesterday", now).expect_err("not a time").contains("RFC 3339"));
    }
}
