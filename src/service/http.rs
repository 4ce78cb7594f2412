//! The HTTP API.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /api/v1/alerts` | alerts, newest first; filters `rule`, `severity`, `status`, `key=name=value`, `from`, `to`; `limit`, `cursor` |
//! | `GET /api/v1/alerts/{id}` | one alert with its evidence and transitions |
//! | `GET /api/v1/alerts/stream` | server-sent events with the same filters; `Last-Event-ID` resumes from the store |
//! | `POST /api/v1/events` | JSON-lines ingest |
//! | `GET /api/v1/rules`, `GET/PUT/DELETE /api/v1/rules/{name}` | the rule set; PUT takes the rule's text |
//! | `POST /api/v1/rules/validate` | diagnostics for a rule text, as JSON |
//! | `GET /api/v1/dead-letters` | input that could not be read |
//! | `GET /api/v1/webhook`, `POST /api/v1/webhook/redeliver` | webhook deliveries by state; retry dead ones |
//! | `GET /metrics`, `GET /healthz`, `GET /readyz` | Prometheus metrics, liveness, readiness |
//!
//! With an API token configured, mutating endpoints need `Authorization: Bearer <token>`.

use super::pipeline::{now_ms, Health, Input, Offered};
use super::rules::{self, RuleInfo};
use super::store::{AlertFilter, DeadLetter, Store, Stored};
use super::telemetry::Telemetry;
use crate::alert::Status;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use tokio::sync::{broadcast, mpsc, oneshot, Mutex};

/// Largest request body: an ingest batch or a rule file.
pub const MAX_BODY: usize = 16 << 20;
/// Largest rule text the rule API accepts.
const MAX_RULE: usize = 1 << 20;

pub struct AppState {
    pub store: Store,
    pub engine: mpsc::Sender<Input>,
    pub dead: mpsc::Sender<DeadLetter>,
    pub published: broadcast::Sender<Arc<Stored>>,
    pub telemetry: Arc<Telemetry>,
    pub rules_dir: PathBuf,
    pub rules: RwLock<Vec<RuleInfo>>,
    /// Serialises rule changes so two PUTs cannot interleave their check and write.
    pub rule_lock: Mutex<()>,
    pub token: Option<String>,
    /// When set, reading endpoints need it (or `token`).
    pub read_token: Option<String>,
    pub overload: super::config::Overload,
    pub health: Arc<Health>,
    pub webhook_wake: Arc<tokio::sync::Notify>,
}

/// An API error: a status and a message, as JSON.
pub struct ApiError(StatusCode, serde_json::Value);

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError(status, json!({ "error": message.into() }))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<super::store::StoreError> for ApiError {
    fn from(e: super::store::StoreError) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

pub fn router(state: Arc<AppState>) -> Router {
    let mutating = Router::new()
        .route("/api/v1/events", post(ingest))
        .route("/api/v1/rules/{name}", axum::routing::put(put_rule).delete(delete_rule))
        .route("/api/v1/webhook/redeliver", post(redeliver))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let reading = Router::new()
        .route("/api/v1/alerts", get(list_alerts))
        .route("/api/v1/alerts/stream", get(stream_alerts))
        .route("/api/v1/alerts/{id}", get(get_alert))
        .route("/api/v1/rules", get(list_rules))
        .route("/api/v1/rules/{name}", get(get_rule))
        .route("/api/v1/rules/validate", post(validate_rule))
        .route("/api/v1/dead-letters", get(dead_letters))
        .route("/api/v1/webhook", get(webhook_state))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_read_token));
    Router::new()
        .merge(reading)
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .merge(mutating)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Whether the request carries `Authorization: Bearer <token>`, compared in constant time so
/// that response timing does not leak the token.
fn bearer_is(headers: &HeaderMap, token: &str) -> bool {
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| {
        use subtle::ConstantTimeEq;
        g.len() == token.len() && bool::from(g.as_bytes().ct_eq(token.as_bytes()))
    })
}

fn unauthorized(which: &str) -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, format!("this endpoint needs `Authorization: Bearer <{which}>`"))
        .into_response()
}

/// Mutating endpoints: the API token, when one is set.
async fn require_token(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    match &state.token {
        Some(token) if !bearer_is(&headers, token) => unauthorized("API token"),
        _ => next.run(request).await,
    }
}

/// Reading endpoints: the read token or the API token, when a read token is set.
async fn require_read_token(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    match &state.read_token {
        Some(read) if !bearer_is(&headers, read) && !state.token.as_ref().is_some_and(|t| bearer_is(&headers, t)) => {
            unauthorized("read token")
        }
        _ => next.run(request).await,
    }
}

#[derive(Debug, Deserialize, Default)]
pub struct FilterParams {
    rule: Option<String>,
    severity: Option<String>,
    status: Option<String>,
    /// `name=value`, comma-separated for several.
    key: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<i64>,
    cursor: Option<i64>,
    last_event_id: Option<i64>,
}

impl FilterParams {
    fn filter(&self) -> ApiResult<AlertFilter> {
        let time = |name: &str, v: &Option<String>| -> ApiResult<Option<i64>> {
            v.as_deref()
                .map(|t| {
                    crate::event::parse_time(t).or_else(|| t.parse().ok()).ok_or_else(|| {
                        ApiError::new(
                            StatusCode::BAD_REQUEST,
                            format!("`{name}`: `{t}` is not an RFC 3339 time or epoch milliseconds"),
                        )
                    })
                })
                .transpose()
        };
        let status = match self.status.as_deref() {
            None => None,
            Some("firing") => Some(Status::Firing),
            Some("resolved") => Some(Status::Resolved),
            Some(other) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("`status`: `{other}` is not firing or resolved"),
                ))
            }
        };
        let mut key = Vec::new();
        for part in self.key.iter().flat_map(|k| k.split(',')).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("`key`: `{part}` is not name=value, e.g. m.machine_id=m1"),
                )
            })?;
            key.push((k.to_string(), v.to_string()));
        }
        Ok(AlertFilter {
            rule: self.rule.clone(),
            severity: self.severity.clone(),
            status,
            key,
            from: time("from", &self.from)?,
            to: time("to", &self.to)?,
        })
    }
}

async fn list_alerts(
    State(state): State<Arc<AppState>>,
    Query(params): Query<FilterParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let filter = params.filter()?;
    let limit = params.limit.unwrap_or(100).clamp(1, 1000);
    let page = state.store.list_alerts(&filter, params.cursor, limit).await?;
    let next = (page.len() as i64 == limit).then(|| page.last().map(|s| s.seq)).flatten();
    let alerts: Vec<_> = page.into_iter().map(|s| s.alert).collect();
    Ok(Json(json!({ "alerts": alerts, "next_cursor": next })))
}

async fn get_alert(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let Some((alert, transitions)) = state.store.get_alert(&id).await? else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no alert `{id}`")));
    };
    let transitions: Vec<_> = transitions
        .iter()
        .map(|s| json!({ "seq": s.seq, "status": s.alert.status, "time": crate::event::format_time(s.alert.time) }))
        .collect();
    Ok(Json(json!({ "alert": alert, "transitions": transitions })))
}

/// Server-sent events: stored transitions after `Last-Event-ID` first, then live ones. The
/// subscription starts before the store is read, and anything a slow client missed live is read
/// back from the store, so the stream has no gaps and no repeats.
async fn stream_alerts(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(params): Query<FilterParams>,
) -> ApiResult<Response> {
    let filter = params.filter()?;
    let from_header =
        headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<i64>().ok());
    let live = state.published.subscribe();
    let last = match from_header.or(params.last_event_id) {
        Some(id) => id,
        None => state.store.last_event_seq().await?,
    };
    let backlog: VecDeque<Stored> = state.store.events_after(last, &filter, 10_000).await?.into();
    let stream = futures_util::stream::unfold(
        (backlog, live, last, filter, state.store.clone()),
        |(mut backlog, mut live, mut last, filter, store)| async move {
            loop {
                if let Some(s) = backlog.pop_front() {
                    if s.seq > last {
                        last = s.seq;
                        return Some((Ok::<_, Infallible>(sse(&s)), (backlog, live, last, filter, store)));
                    }
                    continue;
                }
                match live.recv().await {
                    Ok(s) if s.seq > last && filter.matches(&s.alert) => {
                        last = s.seq;
                        return Some((Ok(sse(&s)), (backlog, live, last, filter, store)));
                    }
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        backlog = store.events_after(last, &filter, 10_000).await.unwrap_or_default().into();
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

fn sse(s: &Stored) -> SseEvent {
    SseEvent::default().id(s.seq.to_string()).event("alert").data(serde_json::to_string(&s.alert).unwrap_or_default())
}

/// JSON lines in; each bad line is answered and kept as a dead letter, the rest go on.
/// Takes JSON lines. Each line that is not an event (bad JSON, a wrong type, no or a bad `ts`,
/// an unknown stream, invalid UTF-8, over the size limit) is a dead letter, reported back with
/// its line number; the rest go on. Under the `shed` overload policy, events that find the
/// engine's queue full are dropped and counted in the answer.
async fn ingest(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> ApiResult<Json<serde_json::Value>> {
    let (mut accepted, mut shed) = (0u64, 0u64);
    let mut rejected = Vec::new();
    let shed_counter = state.telemetry.shed.with_label_values(&["http"]);
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match super::pipeline::decode_payload(line, None) {
            Ok(e) => match super::pipeline::offer(&state.engine, Input::Event(e, None), state.overload, &shed_counter)
                .await
            {
                Offered::Taken => accepted += 1,
                Offered::Shed => shed += 1,
                Offered::Closed => {
                    return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine is stopping"))
                }
            },
            Err(reason) => {
                rejected.push(json!({ "line": i + 1, "reason": reason }));
                let _ = state
                    .dead
                    .send(DeadLetter {
                        source: "http".into(),
                        topic: None,
                        partition: None,
                        offset: None,
                        line: Some(i as i64 + 1),
                        reason,
                        payload: super::pipeline::dead_payload(line),
                        received_at_ms: now_ms(),
                    })
                    .await;
            }
        }
    }
    Ok(Json(json!({ "accepted": accepted, "shed": shed, "rejected": rejected })))
}

async fn list_rules(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let rules = state.rules.read().map(|r| r.clone()).unwrap_or_default();
    let summary: Vec<_> = rules
        .iter()
        .map(|r| json!({ "name": r.name, "file": r.file, "model": r.model, "description": r.description }))
        .collect();
    Json(json!({ "rules": summary }))
}

async fn get_rule(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let info = state.rules.read().ok().and_then(|r| r.iter().find(|i| i.name == name).cloned());
    let Some(info) = info else { return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no rule `{name}`"))) };
    let source = std::fs::read_to_string(&info.file).unwrap_or_default();
    Ok(Json(json!({ "rule": info, "source": source })))
}

#[derive(Deserialize)]
struct ValidateParams {
    /// The file name diagnostics mention.
    name: Option<String>,
}

async fn validate_rule(Query(p): Query<ValidateParams>, body: axum::body::Bytes) -> ApiResult<Json<serde_json::Value>> {
    if body.len() > MAX_RULE {
        return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("a rule file is at most {MAX_RULE} bytes")));
    }
    let name = p.name.unwrap_or_else(|| "rule.saql".into());
    let c = tokio::task::spawn_blocking(move || crate::compile(&name, &body))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let rules: Vec<&str> = c.plans.iter().map(|p| p.name.as_str()).collect();
    Ok(Json(json!({ "valid": c.is_ok(), "rules": rules, "diagnostics": c.source().to_json(&c.diagnostics) })))
}

/// Writes `<rules>/<name>.saql` if the whole folder still checks with it, then reloads.
async fn put_rule(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    if !rules::valid_name(&name) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`{name}` is not a rule name (letters, digits and _)"),
        ));
    }
    if body.len() > MAX_RULE {
        return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("a rule file is at most {MAX_RULE} bytes")));
    }
    let _guard = state.rule_lock.lock().await;
    let path = state.rules_dir.join(format!("{name}.saql"));
    let dir = state.rules_dir.clone();
    let text = body.to_vec();
    let (checked, single) = {
        let path = path.clone();
        let text = text.clone();
        tokio::task::spawn_blocking(move || {
            let own = crate::compile(&path.display().to_string(), &text);
            let single = own.rule_names.len() == 1 && own.rule_names[0].0 == name;
            (rules::compile_folder(&dir, Some((&path, Some(&text)))), single)
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    };
    let compiled = checked.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let loaded = rules::into_loaded(compiled).map_err(|e| {
        ApiError(StatusCode::UNPROCESSABLE_ENTITY, json!({ "error": "the rule does not check", "diagnostics": e.json }))
    })?;
    if !single {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the text must define exactly one rule, named `{}`",
                path.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default()
            ),
        ));
    }
    rules::write_atomically(&path, &text)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot write the rule: {e}")))?;
    let kept = apply(&state, loaded).await?;
    Ok(Json(json!({ "saved": path.display().to_string(), "kept_state": kept })))
}

async fn delete_rule(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    if !rules::valid_name(&name) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("`{name}` is not a rule name")));
    }
    let _guard = state.rule_lock.lock().await;
    let path = state.rules_dir.join(format!("{name}.saql"));
    if !path.exists() {
        let elsewhere = state.rules.read().ok().and_then(|r| r.iter().find(|i| i.name == name).map(|i| i.file.clone()));
        return Err(match elsewhere {
            Some(file) => ApiError::new(
                StatusCode::CONFLICT,
                format!("rule `{name}` is defined in {file} with other rules; edit that file"),
            ),
            None => ApiError::new(StatusCode::NOT_FOUND, format!("no rule `{name}`")),
        });
    }
    let dir = state.rules_dir.clone();
    let p = path.clone();
    let compiled = tokio::task::spawn_blocking(move || rules::compile_folder(&dir, Some((&p, None))))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let loaded = rules::into_loaded(compiled).map_err(|e| {
        ApiError(
            StatusCode::CONFLICT,
            json!({ "error": "the other rules do not check without it", "diagnostics": e.json }),
        )
    })?;
    std::fs::remove_file(&path)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot remove the rule: {e}")))?;
    let kept = apply(&state, loaded).await?;
    Ok(Json(json!({ "deleted": name, "kept_state": kept })))
}

/// Sends a new rule set to the engine and records it for the API.
pub async fn apply(state: &AppState, loaded: rules::Loaded) -> ApiResult<Vec<String>> {
    let (reply, wait) = oneshot::channel();
    state
        .engine
        .send(Input::Reload(loaded.plans, reply))
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine is stopping"))?;
    let kept = wait.await.map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine is stopping"))?;
    if let Ok(mut r) = state.rules.write() {
        *r = loaded.infos;
    }
    state.telemetry.rule_reloads.with_label_values(&["ok"]).inc();
    Ok(kept)
}

#[derive(Deserialize)]
struct LimitParams {
    limit: Option<i64>,
}

async fn dead_letters(
    State(state): State<Arc<AppState>>,
    Query(p): Query<LimitParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let rows = state.store.dead_letters(p.limit.unwrap_or(100).clamp(1, 1000)).await?;
    Ok(Json(json!({ "dead_letters": rows })))
}

async fn webhook_state(State(state): State<Arc<AppState>>) -> ApiResult<Json<serde_json::Value>> {
    let counts: serde_json::Map<String, serde_json::Value> =
        state.store.outbox_counts().await?.into_iter().map(|(k, v)| (k, json!(v))).collect();
    Ok(Json(json!({ "deliveries": counts })))
}

async fn redeliver(State(state): State<Arc<AppState>>) -> ApiResult<Json<serde_json::Value>> {
    let n = state.store.outbox_redeliver(now_ms()).await?;
    state.webhook_wake.notify_one();
    Ok(Json(json!({ "requeued": n })))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([("content-type", "text/plain; version=0.0.4")], state.telemetry.render())
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let store = state.store.ping().await.is_ok();
    let writing = state.health.store_ok.load(Ordering::Relaxed) || store;
    let spooled = state.health.spooled.load(Ordering::Relaxed);
    if store && writing {
        Json(json!({ "ready": true, "store": true, "spooled_alerts": spooled })).into_response()
    } else {
        let reason = format!("the store is unreachable; {spooled} alerts kept on disk until it is back");
        let body = json!({ "ready": false, "store": false, "spooled_alerts": spooled, "reason": reason });
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    }
}
