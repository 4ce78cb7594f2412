//! `POST /api/v2/write` (the InfluxDB 2 API) and `POST /write` (InfluxDB 1.x): line protocol
//! in, as Telegraf's `outputs.influxdb_v2` and `outputs.influxdb` and the Influx client
//! libraries send it. Each numeric field of a line is one `metric` sample ([`vigil_formats::influx`]).
//!
//! Answers as InfluxDB does, so that senders retry what can succeed and drop what cannot:
//! 204 once every sample is on disk in the ingest log; 400 with `{"code": "invalid",
//! "message"}` when lines were refused (the valid lines of the request are kept, as InfluxDB 1.x
//! keeps a partial write: a sender does not retry a 400, and resending would not help them);
//! 413 for a body over the limit, compressed or not; 503 when the log cannot be written or the
//! engine sheds load (a retry can succeed).

use super::ingest::{as_json_lines, log_events, within_request_limit, Logging, Rejects};
use super::{read_body, ApiError, AppState, MAX_BODY};
use crate::telemetry::reject_reason;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use vigil_formats::influx::{Mapping, Precision};

/// `POST /api/v2/write?bucket=..&org=..&precision=ns|us|ms|s` and
/// `POST /write?db=..&precision=n|u|ms|s|m|h`: the same but for the precisions they name.
pub(super) async fn write_lines(
    State(state): State<Arc<AppState>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    write(&state, params.get("precision").map(String::as_str), &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// An answer in InfluxDB's shape (`code`, `message`), with the API's `error` beside it.
fn influx_error(status: StatusCode, code: &str, message: String, more: serde_json::Value) -> ApiError {
    let mut body = json!({ "code": code, "message": message, "error": message });
    if let (Some(body), serde_json::Value::Object(more)) = (body.as_object_mut(), more) {
        body.extend(more);
    }
    ApiError(status, body)
}

/// An API error in InfluxDB's shape.
fn from_api(e: ApiError) -> ApiError {
    let message = e.1.get("error").and_then(|m| m.as_str()).unwrap_or("refused").to_string();
    let code = match e.0 {
        StatusCode::PAYLOAD_TOO_LARGE => "request too large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported",
        s if s.is_server_error() => "unavailable",
        _ => "invalid",
    };
    influx_error(e.0, code, message, json!({}))
}

async fn write(
    state: &AppState,
    precision: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let precision = match precision {
        None | Some("") => Precision::Nanoseconds,
        Some(p) => Precision::parse(p).ok_or_else(|| {
            let message = format!("precision `{p}` is not one of ns, us, ms, s (or n, u, m, h)");
            influx_error(StatusCode::BAD_REQUEST, "invalid", message, json!({}))
        })?,
    };
    let body = read_body(state, body, MAX_BODY).await.map_err(from_api)?;
    let body = super::gunzipped(headers, body).map_err(from_api)?;
    let text = std::str::from_utf8(&body).map_err(|e| {
        let message = format!("the body is not UTF-8 (at byte {})", e.valid_up_to());
        influx_error(StatusCode::BAD_REQUEST, "invalid", message, json!({}))
    })?;
    let mapping = Mapping { precision, ..state.hosts.influx.clone() };
    let mut rejects = Rejects::new("influx");
    let (mut events, mut skipped, mut lines) = (Vec::new(), 0usize, 0usize);
    for (line_no, line, taken) in state.intake.influx(&mapping, text) {
        lines += 1;
        match taken {
            Ok(samples) => {
                skipped += samples.skipped;
                events.extend(samples.events);
            }
            Err(reason) => {
                let counted = reject_reason(&reason, &mapping.host_tag);
                state.telemetry.samples.rejected.with_label_values(&["influx", counted]).inc();
                rejects.add(state, line_no, reason.to_string(), line.as_bytes()).await;
            }
        }
    }
    let (rejected_total, first_reject) = (rejects.total, rejects.first());
    let rejected = rejects.finish(state).await;
    within_request_limit(state, events.len()).map_err(from_api)?;
    let (body, events) = as_json_lines(events);
    let Logging { accepted, late, shed } = log_events(state, body, events).await.map_err(from_api)?;
    state.telemetry.samples.taken.with_label_values(&["influx"]).inc_by(accepted as u64);
    if shed > 0 {
        let message = format!("the engine's queue is full: {shed} samples not taken; send them again");
        return Err(influx_error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message, json!({ "shed": shed })));
    }
    let counts = json!({
        "accepted": accepted,
        "late": late,
        "skipped_string_fields": skipped,
        "rejected": rejected,
        "rejected_total": rejected_total,
    });
    match first_reject {
        None => Ok(StatusCode::NO_CONTENT.into_response()),
        Some(first) => {
            let message = format!(
                "partial write: {rejected_total} of {lines} lines refused ({accepted} samples taken); first: {first}"
            );
            Err(influx_error(StatusCode::BAD_REQUEST, "invalid", message, counts))
        }
    }
}
