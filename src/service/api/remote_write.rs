//! `POST /api/v1/write`: Prometheus remote-write 1.0 ([`crate::remote_write`]), as Prometheus,
//! Grafana Agent/Alloy, the OpenTelemetry Collector and vmagent send it.
//!
//! Status codes as the specification says a sender reads them: 204 once every sample is on
//! disk in the ingest log; 400 for what will never be accepted (a body that is not snappy
//! protobuf, series without a name or a host: the request's valid series are kept, and a sender
//! does not retry a 400); 413 past the size limit once decompressed; 415 for another content
//! type or encoding (remote-write 2.0 included: not read yet); 503 when a retry can succeed
//! (the ingest log cannot be written, the engine sheds load, the service is stopping).

use super::ingest::{as_json_lines, log_events, within_request_limit, Logging, Rejects};
use super::{read_body, ApiError, AppState, MAX_BODY, MAX_DECOMPRESSED};
use crate::remote_write::{decode_body, series_samples, BodyError};
use crate::service::telemetry::reject_reason;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;

pub(super) async fn write(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    receive(&state, &headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// The content type and encoding of a 1.0 request, or why they are not taken (415).
fn check_headers(headers: &HeaderMap) -> Result<(), ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase();
    let content_type = header("content-type");
    let mut parts = content_type.split(';').map(str::trim);
    let media = parts.next().unwrap_or_default();
    let proto = parts.find_map(|p| p.strip_prefix("proto=")).unwrap_or("prometheus.writerequest");
    let unsupported = |reason: String| Err(ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, reason));
    if media != "application/x-protobuf" {
        return unsupported(format!("Content-Type `{content_type}` is not taken: send application/x-protobuf"));
    }
    if proto != "prometheus.writerequest" {
        return unsupported(format!(
            "`proto={proto}` is not read yet: send remote-write 1.0 (prometheus.WriteRequest)"
        ));
    }
    let encoding = header("content-encoding");
    if !encoding.is_empty() && encoding != "snappy" {
        return unsupported(format!("Content-Encoding `{encoding}` is not taken: remote-write bodies are snappy"));
    }
    Ok(())
}

async fn receive(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    check_headers(headers)?;
    let body = read_body(state, body, MAX_BODY).await?;
    let request = decode_body(&body, MAX_DECOMPRESSED).map_err(|e| match e {
        BodyError::TooLarge(len) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is {len} bytes once decompressed; at most {MAX_DECOMPRESSED} are taken"),
        ),
        BodyError::Bad(reason) => ApiError::new(StatusCode::BAD_REQUEST, reason),
    })?;
    for m in &request.metadata {
        state.metric_families.learn(&m.metric_family_name, crate::metric_kind::Family::from_remote_write(m.r#type));
    }
    let mut rejects = Rejects::counting("remote_write", "series");
    let (mut events, mut stale, mut not_finite) = (Vec::new(), 0usize, 0usize);
    for (i, series) in request.timeseries.iter().enumerate() {
        let taken = series_samples(series, &state.remote_write_host_label, Some(&state.metric_families))
            .and_then(|s| state.intake.check_all(&s.events).map(|_| s));
        match taken {
            Ok(s) => {
                stale += s.stale;
                not_finite += s.not_finite;
                events.extend(s.events);
            }
            Err(reason) => {
                let counted = reject_reason(&reason, &state.remote_write_host_label);
                state.telemetry.samples.rejected.with_label_values(&["remote_write", counted]).inc();
                let reason = reason.to_string();
                let labels: Vec<String> = series.labels.iter().map(|l| format!("{}={:?}", l.name, l.value)).collect();
                rejects.add(state, i as u64 + 1, reason, labels.join(",").as_bytes()).await;
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
    match first_reject {
        None => Ok(StatusCode::NO_CONTENT.into_response()),
        Some(first) => {
            let message = format!(
                "{rejected_total} of {} series refused ({accepted} samples taken); first: {first}",
                request.timeseries.len()
            );
            let body = json!({
                "error": message,
                "accepted": accepted,
                "stale_markers": stale,
                "not_finite": not_finite,
                "rejected": rejected,
                "rejected_total": rejected_total,
            });
            Err(ApiError(StatusCode::BAD_REQUEST, body))
        }
    }
}
