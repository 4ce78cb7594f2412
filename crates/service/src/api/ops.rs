//! Operations: dead letters, webhook deliveries, metrics, liveness and readiness.

use super::{ApiQuery, ApiResult, AppState};
use crate::sources::now_ms;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Deserialize)]
pub(super) struct LimitParams {
    limit: Option<i64>,
}

pub(super) async fn dead_letters(
    State(state): State<Arc<AppState>>,
    ApiQuery(p): ApiQuery<LimitParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let rows = state.store.dead_letters(p.limit.unwrap_or(100).clamp(1, 1000)).await?;
    Ok(Json(json!({ "dead_letters": rows })))
}

pub(super) async fn webhook_state(State(state): State<Arc<AppState>>) -> ApiResult<Json<serde_json::Value>> {
    let counts: serde_json::Map<String, serde_json::Value> =
        state.store.outbox_counts().await?.into_iter().map(|(k, v)| (k, json!(v))).collect();
    Ok(Json(json!({ "deliveries": counts })))
}

/// The alerts every configured Alertmanager holds silenced, with the silences' ids.
pub(super) async fn silenced(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({ "silenced": state.silences.current() }))
}

pub(super) async fn redeliver(State(state): State<Arc<AppState>>) -> ApiResult<Json<serde_json::Value>> {
    let n = state.store.outbox_redeliver(now_ms()).await?;
    state.webhook_wake.notify_one();
    Ok(Json(json!({ "requeued": n })))
}

pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([("content-type", "text/plain; version=0.0.4")], state.telemetry.render())
}

/// Ready when the store answers and the engine makes progress; otherwise 503 with the reason.
pub(super) async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let store = state.store.ping().await.is_ok();
    let writing = state.health.store_ok.load(Ordering::Relaxed) || store;
    let spooled = state.health.spooled.load(Ordering::Relaxed);
    let stalled = state.engine_health.stalled(state.limits.stall_timeout);
    let engine = json!({
        "stalled_seconds": stalled.map_or(0, |d| d.as_secs()),
        "watermark": state.engine_health.watermark().map(vigil_engine::event::format_time),
        "state_bytes": state.engine_health.state_bytes.load(Ordering::Relaxed),
    });
    let mut reasons = Vec::new();
    if !(store && writing) {
        reasons.push(format!("the store is unreachable; {spooled} alerts kept on disk until it is back"));
    }
    if let Some(d) = stalled {
        reasons.push(format!(
            "the engine has made no progress for {}: it is busy with one input (a rule with very much state, or \
             a jump of event time) and events wait",
            vigil_lang::ast::human_duration(d.as_millis() as u64)
        ));
    }
    if let Some(held) = state.engine_health.held() {
        reasons.push(held);
    }
    let ready = reasons.is_empty();
    let mut body = json!({ "ready": ready, "store": store && writing, "spooled_alerts": spooled, "engine": engine });
    if ready {
        return Json(body).into_response();
    }
    body["reason"] = json!(reasons.join("; "));
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}
