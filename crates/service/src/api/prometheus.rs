//! Prometheus' rules and alerts endpoints, under `/prometheus` (`/prometheus/api/v1/rules`,
//! `/prometheus/api/v1/alerts`), in the shapes Prometheus answers them, so that Grafana's alert
//! list and other readers of Prometheus' API show Vigil's rules and alerts.
//!
//! Each rule file is a group. A rule's `query` is its SAQL declaration, its `duration` its
//! `for`, its state `firing` when any of its alerts fires (Vigil keeps pending alerts inside
//! the engine, not in the store, so a rule is never shown `pending`). Alerts' labels are as
//! sent to Alertmanager: the rule's, and the key's values.

use super::{ApiResult, AppState};
use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_engine::alert::Alert;
use vigil_engine::event::format_time;

/// Firing alerts read, at most.
const MOST_ALERTS: usize = 10_000;

pub(super) async fn alerts(State(state): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let alerts: Vec<Value> = state.store.firing_alerts(MOST_ALERTS).await?.iter().map(alert).collect();
    Ok(Json(json!({ "status": "success", "data": { "alerts": alerts } })))
}

pub(super) async fn rules(State(state): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let mut by_rule: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for a in state.store.firing_alerts(MOST_ALERTS).await? {
        by_rule.entry(a.rule.to_string()).or_default().push(alert(&a));
    }
    let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for info in state.rules.infos() {
        let alerts = by_rule.remove(&info.name).unwrap_or_default();
        let mut labels = Map::new();
        labels.insert("severity".into(), json!(info.severity));
        groups.entry(info.file.clone()).or_default().push(json!({
            "type": "alerting",
            "name": info.name,
            "query": info.text,
            "duration": info.for_ms as f64 / 1000.0,
            "keepFiringFor": info.keep_firing_for_ms as f64 / 1000.0,
            "labels": labels,
            "annotations": { "description": info.description.unwrap_or_default() },
            "state": if alerts.is_empty() { "inactive" } else { "firing" },
            "alerts": alerts,
            "health": "ok",
            "lastError": "",
            "evaluationTime": 0.0,
            "lastEvaluation": "0001-01-01T00:00:00Z",
        }));
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(file, rules)| {
            let name = std::path::Path::new(&file).file_stem().map(|s| s.to_string_lossy().to_string());
            json!({
                "name": name.unwrap_or_else(|| file.clone()),
                "file": file,
                "rules": rules,
                "interval": 0,
                "evaluationTime": 0.0,
                "lastEvaluation": "0001-01-01T00:00:00Z",
            })
        })
        .collect();
    Ok(Json(json!({ "status": "success", "data": { "groups": groups } })))
}

/// An alert as Prometheus lists one.
fn alert(a: &Alert) -> Value {
    let labels = crate::alertmanager::labels_of(a, &BTreeMap::new());
    let value = a.values.iter().find_map(|(_, v)| v.as_f64()).map_or_else(String::new, |v| v.to_string());
    json!({
        "labels": labels,
        "annotations": a.annotations,
        "state": "firing",
        "activeAt": format_time(a.starts_at),
        "value": value,
    })
}
