//! The rule set through the API: list, show, validate, put, delete.

use super::{read_body, ApiError, ApiQuery, ApiResult, AppState};
use crate::service::engine_loop::Input;
use crate::service::rules;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Largest rule text the rule API accepts.
const MAX_RULE: usize = 1 << 20;

pub(super) async fn list_rules(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let rules = state.rules.read().map(|r| r.clone()).unwrap_or_default();
    let summary: Vec<_> = rules
        .iter()
        .map(|r| json!({ "name": r.name, "file": r.file, "model": r.model, "description": r.description }))
        .collect();
    Json(json!({ "rules": summary }))
}

pub(super) async fn get_rule(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let info = state.rules.read().ok().and_then(|r| r.iter().find(|i| i.name == name).cloned());
    let Some(info) = info else { return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no rule `{name}`"))) };
    let source = std::fs::read_to_string(&info.file).unwrap_or_default();
    Ok(Json(json!({ "rule": info, "source": source })))
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
    let c = tokio::task::spawn_blocking(move || crate::compile(&name, &body)).await.map_err(ApiError::internal)?;
    let rules: Vec<&str> = c.plans.iter().map(|p| p.name.as_str()).collect();
    Ok(Json(json!({ "valid": c.is_ok(), "rules": rules, "diagnostics": c.source().to_json(&c.diagnostics) })))
}

/// Writes `<rules>/<name>.saql` if the whole folder still checks with it, then reloads.
pub(super) async fn put_rule(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    if !rules::valid_name(&name) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`{name}` is not a rule name (letters, digits and _)"),
        ));
    }
    let body = read_body(&state, body, MAX_RULE).await?;
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
        .map_err(ApiError::internal)?
    };
    let compiled = checked.map_err(ApiError::internal)?;
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

pub(super) async fn delete_rule(
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
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
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
    state.engine.send(Input::Reload(loaded.plans, reply)).await.map_err(|_| ApiError::stopping())?;
    let kept = wait.await.map_err(|_| ApiError::stopping())?;
    if let Ok(mut r) = state.rules.write() {
        *r = loaded.infos;
    }
    state.telemetry.rule_reloads.with_label_values(&["ok"]).inc();
    Ok(kept)
}
