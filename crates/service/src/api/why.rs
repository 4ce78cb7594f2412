//! "Why didn't it page?" through the API, for the console's rule page: a rule's judgements
//! through a past incident ([`vigil_engine::why`]), replayed from the team's Prometheus (the
//! one `--warm-from-prometheus` names) over the incident and the lookback before it.
//!
//! `GET /api/v1/rules/{name}/why?from=T&to=T[&host=H][&key=TEXT][&lookback=D]`. Times are
//! written as `vigil why` takes them (RFC 3339, Unix seconds, `now-2h`). `host` reads that
//! host's series only (its host label, with or without a port); `key` keeps the groups whose key
//! contains the text. A question replays the rule several times (once, then once per change it
//! checks), so one is answered at a time.

use super::{ApiError, ApiQuery, ApiResult, AppState};
use crate::history::backtest::{self, Backtest};
use crate::history::proto::{LabelMatcher, RE};
use crate::history::{parse_time, selector, Source};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use std::sync::Arc;
use vigil_engine::event::Millis;
use vigil_engine::why::{self, Question};

/// Time read from Prometheus at once.
const PAGE_MS: i64 = 3_600_000;

/// History read past the incident's end.
const CLOSING_MS: Millis = 3_600_000;

#[derive(Deserialize)]
pub(super) struct WhyParams {
    from: String,
    to: String,
    host: Option<String>,
    key: Option<String>,
    lookback: Option<String>,
}

fn bad(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

pub(super) async fn why(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    ApiQuery(p): ApiQuery<WhyParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let Some(history) = state.history.clone() else {
        let message = "no Prometheus to read history from: start vigil serve with --warm-from-prometheus URL";
        return Err(ApiError::new(StatusCode::CONFLICT, message));
    };
    let Ok(permit) = state.limits.questions.clone().try_acquire_owned() else {
        return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "another question is being answered: ask again"));
    };
    let now = vigil_engine::event::now_ms();
    let from = parse_time(&p.from, now).map_err(|e| bad(format!("from: {e}")))?;
    let to = parse_time(&p.to, now).map_err(|e| bad(format!("to: {e}")))?;
    if to < from {
        return Err(bad("`to` is before `from`".into()));
    }
    let lookback = match &p.lookback {
        Some(d) => vigil_engine::settings::parse_duration(d).map_err(|e| bad(format!("lookback: {e}")))?,
        None => history.lookback,
    };
    let mut matchers =
        selector::parse(&history.selector).map_err(|e| bad(format!("the warm start's selector: {e}")))?;
    if let Some(host) = p.host.as_deref().filter(|h| !h.is_empty()) {
        let value = format!("{}(:[0-9]+)?", regex::escape(host));
        matchers.push(LabelMatcher { r#type: RE, name: history.hosts.label.clone(), value });
    }
    let dir = state.rules.dir().to_path_buf();
    let question = Question { from, to, key: p.key.filter(|k| !k.is_empty()) };
    let start = from.saturating_sub(lookback.as_millis() as Millis);
    let (tx, rx) = tokio::sync::oneshot::channel();
    // On a thread of its own: the replays read Prometheus with a runtime of their own.
    std::thread::spawn(move || {
        let _permit = permit;
        let _ = tx.send(answer(&dir, &name, &question, &history, matchers, start));
    });
    let answer = rx.await.map_err(ApiError::internal)??;
    Ok(Json(answer))
}

/// Replays `name` from the rules in `dir` over the history from `start` to the incident's end.
fn answer(
    dir: &std::path::Path,
    name: &str,
    question: &Question,
    history: &Source,
    matchers: Vec<LabelMatcher>,
    start: Millis,
) -> ApiResult<serde_json::Value> {
    let set = crate::rules::load(dir).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let plans = set.plans();
    let Some(plan) = plans.iter().find(|p| p.name == name) else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no rule `{name}`")));
    };
    let options = vigil_engine::replay::ReplayOptions {
        speed: vigil_engine::replay::Speed::Max,
        strict: false,
        engine: vigil_engine::settings::EngineSettings::batch(),
    };
    let mut failures = Vec::new();
    let mut open = |_, _| {
        let b = Backtest {
            read: history.prometheus.clone(),
            selectors: vec![(history.selector.clone(), matchers.clone())],
            start,
            // Past the incident's end, so that the windows ending at it close.
            end: question.to.saturating_add(CLOSING_MS),
            page_ms: PAGE_MS,
            hosts: history.hosts.clone(),
        };
        let (input, failure) = backtest::input(b).map_err(|e| e.message)?;
        failures.push(failure);
        Ok(vec![input])
    };
    let answer = why::ask(plan, question, &options, &mut open);
    for failure in failures {
        if let Some(e) = failure.lock().ok().and_then(|mut e| e.take()) {
            return Err(ApiError::new(StatusCode::BAD_GATEWAY, format!("reading Prometheus: {}", e.message)));
        }
    }
    let answer = answer.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    serde_json::to_value(&answer).map_err(ApiError::internal)
}
