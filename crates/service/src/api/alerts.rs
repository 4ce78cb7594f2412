//! Alerts: the listing, one alert with its transitions, and the live stream.

use super::{ApiError, ApiQuery, ApiResult, AppState};
use crate::store::{AlertFilter, Stored};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit};
use vigil_engine::alert::Status;

/// Transitions read from the store at a time while a stream catches up.
const PAGE: i64 = 1_000;
/// Events a stream holds for its client before the client counts as slow.
const STREAM_BUFFER: usize = 256;
/// A client that leaves its stream's buffer full this long is dropped; it resumes with
/// `Last-Event-ID` when it reads again.
const SLOW_READER: Duration = Duration::from_secs(10);

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
                    vigil_engine::event::parse_time(t).or_else(|| t.parse().ok()).ok_or_else(|| {
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

pub(super) async fn list_alerts(
    State(state): State<Arc<AppState>>,
    ApiQuery(params): ApiQuery<FilterParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let filter = params.filter()?;
    let limit = params.limit.unwrap_or(100).clamp(1, 1000);
    let page = state.store.list_alerts(&filter, params.cursor, limit).await?;
    let next = (page.len() as i64 == limit).then(|| page.last().map(|s| s.seq)).flatten();
    let alerts: Vec<_> = page.into_iter().map(|s| s.alert).collect();
    Ok(Json(json!({ "alerts": alerts, "next_cursor": next })))
}

pub(super) async fn get_alert(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let Some((alert, transitions)) = state.store.get_alert(&id).await? else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no alert `{id}`")));
    };
    let transitions: Vec<_> = transitions
        .iter()
        .map(|s| json!({ "seq": s.seq, "status": s.alert.status, "time": vigil_engine::event::format_time(s.alert.time) }))
        .collect();
    Ok(Json(json!({ "alert": alert, "transitions": transitions })))
}

/// Server-sent events: stored transitions after `Last-Event-ID` first, page by page until
/// caught up, then live ones. The subscription starts before the store is read, and anything
/// the stream missed live is read back from the store, so it has no gaps and no repeats.
///
/// A task of its own feeds each client through a small buffer: a client that does not read
/// holds no store connection and no one else's events, and is dropped once its buffer has been
/// full for [`SLOW_READER`].
pub(super) async fn stream_alerts(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiQuery(params): ApiQuery<FilterParams>,
) -> ApiResult<Response> {
    let filter = params.filter()?;
    let permit = state.limits.stream_clients.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too many alert stream clients; try again later")
    })?;
    let from_header =
        headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<i64>().ok());
    let live = state.published.subscribe();
    let last = match from_header.or(params.last_event_id) {
        Some(id) => id,
        None => state.store.last_event_seq().await?,
    };
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(Feed { state: state.clone(), filter, last, tx, _permit: permit }.run(live));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Sse::new(futures_util::StreamExt::map(stream, Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// One stream client's feed.
struct Feed {
    state: Arc<AppState>,
    filter: AlertFilter,
    /// The last transition sent.
    last: i64,
    tx: mpsc::Sender<SseEvent>,
    _permit: OwnedSemaphorePermit,
}

impl Feed {
    async fn run(mut self, mut live: broadcast::Receiver<Arc<Stored>>) {
        if !self.catch_up().await {
            return;
        }
        loop {
            match live.recv().await {
                Ok(s) if s.seq > self.last && self.filter.matches(&s.alert) => {
                    if !self.send(&s).await {
                        return;
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if !self.catch_up().await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Sends what the store holds after `last`, a page at a time, until a page comes back
    /// short; false when the client is gone, too slow, or the store cannot be read (the
    /// client then resumes with `Last-Event-ID`).
    async fn catch_up(&mut self) -> bool {
        loop {
            let page = {
                let Ok(_turn) = self.state.limits.catch_up.acquire().await else { return false };
                self.state.store.events_after(self.last, &self.filter, PAGE).await
            };
            let page = match page {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "an alert stream cannot read the store; closing it");
                    return false;
                }
            };
            for s in &page {
                if !self.send(s).await {
                    return false;
                }
            }
            if (page.len() as i64) < PAGE {
                return true;
            }
        }
    }

    async fn send(&mut self, s: &Stored) -> bool {
        let event = SseEvent::default()
            .id(s.seq.to_string())
            .event("alert")
            .data(serde_json::to_string(&s.alert).unwrap_or_default());
        match tokio::time::timeout(SLOW_READER, self.tx.send(event)).await {
            Ok(Ok(())) => {
                self.last = s.seq;
                true
            }
            Ok(Err(_)) => false,
            Err(_) => {
                self.state.telemetry.emit(crate::telemetry::StreamClientDropped { last: self.last });
                false
            }
        }
    }
}
