//! `POST /v1/metrics`: OTLP/HTTP metrics ([`vigil_formats::otlp`]), as OpenTelemetry SDKs' OTLP/HTTP
//! exporters and the OpenTelemetry Collector's `otlphttp` exporter send them.
//!
//! Answers as the OTLP specification says a sender reads them, in the request's encoding
//! (`application/x-protobuf` or `application/json`): 200 with an `ExportMetricsServiceResponse`
//! once every sample taken is on disk in the ingest log, its `partial_success` giving the count
//! and first reason of the data points refused (a sender does not retry those); 400 with a
//! `google.rpc.Status` for a body that is not a request; 413 past the size limit once
//! decompressed; 415 for another content type or encoding; 503 when a retry can succeed (the
//! ingest log cannot be written, the engine sheds load, the service is stopping).

use super::ingest::{as_json_lines, log_events, within_request_limit, Logging, Rejects};
use super::{read_body, ApiError, AppState, MAX_BODY};
use crate::telemetry::{otlp_reject_reason, reject_reason};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use vigil_formats::otlp::{
    decode, samples, Encoding, ExportMetricsPartialSuccess, ExportMetricsServiceResponse, Status,
};

pub(super) async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let encoding = match content_type(&headers) {
        Ok(e) => e,
        Err(e) => return e.into_response(),
    };
    receive(&state, encoding, &headers, body).await.unwrap_or_else(|e| answer_error(e, encoding))
}

/// The request's encoding by its content type, or why it is not taken (415).
fn content_type(headers: &HeaderMap) -> Result<Encoding, ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    match media.as_str() {
        "application/x-protobuf" | "application/protobuf" => Ok(Encoding::Protobuf),
        "application/json" => Ok(Encoding::Json),
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Type `{content_type}` is not taken: send application/x-protobuf or application/json"),
        )),
    }
}

/// gRPC's status codes, which OTLP/HTTP's `Status` carries.
const INVALID_ARGUMENT: i32 = 3;
const UNAVAILABLE: i32 = 14;

/// An error as OTLP/HTTP answers one: a `google.rpc.Status` in the request's encoding (the
/// JSON one with the API's `error` beside it).
fn answer_error(e: ApiError, encoding: Encoding) -> Response {
    let message = e.1.get("error").and_then(|m| m.as_str()).unwrap_or("refused").to_string();
    let code = if e.0.is_server_error() { UNAVAILABLE } else { INVALID_ARGUMENT };
    match encoding {
        Encoding::Json => ApiError(e.0, json!({ "code": code, "message": message, "error": message })).into_response(),
        Encoding::Protobuf => {
            let body = prost::Message::encode_to_vec(&Status { code, message });
            // The OTLP exporters wait what Retry-After says before they send again.
            super::with_retry_after((e.0, [(header::CONTENT_TYPE, "application/x-protobuf")], body).into_response())
        }
    }
}

async fn receive(state: &AppState, encoding: Encoding, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = read_body(state, body, MAX_BODY).await?;
    let body = super::gunzipped(headers, body)?;
    let request = decode(&body, encoding).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let host = &state.hosts.otlp_attribute;
    let decoded = samples(&request, host, vigil_engine::event::now_ms());
    let mut rejects = Rejects::counting("otlp", "refusal");
    let mut refused_points = 0usize;
    let count = |reason: &'static str| state.telemetry.samples.rejected.with_label_values(&["otlp", reason]).inc();
    for (i, (points, at, reason)) in decoded.refused.iter().enumerate() {
        refused_points += points;
        count(otlp_reject_reason(reason, host));
        rejects.add(state, i as u64 + 1, reason.to_string(), at.as_bytes()).await;
    }
    let mut events = Vec::with_capacity(decoded.events.len());
    for event in decoded.events {
        match state.intake.check(&event) {
            Ok(()) => events.push(event),
            Err(reason) => {
                refused_points += 1;
                count(reject_reason(&reason, host));
                let at = format!("{} of {}", event.get("name"), event.get("host"));
                rejects.add(state, rejects.total as u64 + 1, reason.to_string(), at.as_bytes()).await;
            }
        }
    }
    let first_reject = rejects.first();
    rejects.finish(state).await;
    within_request_limit(state, events.len())?;
    let (body, events) = as_json_lines(events);
    let Logging { accepted, shed, .. } = log_events(state, body, events).await?;
    state.telemetry.samples.taken.with_label_values(&["otlp"]).inc_by(accepted as u64);
    if shed > 0 {
        let message = format!("the engine's queue is full: {shed} samples not taken; send them again");
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message));
    }
    let partial = first_reject.map(|first| ExportMetricsPartialSuccess {
        rejected_data_points: refused_points as i64,
        error_message: format!("{refused_points} data points refused ({accepted} samples taken); first: {first}"),
    });
    Ok(match encoding {
        Encoding::Json => {
            let body = match partial {
                None => json!({}),
                Some(p) => json!({
                    "partialSuccess": {
                        "rejectedDataPoints": p.rejected_data_points.to_string(),
                        "errorMessage": p.error_message,
                    }
                }),
            };
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Encoding::Protobuf => {
            let body = prost::Message::encode_to_vec(&ExportMetricsServiceResponse { partial_success: partial });
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-protobuf")], body).into_response()
        }
    })
}
