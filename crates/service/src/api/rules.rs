//! The rule set through the API: list, show, validate, put, delete.

use super::{read_body, ApiError, ApiQuery, ApiResult, AppState};
use crate::rules::RuleChangeError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use vigil_lang::ruleset::RuleSetError;

/// Largest rule text the rule API accepts.
const MAX_RULE: usize = 1 << 20;

pub(super) async fn list_rules(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let rules = state.rules.infos();
    let summary: Vec<_> = rules
        .iter()
        .map(|r| json!({ "name": r.name, "file": r.file, "model": r.model, "description": r.description }))
        .collect();
    Json(json!({ "rules": summary }))
}

/// The streams the rules may read: Vigil's own and those the rule files declare.
pub(super) async fn list_streams(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({ "streams": state.intake.catalog.get().describe() }))
}

pub(super) async fn get_rule(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let info = state.rules.infos().into_iter().find(|i| i.name == name);
    let Some(info) = info else { return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no rule `{name}`"))) };
    let file = std::fs::read_to_string(&info.file).unwrap_or_default();
    // The rule's plan, as `vigil explain` prints it, as the rule set compiled it.
    let explain = info.plan.clone();
    Ok(Json(json!({ "rule": info, "source": file, "explain": explain })))
}

#[derive(Deserialize)]
pub(super) struct ValidateParams {
    /// The file name diagnostics mention.
    name: Option<String>,
}

pub(super) async fn validate_rule(
    State(state): State<Arc<AppState>>,
    ApiQuery(p): ApiQuery<ValidateParams>,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    let body = read_body(&state, body, MAX_RULE).await?;
    let name = p.name.unwrap_or_else(|| "rule.saql".into());
    // Checked as one more file of the running set: it may read the streams the set declares.
    let catalog = state.intake.catalog.get();
    let c = tokio::task::spawn_blocking(move || vigil_lang::compile_over(&name, &body, &catalog))
        .await
        .map_err(ApiError::internal)?;
    let rules: Vec<&str> = c.plans.iter().map(|p| p.name.as_str()).collect();
    Ok(Json(json!({ "valid": c.is_ok(), "rules": rules, "diagnostics": c.source().to_json(&c.diagnostics) })))
}

/// Sets a rule, in the file it lives in (a new one in `<rules>/<name>.saql`), if the whole
/// folder still checks with it; the engine keeps the state of every rule whose state is the
/// same computation.
pub(super) async fn put_rule(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    let body = read_body(&state, body, MAX_RULE).await?;
    let (path, kept) = state.rules.put(&name, body.to_vec()).await?;
    Ok(Json(json!({ "saved": path.display().to_string(), "kept_state": kept })))
}

/// Removes a rule from its file (the file goes when it held nothing else), if the other rules
/// still check without it.
pub(super) async fn delete_rule(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let kept = state.rules.delete(&name).await?;
    Ok(Json(json!({ "deleted": name, "kept_state": kept })))
}

impl From<RuleChangeError> for ApiError {
    fn from(e: RuleChangeError) -> Self {
        match e {
            RuleChangeError::Stopping => ApiError::stopping(),
            RuleChangeError::Rules(RuleSetError::Invalid { json, .. }) => ApiError(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({ "error": "the rules do not check with this change", "diagnostics": json }),
            ),
            RuleChangeError::Rules(e @ (RuleSetError::NotOneRule(_) | RuleSetError::StreamsInUse(_))) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
            }
            RuleChangeError::Rules(e @ RuleSetError::BadName(_)) => {
                ApiError::new(StatusCode::BAD_REQUEST, e.to_string())
            }
            RuleChangeError::Rules(e @ RuleSetError::NoRule(_)) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
            RuleChangeError::Rules(e) => ApiError::internal(e),
        }
    }
}
