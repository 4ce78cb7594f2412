//! `POST /api/v1/write`: Prometheus remote-write 1.0 and 2.0 ([`vigil_formats::remote_write`]), as Prometheus,
//! Grafana Agent/Alloy, the OpenTelemetry Collector and vmagent send it.
//!
//! Status codes as the specification says a sender reads them: 204 once every sample is on
//! disk in the ingest log; 400 for what will never be accepted (a body that is not snappy
//! protobuf, a series without a name, over a label limit or outside the time bounds: the
//! request's valid series are kept, and a sender does not retry a 400); 413 past the size limit
//! once decompressed; 415 for another content type or encoding; 503 with `Retry-After` when a
//! retry can succeed (the ingest log cannot be written, the engine sheds load, the service is
//! stopping). Prometheus drops a whole request on a 400 and counts every sample of it failed,
//! which pages its team past 1%, so nothing a well-behaved Prometheus sends is refused: a
//! series without a host (a recording rule's) is placed under a fallback host
//! ([`vigil_formats::remote_write::HostLabels`]), a value that is not finite is "no value", and
//! exemplars are taken and not kept. Remote-write 2.0 (`proto=io.prometheus.write.v2.Request`,
//! [`vigil_formats::remote_write::v2`]) on the same path, by its content type, answers with the
//! `X-Prometheus-Remote-Write-{Samples,Histograms,Exemplars}-Written` headers.

use super::ingest::{as_json_lines, log_events, within_request_limit, Logging, Rejects};
use super::{read_body, ApiError, AppState, MAX_BODY, MAX_DECOMPRESSED};
use crate::telemetry::reject_reason;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use vigil_engine::event::DecodeError;
use vigil_formats::metric_kind::Family;
use vigil_formats::remote_write::{decode_body, series_samples, v2, BodyError, TimeSeries, WriteRequest};

pub(super) async fn write(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    receive(&state, &headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// The two versions of the protocol, told apart by the content type's `proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// The version a request's content type and encoding name, or why they are not taken (415).
fn check_headers(headers: &HeaderMap) -> Result<Version, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase();
    let content_type = header("content-type");
    let mut parts = content_type.split(';').map(str::trim);
    let media = parts.next().unwrap_or_default();
    let proto = parts.find_map(|p| p.strip_prefix("proto=")).unwrap_or("prometheus.writerequest");
    let unsupported = |reason: String| Err(ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, reason));
    if media != "application/x-protobuf" {
        return unsupported(format!("Content-Type `{content_type}` is not taken: send application/x-protobuf"));
    }
    let version = match proto {
        "prometheus.writerequest" => Version::V1,
        "io.prometheus.write.v2.request" => Version::V2,
        other => {
            return unsupported(format!(
            "`proto={other}` is not taken: send prometheus.WriteRequest (1.0) or io.prometheus.write.v2.Request (2.0)"
        ))
        }
    };
    let encoding = header("content-encoding");
    if !encoding.is_empty() && encoding != "snappy" {
        return unsupported(format!("Content-Encoding `{encoding}` is not taken: remote-write bodies are snappy"));
    }
    Ok(version)
}

/// One series of a request, read: its events and what 2.0 counts as written of it.
type Read = Result<v2::Written, DecodeError>;

/// Decodes a body of `version` into its series, each read or refused, with the labels that
/// name a refused one.
fn read_series(state: &AppState, version: Version, body: &[u8]) -> Result<Vec<(Read, String)>, ApiError> {
    let decode_error = |e| match e {
        BodyError::TooLarge(len) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is {len} bytes once decompressed; at most {MAX_DECOMPRESSED} are taken"),
        ),
        BodyError::Bad(reason) => ApiError::new(StatusCode::BAD_REQUEST, reason),
    };
    let hosts = &state.hosts.remote_write;
    let shown = |labels: &[vigil_formats::remote_write::Label]| {
        labels.iter().map(|l| format!("{}={:?}", l.name, l.value)).collect::<Vec<_>>().join(",")
    };
    Ok(match version {
        Version::V1 => {
            let request: WriteRequest = decode_body(body, MAX_DECOMPRESSED, "WriteRequest").map_err(decode_error)?;
            for m in &request.metadata {
                state.metric_families.learn(&m.metric_family_name, Family::from_remote_write(m.r#type), &m.unit);
            }
            let read = |series: &TimeSeries| {
                series_samples(series, hosts, Some(&state.metric_families)).map(|s| v2::Written {
                    sample_count: s.events.len(),
                    samples: s,
                    ..Default::default()
                })
            };
            request.timeseries.iter().map(|series| (read(series), shown(&series.labels))).collect()
        }
        Version::V2 => {
            let request: v2::Request =
                decode_body(body, MAX_DECOMPRESSED, "io.prometheus.write.v2.Request").map_err(decode_error)?;
            let symbols = &request.symbols;
            let shown = |series: &v2::Series| {
                let names = series.labels_refs.iter().map(|&r| symbols.get(r as usize).map_or("?", String::as_str));
                let names: Vec<&str> = names.collect();
                names
                    .chunks(2)
                    .map(|p| format!("{}={:?}", p[0], p.get(1).unwrap_or(&"?")))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let read = |series: &v2::Series| v2::series(series, symbols, hosts, &state.metric_families);
            request.timeseries.iter().map(|series| (read(series), shown(series))).collect()
        }
    })
}

async fn receive(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let version = check_headers(headers)?;
    let body = read_body(state, body, MAX_BODY).await?;
    let series = read_series(state, version, &body)?;
    let mut rejects = Rejects::counting("remote_write", "series");
    let (mut events, mut stale, mut not_finite) = (Vec::new(), 0usize, 0usize);
    // Samples, histograms and exemplars written, as 2.0's headers count them.
    let mut written = [0usize; 3];
    let mut count_written = |w: &vigil_formats::remote_write::v2::Written| {
        for (n, more) in written.iter_mut().zip([w.sample_count, w.histogram_count, w.exemplar_count]) {
            *n += more;
        }
    };
    // The newest sample of each series taken, remembered once they are on disk.
    let mut newest = Vec::new();
    let count = series.len();
    for (i, (read, labels)) in series.into_iter().enumerate() {
        let taken = read.and_then(|w| state.intake.check_all(&w.samples.events).map(|_| w));
        // Of an HA pair, only the elected replica's series are taken ([`crate::ha`]).
        let taken = taken.map(|mut w| {
            let admitted = state.ha.admit(&mut w.samples.events, std::time::Instant::now());
            (w, admitted)
        });
        match taken {
            Ok((w, false)) => {
                // Another replica of its HA pair is the one taken: written, as far as the
                // sender is concerned.
                state.telemetry.samples.ha_dropped.inc_by(w.samples.events.len() as u64);
                count_written(&w);
            }
            Ok((mut w, true)) => {
                let (resent, taken) = state.resent.drop_seen(&mut w.samples.events);
                state.telemetry.samples.resent.inc_by(resent as u64);
                newest.extend(taken);
                stale += w.samples.stale;
                not_finite += w.samples.not_finite;
                count_written(&w);
                events.extend(w.samples.events);
            }
            Err(reason) => {
                let counted = reject_reason(&reason, &state.hosts.remote_write.label);
                state.telemetry.samples.rejected.with_label_values(&["remote_write", counted]).inc();
                rejects.add(state, i as u64 + 1, reason.to_string(), labels.as_bytes()).await;
            }
        }
    }
    let (rejected_total, first_reject) = (rejects.total, rejects.first());
    let rejected = rejects.finish(state).await;
    within_request_limit(state, events.len())?;
    let (body, events) = as_json_lines(events);
    let Logging { accepted, shed, .. } = log_events(state, body, events).await?;
    state.telemetry.samples.taken.with_label_values(&["remote_write"]).inc_by(accepted as u64);
    if shed > 0 {
        let message = format!("the engine's queue is full: {shed} samples not taken; send them again");
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message));
    }
    state.resent.remember(&newest);
    // 2.0 senders read what was written from headers. A value that is not finite (a summary's
    // quantile without observations) is taken as "no value", so it counts as written; an
    // exemplar is taken and not kept (no rule reads one), so it counts as written too: the
    // sender has nothing to send again. Neither is a refusal: a 400 would make the sender drop
    // the whole request and count all its samples failed.
    let written = [
        "x-prometheus-remote-write-samples-written",
        "x-prometheus-remote-write-histograms-written",
        "x-prometheus-remote-write-exemplars-written",
    ]
    .into_iter()
    .zip(written);
    let with_written = |mut response: Response| {
        if version == Version::V2 {
            for (name, n) in written {
                response.headers_mut().insert(name, n.into());
            }
        }
        response
    };
    match first_reject {
        None => Ok(with_written(StatusCode::NO_CONTENT.into_response())),
        Some(first) => {
            let message =
                format!("{rejected_total} of {count} series refused ({accepted} samples taken); first: {first}");
            let body = json!({
                "error": message,
                "accepted": accepted,
                "stale_markers": stale,
                "not_finite": not_finite,
                "rejected": rejected,
                "rejected_total": rejected_total,
            });
            Ok(with_written(ApiError(StatusCode::BAD_REQUEST, body).into_response()))
        }
    }
}
