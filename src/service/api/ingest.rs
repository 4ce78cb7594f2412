//! `POST /api/v1/events`: JSON lines in.

use super::{read_body, ApiError, ApiResult, AppState, MAX_BODY};
use crate::service::sources::dead_letter;
use crate::service::sources::http::{Batch, Logged};
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::json;
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
    let mut rejected = Vec::new();
    let (mut rejected_total, mut dead) = (0usize, 0usize);
    let mut start = 0;
    let mut decoder = crate::event::LineDecoder::default();
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let range = start..start + line.len();
        start += line.len() + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match state.intake.decode(&mut decoder, line, None) {
            Ok(e) => events.push((range, e)),
            Err(reason) => {
                let reason = reason.to_string();
                rejected_total += 1;
                if rejected.len() < LISTED {
                    rejected.push(json!({ "line": i + 1, "reason": reason }));
                }
                if dead < DEAD_PER_REQUEST {
                    dead += 1;
                    let mut letter = dead_letter("http", reason, line);
                    letter.line = Some(i as i64 + 1);
                    let _ = state.dead.send(letter).await;
                }
            }
        }
    }
    if rejected_total > dead {
        let more = rejected_total - dead;
        let reason = format!("{more} more rejected lines of the same request, not kept one by one");
        let _ = state.dead.send(dead_letter("http", reason, b"")).await;
    }
    let (mut accepted, mut shed, mut late) = (events.len(), 0, 0u64);
    if !events.is_empty() {
        let (reply, answer) = oneshot::channel();
        state.ingest.send(Batch { body, events, reply }).await.map_err(|_| ApiError::stopping())?;
        match answer.await.map_err(|_| ApiError::stopping())? {
            // On disk: whatever happens now, the events are processed (after a restart if
            // need be); if the engine stops before taking them, their lateness is unknown.
            Logged::Taken(counted) => late = counted.await.unwrap_or(0),
            Logged::Shed => (shed, accepted) = (accepted, 0),
            Logged::Failed(reason) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason)),
        }
    }
    Ok(Json(json!({
        "accepted": accepted,
        "late": late,
        "shed": shed,
        "rejected": rejected,
        "rejected_total": rejected_total,
    })))
}
