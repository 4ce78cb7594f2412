//! A warm start: before `vigil serve` takes its first live sample, the rules' windows and
//! scorers are fed the series' recent history from the team's Prometheus, so that a new
//! deployment judges from the first minute instead of after its scorers' warm-up (16 hours for
//! `metric_deviation` at five-minute windows). A group member warms the keyed partitions it
//! claims without a checkpoint the same way ([`crate::group`]'s `warming`).
//!
//! The history is read with range queries of `--warm-match` at `--warm-step` over
//! `--warm-lookback` before now, an hour of steps at a time, except its last `--warm-raw`, read
//! raw (remote-read, every sample) ten minutes at a time, and taken page by page in time order,
//! under the state budget. Stepped history is cheap (about 15 times fewer samples than a 10 s
//! scrape's), but the windows live samples continue must have been learned at their
//! resolution: a counter's rate over five minutes from two values is not the one from thirty,
//! and the first live windows would look unlike all of the history (RELIABILITY.md, "The same
//! fork storm after a warm start"). Its samples become events as remote-written ones do (the
//! same host mapping). It ends at the start, where live samples take over; it never runs ahead of
//! them. What the history raises is not sent: an alert it leaves firing at the handover is sent
//! once, as firing now, and the rest are only counted. State restored from a checkpoint wins:
//! with one, there is no warm start. A stop (SIGTERM) during a warm start ends it at once, and
//! the engine with it, without a checkpoint: one of half the history would make the next start
//! skip its warm start.

use super::proto::Label;
use super::{Prometheus, PrometheusError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use vigil_engine::alert::{Alert, Status};
use vigil_engine::event::{Event, Millis};
use vigil_engine::runtime::Runtime;
use vigil_formats::metric_kind::Families;
use vigil_formats::remote_write::{series_samples, HostLabels};

/// What a warm start feeds: the runtime of `vigil serve`, or the keyed partitions a group
/// member has claimed without a checkpoint ([`crate::group`]).
pub trait Warmable {
    /// Takes one page of history in time order, under `max_state_bytes`: what it raises goes to
    /// `out`.
    fn take_history(&mut self, events: Vec<Event>, max_state_bytes: usize, out: &mut Vec<Alert>);
}

impl Warmable for Runtime {
    fn take_history(&mut self, events: Vec<Event>, max_state_bytes: usize, out: &mut Vec<Alert>) {
        self.push(events, Vec::new(), out);
        self.catch_up(out);
        self.enforce_budget(max_state_bytes, out);
    }
}

/// What to read.
#[derive(Clone)]
pub struct WarmStart {
    pub prometheus: Prometheus,
    /// A series selector (PromQL).
    pub selector: String,
    pub lookback: Duration,
    pub step: Duration,
    /// The most recent history, read raw: every sample, as live samples come.
    pub raw: Duration,
    pub hosts: HostLabels,
    /// Labels a remote-write receiver takes off live series (an HA pair's replica label): not
    /// added to the history from the server's external labels.
    pub dropped_labels: Vec<String>,
    /// The state budget kept while history is taken.
    pub max_state_bytes: usize,
    /// The metric families' types and units: the server's metadata is learnt into them, so
    /// that history and live remote-write samples of a series are of one kind.
    pub families: Arc<Families>,
    /// The service's stop: true once it is stopping.
    pub stop: Option<watch::Receiver<bool>>,
}

/// Why a warm start ended before the end of the history.
#[derive(Debug)]
pub enum Cut {
    Failed(PrometheusError),
    /// The service is stopping.
    Stopped,
}

impl From<PrometheusError> for Cut {
    fn from(e: PrometheusError) -> Cut {
        Cut::Failed(e)
    }
}

/// `request` run on `handle` to its end, unless the service stops first.
fn until_stop<T>(
    handle: &tokio::runtime::Handle,
    stop: &mut Option<watch::Receiver<bool>>,
    request: impl std::future::Future<Output = T>,
) -> Result<T, Cut> {
    handle.block_on(async {
        let Some(stop) = stop else { return Ok(request.await) };
        tokio::select! {
            done = request => Ok(done),
            _ = stop.wait_for(|stopping| *stopping) => Err(Cut::Stopped),
        }
    })
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

/// Each series of `selector` at each step: its last sample within the step before it. A plain
/// selector would answer a series at every step within five minutes (Prometheus' lookback) of
/// its last sample: a series that ended, or a history that stops before now, would run on for
/// five minutes with its last value, ahead of the live samples that continue it.
/// `last_over_time` keeps the series' name.
fn fresh(selector: &str, step: Duration) -> String {
    format!("last_over_time({selector}[{}ms])", step.as_millis().max(1))
}

/// Dates each answer of a range query at `t` (the last sample of `[t + 1 - step, t]`) at the
/// start of that interval: never after the sample itself, so never ahead of the live samples
/// that continue the series (dated `t`, a history that ends before now would run up to a step
/// into them), and in the window the sample belongs to when the step divides the rules' windows.
fn dated(series: &mut super::proto::TimeSeries, step: i64) {
    for sample in &mut series.samples {
        sample.timestamp = sample.timestamp + 1 - step;
    }
}

/// Time of the raw history read at once.
const RAW_PAGE_MS: i64 = 600_000;

/// Warms `runtime` as [`warm`] does, saying in the log what it read and how long it took; the
/// alerts the history left firing, to be sent as firing now. A Prometheus that cannot be read
/// is said too, and the rules start from what was read. None when the service stopped it.
pub fn warm_up(runtime: &mut impl Warmable, w: &WarmStart, handle: &tokio::runtime::Handle) -> Option<Vec<Alert>> {
    let started = std::time::Instant::now();
    tracing::info!(from = %w.prometheus.endpoint(""), selector = %w.selector, lookback = ?w.lookback, "warm start");
    match warm(runtime, w, handle, vigil_engine::event::now_ms()) {
        Ok(warmed) => {
            tracing::info!(
                series = warmed.series,
                samples = warmed.samples,
                requests = warmed.requests,
                held_back = warmed.held_back,
                firing = warmed.firing.len(),
                seconds = started.elapsed().as_secs_f64(),
                "warm start done: the history's alerts held back, those still firing sent"
            );
            Some(warmed.firing)
        }
        Err(Cut::Failed(e)) => {
            tracing::error!(error = %e, "the warm start failed: the rules start from what it read");
            Some(Vec::new())
        }
        Err(Cut::Stopped) => {
            tracing::info!(
                seconds = started.elapsed().as_secs_f64(),
                "the warm start stopped with the service: no checkpoint, the next start warms again"
            );
            None
        }
    }
}

/// Feeds `runtime` the history up to `now`: at `--warm-step` up to `--warm-raw` before now, then
/// every sample. Runs on a blocking thread; `handle` makes the requests.
pub fn warm(
    runtime: &mut impl Warmable,
    w: &WarmStart,
    handle: &tokio::runtime::Handle,
    now: Millis,
) -> Result<Warmed, Cut> {
    let mut stop = w.stop.clone();
    let step = w.step.as_millis().max(1) as i64;
    let per_page = steps_per_page(w.step);
    let start = now - w.lookback.as_millis() as i64;
    // Where the raw history starts: a point of the step grid, where the stepped one ends.
    let raw_from = (now - w.raw.as_millis() as i64).max(start).div_euclid(step) * step;
    let mut taken = Taken::new(w, handle, &mut stop)?;
    // Asked a millisecond before each point `g` of the step grid, so that pages meet without a gap
    // or an overlap and each answer is the last sample of `[g - step, g)`; dated `g - step`, the
    // interval's start ([`dated`]).
    let mut from = start.div_euclid(step) * step - 1;
    let stepped = fresh(&w.selector, w.step);
    while from < raw_from - 1 {
        let to = (from + (per_page - 1) * step).min(raw_from - 1);
        let query = w.prometheus.query_range(&stepped, from, to, w.step);
        let mut series = until_stop(handle, &mut stop, query)??;
        series.iter_mut().for_each(|s| dated(s, step));
        taken.take(runtime, series);
        from = to + step;
    }
    let matchers = super::selector::parse(&w.selector).map_err(|e| super::fatal(format!("`{}`: {e}", w.selector)))?;
    let mut from = raw_from.max(start);
    while from <= now {
        let to = (from + RAW_PAGE_MS - 1).min(now);
        let series = until_stop(handle, &mut stop, w.prometheus.read(&matchers, from, to))??;
        taken.take(runtime, series);
        from = to + 1;
    }
    let Taken { mut warmed, last, .. } = taken;
    warmed.firing = last.into_values().filter(|a| a.status == Status::Firing).collect();
    Ok(warmed)
}

/// What the history fed so far.
struct Taken<'a> {
    w: &'a WarmStart,
    warmed: Warmed,
    /// Each alert's last transition, by id.
    last: BTreeMap<String, Alert>,
    seen: std::collections::BTreeSet<Vec<(String, String)>>,
    out: Vec<Alert>,
    /// The server's external labels, less those a receiver drops.
    external: Vec<Label>,
}

impl<'a> Taken<'a> {
    fn new(
        w: &'a WarmStart,
        handle: &tokio::runtime::Handle,
        stop: &mut Option<watch::Receiver<bool>>,
    ) -> Result<Taken<'a>, Cut> {
        // Live samples carry the server's external labels, its answers do not: added, so that
        // the history warms the series live samples continue.
        let external = match until_stop(handle, stop, w.prometheus.external_labels())? {
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
        until_stop(handle, stop, super::learn_metadata(&w.prometheus, &w.families))?;
        Ok(Taken {
            w,
            warmed: Warmed::default(),
            last: BTreeMap::new(),
            seen: Default::default(),
            out: Vec::new(),
            external,
        })
    }

    /// One answer's series, fed to `runtime` in time order under the state budget; what they
    /// raise held back.
    fn take(&mut self, runtime: &mut impl Warmable, mut series: Vec<super::proto::TimeSeries>) {
        self.warmed.requests += 1;
        let mut events: Vec<Event> = Vec::new();
        for s in &mut series {
            for l in &self.external {
                if !s.labels.iter().any(|have| have.name == l.name) {
                    s.labels.push(l.clone());
                }
            }
            if let Ok(samples) = series_samples(s, &self.w.hosts, Some(&self.w.families)) {
                let labels: Vec<(String, String)> =
                    s.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
                if !samples.events.is_empty() && self.seen.insert(labels) {
                    self.warmed.series += 1;
                }
                events.extend(samples.events);
            }
        }
        events.sort_by_key(|e| e.ts);
        self.warmed.samples += events.len() as u64;
        runtime.take_history(events, self.w.max_state_bytes, &mut self.out);
        for a in self.out.drain(..) {
            self.warmed.held_back += 1;
            self.last.insert(a.id.clone(), a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fresh, steps_per_page};
    use std::time::Duration;

    #[test]
    fn the_history_reads_each_steps_last_sample_within_the_step() {
        assert_eq!(fresh(r#"{job="node"}"#, Duration::from_secs(150)), r#"last_over_time({job="node"}[150000ms])"#);
    }

    #[test]
    fn a_page_is_an_hour_of_steps_within_the_query_apis_limit() {
        assert_eq!(steps_per_page(Duration::from_secs(150)), 24);
        assert_eq!(steps_per_page(Duration::from_secs(7200)), 1);
        assert_eq!(steps_per_page(Duration::from_millis(1)), 10_000);
    }
}
