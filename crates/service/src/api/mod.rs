//! The HTTP API: every handler of `vigil serve`, and nothing else.
//!
//! | method and path | what | module |
//! |---|---|---|
//! | `GET /api/v1/alerts` | alerts, newest first; filters `rule`, `severity`, `status`, `key=name=value`, `from`, `to`; `limit`, `cursor` | [`alerts`] |
//! | `GET /api/v1/alerts/{id}` | one alert with its evidence and transitions | [`alerts`] |
//! | `GET /api/v1/alerts/stream` | server-sent events with the same filters; `Last-Event-ID` resumes from the store | [`alerts`] |
//! | `POST /api/v1/events` | JSON-lines ingest, answered once the events are on disk | [`ingest`] |
//! | `POST /api/v2/write`, `POST /write` | InfluxDB line protocol (2.x and 1.x APIs), as Telegraf sends it | [`influx`] |
//! | `POST /api/v1/write` | Prometheus remote-write 1.0 | [`remote_write`] |
//! | `POST /v1/metrics` | OTLP/HTTP metrics, protobuf or JSON | [`otlp`] |
//! | `GET /api/v1/rules`, `GET/PUT/DELETE /api/v1/rules/{name}` | the rule set; PUT takes the rule's text | [`rules`] |
//! | `POST /api/v1/rules/validate` | diagnostics for a rule text, as JSON | [`rules`] |
//! | `GET /api/v1/rules/{name}/why` | why the rule did not alert through a past incident, from Prometheus' history | [`why`] |
//! | `GET /api/v1/dead-letters` | input that could not be read | [`ops`] |
//! | `GET /api/v1/webhook`, `POST /api/v1/webhook/redeliver` | webhook deliveries by state; retry dead ones | [`ops`] |
//! | `GET /metrics`, `GET /healthz`, `GET /readyz` | Prometheus metrics, liveness, readiness | [`ops`] |
//!
//! With an API token configured, mutating endpoints need `Authorization: Bearer <token>`; with
//! a read token, reading endpoints need it (or the API token). Every error answer is JSON,
//! `{"error": "..."}`, whatever the layer that refuses the request (see also
//! [`super::server`] for those refused before they reach a handler).

pub mod alerts;
mod console;
mod influx;
pub mod ingest;
pub mod ops;
mod otlp;
mod prometheus;
mod remote_write;
pub mod rules;
pub mod why;

use super::engine_loop::EngineHealth;
use super::rules::LiveRules;
use super::sources::http::Batch;
use super::sources::Intake;
use super::store::{DeadLetter, Store, Stored};
use super::telemetry::Telemetry;
use super::writer::Health;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, Notify, Semaphore};

/// Largest request body: an ingest batch or a rule file.
pub const MAX_BODY: usize = 16 << 20;
/// Largest body of the collectors' receivers once decompressed (gzip, snappy).
pub const MAX_DECOMPRESSED: usize = 64 << 20;

pub struct AppState {
    pub store: Store,
    /// The ingest log's thread, through which ingested events reach the engine.
    pub ingest: mpsc::Sender<Batch>,
    pub intake: Intake,
    pub dead: mpsc::Sender<DeadLetter>,
    pub published: broadcast::Sender<Arc<Stored>>,
    pub telemetry: Arc<Telemetry>,
    pub rules: Arc<LiveRules>,
    pub token: Option<String>,
    /// When set, reading endpoints need it (or `token`).
    pub read_token: Option<String>,
    /// True once the service is stopping: bodies are then refused with 503 and `Retry-After`.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// The replica taken of each HA pair of Prometheus.
    pub ha: Arc<crate::ha::HaTracker>,
    /// The newest sample taken of each remote-write series, so that a resent batch is taken once.
    pub resent: crate::resent::Resent,
    /// The metric families remote-write senders described, for their samples' `kind`.
    pub metric_families: Arc<vigil_formats::metric_kind::Families>,
    /// How the receivers' samples are placed under hosts (line protocol's tag, OTLP's
    /// attribute, remote-write's labels), as every other source places them.
    pub hosts: vigil_formats::HostMapping,
    pub health: Arc<Health>,
    pub engine_health: Arc<EngineHealth>,
    pub webhook_wake: Arc<Notify>,
    /// What the Alertmanagers hold silenced ([`crate::alertmanager`]).
    pub silences: Arc<crate::alertmanager::Silences>,
    /// The team's Prometheus, that "why didn't it page?" reads ([`why`]).
    pub history: Option<crate::history::Source>,
    pub limits: Limits,
}

/// What the API holds itself to.
pub struct Limits {
    /// How long a request body may take to arrive.
    pub body_timeout: Duration,
    /// One permit per alert stream client.
    pub stream_clients: Arc<Semaphore>,
    /// Store reads for streams catching up, at once: the rest wait their turn.
    pub catch_up: Arc<Semaphore>,
    /// An engine without progress this long is reported stalled.
    pub stall_timeout: Duration,
    /// Samples a request to a collector receiver may carry.
    pub max_samples_per_request: usize,
    /// Questions answered at once ([`why`]).
    pub questions: Arc<Semaphore>,
}

/// An API error: a status and a message, as JSON.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub serde_json::Value);

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError(status, json!({ "error": message.into() }))
    }

    pub(super) fn internal(e: impl std::fmt::Display) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }

    pub(super) fn stopping() -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the service is stopping; send again")
    }
}

/// Seconds a sender is asked to wait before it sends again after a 503.
const RETRY_AFTER_SECONDS: u32 = 1;

impl IntoResponse for ApiError {
    /// A 503 says when to try again: every 503 of Vigil's is one a retry can cure (a queue
    /// full, the ingest log not writable, the service stopping), and senders that read
    /// `Retry-After` (Prometheus with `retry_on_http_429`, the OpenTelemetry Collector) wait
    /// that long rather than their own backoff.
    fn into_response(self) -> Response {
        with_retry_after((self.0, Json(self.1)).into_response())
    }
}

/// `response`, with `Retry-After` when it is a 503 (see [`ApiError`]'s answers).
pub(super) fn with_retry_after(mut response: Response) -> Response {
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
    }
    response
}

impl From<super::store::StoreError> for ApiError {
    fn from(e: super::store::StoreError) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Query parameters, with a JSON error that names the parameter when they do not parse
/// (axum's own answer is plain text).
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri).map(|q| ApiQuery(q.0)).map_err(|e| {
            let reason = e.body_text();
            let reason = reason.trim_start_matches("Failed to deserialize query string: ");
            ApiError::new(StatusCode::BAD_REQUEST, format!("bad query: {reason}"))
        })
    }
}

/// Reads a request body of at most `limit` bytes within the body timeout: 413 when it is
/// larger, 408 when it does not arrive in time.
pub async fn read_body(state: &AppState, body: Body, limit: usize) -> ApiResult<Bytes> {
    if *state.stop.borrow() {
        return Err(ApiError::stopping());
    }
    let timeout = state.limits.body_timeout;
    let limited = http_body_util::Limited::new(body, limit);
    match tokio::time::timeout(timeout, http_body_util::BodyExt::collect(limited)).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {}",
                vigil_lang::ast::human_duration(timeout.as_millis() as u64)
            ),
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over {limit} bytes")))
        }
        Ok(Err(e)) => Err(ApiError::new(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}"))),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// The body as sent, or decompressed when `Content-Encoding` says gzip; at most
/// [`MAX_DECOMPRESSED`] bytes once decompressed (413), another encoding refused (415).
pub(super) fn gunzipped(headers: &HeaderMap, body: Bytes) -> Result<Bytes, ApiError> {
    use std::io::Read;
    let encoding = headers.get("content-encoding").and_then(|v| v.to_str().ok()).unwrap_or("identity");
    match encoding.trim().to_ascii_lowercase().as_str() {
        "" | "identity" => Ok(body),
        "gzip" => {
            let mut out = Vec::new();
            let mut reader = flate2::read::GzDecoder::new(&body[..]).take(MAX_DECOMPRESSED as u64 + 1);
            reader.read_to_end(&mut out).map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, format!("the gzip body does not decompress: {e}"))
            })?;
            if out.len() > MAX_DECOMPRESSED {
                let message = format!("the body is over {MAX_DECOMPRESSED} bytes once decompressed");
                return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message));
            }
            Ok(Bytes::from(out))
        }
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Encoding `{other}` is not taken: send gzip or identity"),
        )),
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let mutating = Router::new()
        .route("/api/v1/events", post(ingest::ingest))
        .route("/api/v1/rules/{name}", axum::routing::put(rules::put_rule).delete(rules::delete_rule))
        .route("/api/v1/webhook/redeliver", post(ops::redeliver))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    // Receivers of what collectors send: the API token as they are configured to give it.
    let receiving = Router::new()
        .route("/api/v2/write", post(influx::write_lines))
        .route("/write", post(influx::write_lines))
        .route("/api/v1/write", post(remote_write::write))
        .route("/v1/metrics", post(otlp::metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_sender_token));
    let reading = Router::new()
        .route("/api/v1/alerts", get(alerts::list_alerts))
        .route("/api/v1/alerts/stream", get(alerts::stream_alerts))
        .route("/api/v1/alerts/{id}", get(alerts::get_alert))
        .route("/api/v1/rules", get(rules::list_rules))
        .route("/api/v1/streams", get(rules::list_streams))
        .route("/api/v1/rules/{name}", get(rules::get_rule))
        .route("/api/v1/rules/validate", post(rules::validate_rule))
        .route("/api/v1/rules/{name}/why", get(why::why))
        .route("/api/v1/dead-letters", get(ops::dead_letters))
        .route("/api/v1/webhook", get(ops::webhook_state))
        .route("/api/v1/alertmanager/silenced", get(ops::silenced))
        .route("/prometheus/api/v1/rules", get(prometheus::rules))
        .route("/prometheus/api/v1/alerts", get(prometheus::alerts))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_read_token));
    Router::new()
        .merge(reading)
        .route("/", get(console::index))
        .route("/console/{name}", get(console::asset))
        .route("/metrics", get(ops::metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ops::readyz))
        .merge(mutating)
        .merge(receiving)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint; the API is under /api/v1") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "this endpoint does not take that method")
        })
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

/// Whether a collector's request carries the API token in one of the ways collectors are
/// configured to send one: `Authorization: Bearer` (Prometheus, OpenTelemetry), `Authorization:
/// Token` (InfluxDB 2 clients, Telegraf), basic auth with the token as the password, or the
/// `p` query parameter (InfluxDB 1.x clients).
fn sender_gives(headers: &HeaderMap, uri: &axum::http::Uri, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let same = |given: &str| given.len() == token.len() && bool::from(given.as_bytes().ct_eq(token.as_bytes()));
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let (scheme, credentials) = authorization.split_once(' ').unwrap_or_default();
    let from_header = match scheme.to_ascii_lowercase().as_str() {
        "bearer" | "token" => same(credentials.trim()),
        "basic" => {
            use base64::Engine;
            let decoded = base64::engine::general_purpose::STANDARD.decode(credentials.trim()).unwrap_or_default();
            let decoded = String::from_utf8(decoded).unwrap_or_default();
            decoded.split_once(':').is_some_and(|(_, password)| same(password))
        }
        _ => false,
    };
    let from_query = || {
        let query = axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(uri);
        query.is_ok_and(|q| q.get("p").is_some_and(|p| same(p)))
    };
    from_header || from_query()
}

/// Receivers of collectors' pushes: the API token, when one is set, given as
/// [`sender_gives`] takes it.
async fn require_sender_token(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match &state.token {
        Some(token) if !sender_gives(request.headers(), request.uri(), token) => {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "this endpoint needs the API token: `Authorization: Bearer <token>` or `Token <token>`, or basic auth with the token as password",
            )
            .into_response()
        }
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

#[cfg(test)]
mod tests;
