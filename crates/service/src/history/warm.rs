//! A warm start: before `vigil serve` takes its first live sample, the rules' windows and
//! scorers are fed the series' recent history from the team's Prometheus, so that a new
//! deployment judges from the first minute instead of after its scorers' warm-up (16 hours for
//! `metric_deviation` at five-minute windows).
//!
//! The history is read with range queries of `--warm-match` at `--warm-step` over
//! `--warm-lookback` before now, an hour of steps at a time, and taken page by page in time
//! order, under the state budget. Its samples become events as remote-written ones do (the same
//! host mapping). It ends at the start, where live samples take over; it never runs ahead of
//! them. What the history raises is not sent: an alert it leaves firing at the handover is sent
//! once, as firing now, and the rest are only counted. State restored from a checkpoint wins:
//! with one, there is no warm start.

use super::proto::Label;
use super::{Prometheus, PrometheusError};
use std::collections::BTreeMap;
use std::time::Duration;
use vigil_engine::alert::{Alert, Status};
use vigil_engine::event::{Event, Millis};
use vigil_engine::remote_write::{series_samples, HostLabels};
use vigil_engine::runtime::Runtime;

/// What to read.
#[derive(Clone)]
pub struct WarmStart {
    pub prometheus: Prometheus,
    /// A series selector (PromQL).
    pub selector: String,
    pub lookback: Duration,
    pub step: Duration,
    pub hosts: HostLabels,
    /// Labels a remote-write receiver takes off live series (an HA pair's replica label): not
    /// added to the history from the server's external labels.
    pub dropped_labels: Vec<String>,
    /// The state budget kept while history is taken.
    pub max_state_bytes: usize,
}

/// What a warm start did.
#[derive(Debug, Default)]
pub struct Warmed {
    pub series: usize,
    pub samples: u64,
    pub requests: u64,
    /// Transitions the history raised, not sent.
    pub held_back: u64,
    /// The alerts the history left firing at the handover: sent, as firing now.
    pub firing: Vec<Alert>,
}

/// Steps read in one request: an hour's at a step of a minute or more.
fn steps_per_page(step: Duration) -> i64 {
    (3_600_000 / step.as_millis().max(1) as i64).clamp(1, super::query::MAX_POINTS)
}

/// Feeds `runtime` the history up to `now`. Runs on a blocking thread; `handle` makes the
/// requests.
pub fn warm(
    runtime: &mut Runtime,
    w: &WarmStart,
    handle: &tokio::runtime::Handle,
    now: Millis,
) -> Result<Warmed, PrometheusError> {
    let step = w.step.as_millis().max(1) as i64;
    let per_page = steps_per_page(w.step);
    // On the step grid, so that pages meet without a gap or an overlap.
    let first = (now - w.lookback.as_millis() as i64).div_euclid(step) * step;
    let mut warmed = Warmed::default();
    let mut last: BTreeMap<String, Alert> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    // Live samples carry the server's external labels, range queries' answers do not: added, so
    // that the history warms the series live samples continue.
    let external: Vec<Label> = match handle.block_on(w.prometheus.external_labels()) {
        Ok(labels) => labels
            .into_iter()
            .filter(|(name, _)| !w.dropped_labels.contains(name))
            .map(|(name, value)| Label { name, value })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "the server's external labels cannot be read: the history is taken as it is");
            Vec::new()
        }
    };
    let mut from = first;
    while from <= now {
        let to = (from + (per_page - 1) * step).min(now);
        let mut series = handle.block_on(w.prometheus.query_range(&w.selector, from, to, w.step))?;
        for s in &mut series {
            for l in &external {
                if !s.labels.iter().any(|have| have.name == l.name) {
                    s.labels.push(l.clone());
                }
            }
        }
        warmed.requests += 1;
        let mut events: Vec<Event> = Vec::new();
        for s in &series {
            if let Ok(samples) = series_samples(s, &w.hosts, None) {
                let labels: Vec<(String, String)> =
                    s.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
                if !samples.events.is_empty() && seen.insert(labels) {
                    warmed.series += 1;
                }
                events.extend(samples.events);
            }
        }
        events.sort_by_key(|e| e.ts);
        warmed.samples += events.len() as u64;
        runtime.push(events, Vec::new(), &mut out);
        runtime.catch_up(&mut out);
        runtime.enforce_budget(w.max_state_bytes, &mut out);
        for a in out.drain(..) {
            warmed.held_back += 1;
            last.insert(a.id.clone(), a);
        }
        from = to + step;
    }
    warmed.firing = last.into_values().filter(|a| a.status == Status::Firing).collect();
    Ok(warmed)
}

#[cfg(test)]
mod tests {
    use super::steps_per_page;
    use std::time::Duration;

    #[test]
    fn a_page_is_an_hour_of_steps_within_the_query_apis_limit() {
        assert_eq!(steps_per_page(Duration::from_secs(150)), 24);
        assert_eq!(steps_per_page(Duration::from_secs(7200)), 1);
        assert_eq!(steps_per_page(Duration::from_millis(1)), 10_000);
    }
}
