//! What the window operator's closes share: the stand-in event a group's alert reads, the
//! order of a close's alerts, and the evidence behind an alert.

use super::super::eval::{ClusterResult, History};
use super::super::keys::Key;
use crate::alert::{Alert, Evidence, MAX_EVIDENCE};
use crate::event::{format_time, Event, Millis, Value};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_lang::plan::{GroupKey, StatePlan};

/// Field positions that the key values of a group fill in a stand-in event, if every group key
/// is an entity or a plain field of the pattern's event.
pub(super) fn rebuild_positions(state: &StatePlan, src: &vigil_lang::plan::SourcePlan) -> Option<Vec<usize>> {
    use vigil_lang::plan::TExprKind;
    let mut out = Vec::new();
    for k in &state.group_by {
        match k {
            GroupKey::Entity { var, .. } => out.extend(src.key_positions(var)),
            GroupKey::Value(e) => match &e.kind {
                TExprKind::EventField { index, .. } | TExprKind::EntityField { index, .. }
                    if *index != crate::event::TS_INDEX =>
                {
                    out.push(*index)
                }
                _ => return None,
            },
        }
    }
    Some(out)
}

/// The event a group's alert reads its key values from: its latest event if it keeps one, or
/// else `scratch`, a blank event of the pattern's stream, with the key's values written where
/// they came from.
pub(super) fn stand_in<'e>(
    last: &'e Option<Arc<Event>>,
    rebuild: &Option<Vec<usize>>,
    key: &Key,
    scratch: &'e mut Event,
) -> &'e Event {
    if let Some(e) = last {
        return e;
    }
    if let Some(positions) = rebuild {
        for (pos, v) in positions.iter().zip(&key.0) {
            if let Some(slot) = scratch.fields.get_mut(*pos) {
                *slot = v.clone();
            }
        }
    }
    scratch
}

/// Puts the alerts of one close, from `first` on, in the order of their groups' keys (`runs`:
/// each group's key and the range of its alerts), a group's own in the order of the rules: a
/// stable order makes the alerts of one close come out the same on every run.
pub(super) fn in_key_order(out: &mut Vec<Alert>, first: usize, mut runs: Vec<(&Key, usize, usize)>) {
    if runs.len() <= 1 {
        return;
    }
    runs.sort_by(|a, b| compare_keys(a.0, b.0));
    let mut rank = vec![0; out.len() - first];
    for (n, &(_, from, to)) in runs.iter().enumerate() {
        rank[from - first..to - first].fill(n);
    }
    let mut alerts: Vec<(usize, Alert)> = rank.into_iter().zip(out.drain(first..)).collect();
    alerts.sort_by_key(|(n, _)| *n);
    out.extend(alerts.into_iter().map(|(_, alert)| alert));
}

pub(super) fn compare_keys(a: &Key, b: &Key) -> std::cmp::Ordering {
    a.0.iter().zip(&b.0).map(|(x, y)| x.tie_order(y)).find(|o| o.is_ne()).unwrap_or(std::cmp::Ordering::Equal)
}

/// The windows behind an alert: the group's state in its recent windows, newest first, and the
/// baseline or cluster summary it was judged against.
pub(super) fn evidence(
    names: &[String],
    history: &History,
    end: Millis,
    size: Millis,
    slide: Millis,
    baselines: Option<&BTreeMap<String, Value>>,
    cluster: Option<&ClusterResult>,
) -> Vec<Evidence> {
    let mut out: Vec<Evidence> = history
        .iter()
        .take(MAX_EVIDENCE - 1)
        .enumerate()
        .map(|(ago, values)| {
            let window_end = end - ago as Millis * slide;
            let mut obj = serde_json::Map::new();
            obj.insert("window".into(), Json::from(ago));
            obj.insert("start".into(), Json::String(format_time(window_end - size)));
            obj.insert("end".into(), Json::String(format_time(window_end)));
            for (name, v) in names.iter().zip(values.iter()) {
                obj.insert(name.clone(), v.to_json());
            }
            Evidence::Json(Json::Object(obj))
        })
        .collect();
    if let Some(b) = baselines {
        let obj: serde_json::Map<String, Json> = b.iter().map(|(k, v)| (k.clone(), v.to_json())).collect();
        out.push(Evidence::Json(serde_json::json!({ "baseline": obj })));
    }
    if let Some(c) = cluster {
        out.push(Evidence::Json(serde_json::json!({ "cluster": {
            "outlier": c.outlier, "score": Value::Num(c.score).to_json(), "median": c.median,
            "mean": c.mean, "mad": c.mad, "size": c.size, "peers": &*c.peers,
        }})));
    }
    out
}
