//! `POST /api/v1/events`: JSON lines in.

use super::{read_body, ApiError, ApiResult, AppState, MAX_BODY};
use crate::sources::dead_letter;
use crate::sources::http::{Batch, Logged};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::json;
use std::ops::Range;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Rejected lines listed in one answer; the rest are counted.
const LISTED: usize = 1_000;
/// Rejected lines of one request kept as dead letters; the rest are summed up in one more.
const DEAD_PER_REQUEST: usize = 100;

/// Takes JSON lines. Each line that is not an event (bad JSON, a wrong type, no or a bad `ts`,
/// a key given twice, an unknown stream, invalid UTF-8, over the size limit) or whose time is
/// out of bounds is answered with its line number and kept as a dead letter; the rest are
/// written to the ingest log, and the answer comes once they are on disk and the engine has
/// taken them, counting those it found late. Under the `shed` overload policy a request that
/// finds the engine's queue full is dropped whole, and counted in the answer.
pub(super) async fn ingest(State(state): State<Arc<AppState>>, body: Body) -> ApiResult<Json<serde_json::Value>> {
    let body = read_body(&state, body, MAX_BODY).await?;
    let mut events = Vec::new();
    let mut rejects = Rejects::new("http");
    let mut start = 0;
    let mut decoder = state.intake.catalog.decoder();
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let range = start..start + line.len();
        start += line.len() + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match state.intake.decode(&mut decoder, line, None) {
            Ok(e) => events.push((range, e)),
            Err(reason) => rejects.add(&state, i as u64 + 1, reason.to_string(), line).await,
        }
    }
    let rejected_total = rejects.total;
    let rejected = rejects.finish(&state).await;
    let Logging { accepted, late, shed } = log_events(&state, body, events).await?;
    Ok(Json(json!({
        "accepted": accepted,
        "late": late,
        "shed": shed,
        "rejected": rejected,
        "rejected_total": rejected_total,
    })))
}

/// The rejected lines of one request: the first [`LISTED`] for the answer, the first
/// [`DEAD_PER_REQUEST`] kept as dead letters.
pub(super) struct Rejects {
    source: &'static str,
    /// What a reject's number counts: `line`, or `series` of a remote-write request.
    unit: &'static str,
    listed: Vec<serde_json::Value>,
    pub total: usize,
    dead: usize,
}

impl Rejects {
    pub fn new(source: &'static str) -> Self {
        Rejects { source, unit: "line", listed: Vec::new(), total: 0, dead: 0 }
    }

    /// Rejects numbered by `unit` rather than by line.
    pub fn counting(source: &'static str, unit: &'static str) -> Self {
        Rejects { unit, ..Rejects::new(source) }
    }

    /// Line (or other unit) `line`, 1-based, of the request was refused for `reason`.
    pub async fn add(&mut self, state: &AppState, line: u64, reason: String, payload: &[u8]) {
        self.total += 1;
        if self.dead < DEAD_PER_REQUEST {
            self.dead += 1;
            let mut letter = dead_letter(self.source, reason.clone(), payload);
            letter.line = Some(line as i64);
            let _ = state.dead.send(letter).await;
        }
        if self.listed.len() < LISTED {
            self.listed.push(json!({ self.unit: line, "reason": reason }));
        }
    }

    /// The first reject, as `<unit> <number>: <reason>`.
    pub fn first(&self) -> Option<String> {
        let first = self.listed.first()?;
        Some(format!("{} {}: {}", self.unit, first[self.unit], first["reason"].as_str().unwrap_or_default()))
    }

    /// The listed rejects, once those not kept one by one are summed up in one more dead letter.
    pub async fn finish(self, state: &AppState) -> Vec<serde_json::Value> {
        if self.total > self.dead {
            let more = self.total - self.dead;
            let reason = format!("{more} more rejected lines of the same request, not kept one by one");
            let _ = state.dead.send(dead_letter(self.source, reason, b"")).await;
        }
        self.listed
    }
}

/// What became of events handed to the ingest log.
pub(super) struct Logging {
    pub accepted: usize,
    /// Of those accepted, how many the engine found late.
    pub late: u64,
    /// Dropped under the `shed` overload policy.
    pub shed: usize,
}

/// Writes `events` (each with the range of its JSON line in `body`) to the ingest log and waits
/// until they are on disk and the engine has taken them; 503 when the log cannot be written.
pub(super) async fn log_events(
    state: &AppState,
    body: Bytes,
    events: Vec<(Range<usize>, vigil_engine::event::Event)>,
) -> ApiResult<Logging> {
    let mut logging = Logging { accepted: events.len(), late: 0, shed: 0 };
    if events.is_empty() {
        return Ok(logging);
    }
    let (reply, answer) = oneshot::channel();
    state.ingest.send(Batch { body, events, reply }).await.map_err(|_| ApiError::stopping())?;
    match answer.await.map_err(|_| ApiError::stopping())? {
        // On disk: whatever happens now, the events are processed (after a restart if need
        // be); if the engine stops before taking them, their lateness is unknown.
        Logged::Taken(counted) => logging.late = counted.await.unwrap_or(0),
        Logged::Shed => (logging.shed, logging.accepted) = (logging.accepted, 0),
        Logged::Failed(reason) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason)),
    }
    Ok(logging)
}

/// A request of more samples than `--max-samples-per-request` is refused whole: 413, which a
/// sender does not retry as it is (it can send smaller batches).
pub(super) fn within_request_limit(state: &AppState, samples: usize) -> ApiResult<()> {
    let limit = state.limits.max_samples_per_request;
    if samples <= limit {
        return Ok(());
    }
    let message = format!("the request carries {samples} samples; at most {limit} are taken in one request");
    Err(ApiError::new(axum::http::StatusCode::PAYLOAD_TOO_LARGE, message))
}

/// Events decoded from another format, as the JSON lines the ingest log keeps (read back after a
/// crash), each with the range of its line.
pub(super) fn as_json_lines(
    events: Vec<vigil_engine::event::Event>,
) -> (Bytes, Vec<(Range<usize>, vigil_engine::event::Event)>) {
    let mut body = Vec::with_capacity(events.len() * 96);
    let mut ranged = Vec::with_capacity(events.len());
    for e in events {
        let start = body.len();
        // Writing an event's JSON to memory cannot fail.
        let _ = serde_json::to_writer(&mut body, &vigil_engine::event::EventJson(&e));
        ranged.push((start..body.len(), e));
        body.push(b'\n');
    }
    (Bytes::from(body), ranged)
}
