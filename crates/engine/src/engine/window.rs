//! Windowed state: tumbling and sliding windows over one pattern, per-group aggregates and a
//! history of the last k windows, judged by every rule that shares the state.
//!
//! Windows are aligned to multiples of the slide and keyed by their start; a window
//! `[start, start + size)` closes once the watermark shows every event before its end has been
//! seen. At each close every live group gets a result, an empty one if it had no events, so
//! `ss[1]` is always the window just before `ss[0]`. A group with no events for as many windows
//! as it needs to remember (its history, or its invariant's training) and no active alert is
//! forgotten.

mod build;
mod checkpoint;
mod parts;
mod stages;

pub use build::{shared_state, WindowOperatorBuilder};
pub use stages::{Pending, Stage};

use super::alerting::Alerting;
use super::blind::{BlindSpot, Lost};
use super::eval::{eval, holds, ClusterResult, Env, History, NumberTest, RegexCache};
use super::invariant::Baseline;
use super::keys::{Key, KeyMap};
use super::open_windows::{OpenWindows, Slot};
use super::operator::Operator;
use super::outlier;
use super::scorer::Scores;
use super::state::Acc;
use super::trace::Trace;
use crate::alert::{Alert, Evidence};
use crate::event::{Event, Millis, Value};
use parts::{compare_keys, evidence, in_key_order, rebuild_positions, stand_in};
use std::collections::HashMap;
use std::sync::Arc;
use vigil_lang::plan::{GroupKey, RulePlan, ScorePlan, SourcePlan, StatePlan, TExprKind, WindowPlan, WindowedPlan};

/// How long a scored group is remembered without events.
const SCORED_MEMORY_MS: Millis = 7 * 24 * 3_600_000;

struct Dependent {
    plan: Arc<RulePlan>,
    alerting: Alerting,
    /// The alert condition compiled, when it only compares the closed window's numbers with
    /// literals (and the rule has no invariant, whose baselines it would read).
    test: Option<NumberTest>,
    scores: Option<ScorePlan>,
    /// A scored rule's self-alert for series whose learned history the limits dropped.
    blind: BlindSpot,
    /// When its judgements are followed ([`super::trace`]).
    trace: Option<Trace>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Group {
    open: OpenWindows,
    history: History,
    /// The group's latest event, kept only when the group key cannot rebuild what the alert
    /// reads: every event of a group has the same key values, so usually a stand-in event made
    /// from the key serves.
    last_event: Option<Arc<Event>>,
    /// Closed windows since the group's last event.
    idle: u32,
    /// Whether the window that just closed had events.
    active: bool,
    /// Per dependent rule with an invariant (none allocated without one).
    baselines: Box<[Baseline]>,
    /// Per dependent rule, its scores if it has a `score` block (none allocated without one).
    /// Checkpointed apart ([`WindowExtension`]).
    #[serde(skip)]
    scores: Box<[Option<Scores>]>,
}

impl Group {
    fn scores_bytes(&self) -> usize {
        scores_bytes(&self.scores)
    }
}

/// What a group's scores hold ([`Scores::bytes`], summed).
fn scores_bytes(scores: &[Option<Scores>]) -> usize {
    scores.iter().flatten().map(Scores::bytes).sum()
}

/// Keeps the groups `keep` says to keep, taking what the others' scores held off `held`.
fn retain_groups(groups: &mut KeyMap<Group>, held: &mut usize, mut keep: impl FnMut(&Key, &Group) -> bool) {
    let mut freed = 0;
    groups.retain(|key, g| {
        let kept = keep(key, g);
        if !kept {
            freed += g.scores_bytes();
        }
        kept
    });
    *held = held.saturating_sub(freed);
}

impl Dependent {
    /// A scored rule judges a group: its scorers learn from the window if it had events (a
    /// quiet window is not judged), and the alert reads the scores.
    #[allow(clippy::too_many_arguments)]
    fn judge_scored(
        &mut self,
        key: &Key,
        end: Millis,
        active: bool,
        scores: &mut Scores,
        env: &Env,
        windows: impl FnOnce() -> Vec<Evidence>,
        out: &mut Vec<Alert>,
    ) {
        let Some(plan) = &self.scores else { return };
        if active {
            scores.update(plan, env);
        } else {
            scores.clear();
        }
        let judged = Env { scores: Some(&scores.values), ..*env };
        self.note(key, end, active, &judged);
        let fires = holds(&self.plan.alert.condition, &judged);
        let evidence = || {
            let mut out = windows();
            out.push(Evidence::Json(scores.evidence(plan, &self.plan.alert.condition, &judged)));
            out
        };
        self.alerting.observe(key, end, fires, &judged, evidence, out);
    }

    /// Notes the judgement of `key` at `end` when the rule's judgements are followed.
    fn note(&self, key: &Key, end: Millis, active: bool, env: &Env) {
        if let Some(trace) = self.trace.as_ref().filter(|t| t.wants(end)) {
            let quiet = self.alerting.quieted(key, end);
            trace.note(self.alerting.key_text(key), end, active, &self.plan.alert.condition, env, quiet);
        }
    }
}

pub struct WindowOperator {
    stage: Stage,
    /// When summarising: whether a group's peer group (its cluster step's `per`) is a function
    /// of its key, so that summaries can go to the stage-two partition of their peer group.
    peers_by_key: bool,
    /// When summarising: the closed windows not yet taken ([`WindowOperator::take_summaries`]).
    summaries: Vec<super::summary::Summary>,
    /// When judging: the summaries of windows not closed yet.
    pending: Pending,
    /// The single pattern, as a one-element slice for [`Env`].
    source: Vec<SourcePlan>,
    /// Positions of the pattern's entity key fields.
    key_positions: Vec<usize>,
    /// By group key: where an entity key's attributes are in the events (empty for a value).
    group_entities: Vec<Vec<usize>>,
    state: StatePlan,
    field_names: Vec<String>,
    size: Millis,
    slide: Millis,
    history: usize,
    /// Empty windows after which an idle group is forgotten.
    remember: usize,
    groups: KeyMap<Group>,
    /// What the groups' scores hold ([`Scores::bytes`], summed), kept as they grow, are made
    /// and dropped: a series' scores grow with its life, so no one group stands for the rest.
    scores_bytes: usize,
    /// Room for the next snapshot: the last one's size and an eighth, so that serialising a
    /// large state writes it once instead of growing (and copying) the buffer as it goes.
    snapshot_room: std::sync::atomic::AtomicUsize,
    has_invariant: bool,
    has_scores: bool,
    /// Where each key value goes in a stand-in event, when every group key is a plain field.
    rebuild: Option<Vec<usize>>,
    /// The place in the key of the field the rules roll their alerts up by, when they do (and
    /// agree on it): the state is partitioned by that field alone, so that every group of a
    /// host is judged where its roll-up is.
    rolled_up_by: Option<usize>,
    /// End of the next window to close.
    next_close: Option<Millis>,
    /// A window with nothing in it yet, copied for each new one.
    empty: Box<[Acc]>,
    /// By aggregate: the position of the event's field that is its whole argument (`avg(e.cpu)`),
    /// read in place; or else the argument's value for the event at hand (`Null` for
    /// `count()`), kept here to save an allocation per event.
    args: Vec<(Option<usize>, Value)>,
    /// Whether an argument needs the evaluator.
    evaluates_args: bool,
    /// By aggregate: its `where`, if it has one.
    filters: Vec<Option<vigil_lang::plan::TExpr>>,
    /// Whether any aggregate has a `where`.
    has_filters: bool,
    /// By aggregate, for the event at hand: whether its `where` leaves the event out (kept
    /// here to save an allocation per event).
    left_out: Vec<bool>,
    /// Whether an aggregate is kept per series: the event's series is then hashed.
    per_series: bool,
    dependents: Vec<Dependent>,
    regexes: Arc<RegexCache>,
    max_keys: usize,
    idle_ms: Millis,
    /// Values in a group key.
    key_len: usize,
    /// Groups dropped over the cap, and for idleness before their history ran out.
    evicted: u64,
    evicted_idle: u64,
    /// Groups dropped to stay within the state budget.
    evicted_memory: u64,
    /// Closes in a row in which no group had events, since the last new group.
    quiet_closes: u32,
    /// Quiet closes after which more of them change nothing ([`Operator::skip_quiet`]).
    settle_closes: u32,
}

impl WindowOperator {
    /// Drops the sixteenth of the groups idle longest (those with an active alert last, ties
    /// broken by key so that every run drops the same), making room for new ones.
    fn evict(&mut self) {
        self.evicted += self.drop_idlest("cap") as u64;
    }

    /// Drops the sixteenth of the groups that lose least by it (no active alert, least learned,
    /// idle longest), for `reason` (`cap` or `memory`); returns how many went. A scored rule
    /// notes them for its self-alert.
    fn drop_idlest(&mut self, reason: &'static str) -> usize {
        let n = (self.groups.len() / 16).max(1);
        let dependents = &self.dependents;
        // Dropped first: groups with no active alert, then those whose scores learned least (a
        // series seen once before a baseline of two weeks: under a flood of new series, the new
        // ones wait), then the idlest.
        let learned = |g: &Group| g.scores.iter().flatten().map(Scores::learned).max().unwrap_or(0);
        let mut ranked: Vec<(bool, u64, u32, &Key)> = self
            .groups
            .iter()
            .map(|(k, g)| (dependents.iter().any(|d| d.alerting.is_active(k)), learned(g), g.idle, k))
            .collect();
        let order = |a: &(bool, u64, u32, &Key), b: &(bool, u64, u32, &Key)| {
            a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.cmp(&a.2)).then_with(|| compare_keys(a.3, b.3))
        };
        if n < ranked.len() {
            ranked.select_nth_unstable_by(n - 1, order);
        }
        let victims: Vec<Key> = ranked.into_iter().take(n).map(|(.., k)| k.clone()).collect();
        for k in victims {
            if let Some(g) = self.groups.remove(&k) {
                self.scores_bytes = self.scores_bytes.saturating_sub(g.scores_bytes());
            }
        }
        for d in self.dependents.iter_mut().filter(|d| d.scores.is_some()) {
            d.blind.dropped_many(reason, n as u64);
        }
        n
    }

    /// A judging operator's summaries of one window, by key, with a group added for each key
    /// new in them.
    fn summarised_groups(&mut self, groups: Vec<(Key, Arc<[Value]>)>) -> HashMap<Key, Arc<[Value]>> {
        for (key, _) in &groups {
            self.insert_group(key.clone());
        }
        groups.into_iter().collect()
    }

    /// Adds a group for `key`, with nothing in it yet, unless there is one; over the cap, the
    /// groups idle longest make room first.
    fn insert_group(&mut self, key: Key) {
        if self.groups.contains_key(&key) {
            return;
        }
        if self.groups.len() >= self.max_keys {
            self.evict();
        }
        let rules = self.dependents.len();
        let scores: Box<[Option<Scores>]> = if self.has_scores {
            self.dependents.iter().map(|d| d.scores.as_ref().map(Scores::new)).collect()
        } else {
            Box::default()
        };
        self.scores_bytes += scores_bytes(&scores);
        // Quiet closes count from the newest group, so that every group has been through them
        // (its history full of empty windows) before any are skipped.
        self.quiet_closes = 0;
        self.groups.insert(
            key,
            Group {
                // Sized once: a tumbling window has one open at a time, a sliding one
                // size/slide.
                open: OpenWindows::with_capacity((self.size / self.slide).max(1) as usize, self.empty.len()),
                history: History::new(),
                last_event: None,
                idle: 0,
                active: false,
                // Only rules with an invariant keep a baseline per group.
                baselines: if self.has_invariant { vec![Baseline::default(); rules].into() } else { Box::default() },
                scores,
            },
        );
    }

    fn group_key(&self, event: &Event) -> Key {
        let events = [Some(event)];
        let env = Env::events(&self.source, &events, &self.regexes);
        // Exactly as long as it needs to be: a key is kept for as long as its group lives.
        let mut key = Vec::with_capacity(self.key_len);
        for (k, positions) in self.state.group_by.iter().zip(&self.group_entities) {
            match k {
                GroupKey::Entity { .. } => key.extend(positions.iter().map(|&p| event.value(p))),
                GroupKey::Value(e) => key.push(eval(e, &env)),
            }
        }
        if self.state.group_by.is_empty() {
            key.push(Value::str("all"));
        }
        Key(key)
    }

    /// Closes the window ending at `end` for every group and lets each dependent rule judge it.
    /// A judging operator takes the groups' results from `incoming` (the summaries of the
    /// window) instead of their open windows: a group new in them is added first.
    fn close(&mut self, end: Millis, incoming: Option<Vec<(Key, Arc<[Value]>)>>, out: &mut Vec<Alert>) {
        let any_active = self.close_windows(end - self.size, incoming);
        let clusters: Vec<HashMap<Key, ClusterResult>> = (0..self.dependents.len()).map(|d| self.cluster(d)).collect();
        let (size, slide) = (self.size, self.slide);
        let Self { groups, dependents, source, rebuild, regexes, field_names: names, scores_bytes, .. } = self;
        let mut scratch = Event::new(source[0].stream, 0);
        // Each group's alerts, to be put in key order once every group is judged: groups are
        // judged in the map's order, which differs from run to run, and most closes alert for
        // few groups, so sorting those is cheaper than sorting every key first.
        let first = out.len();
        let mut runs: Vec<(&Key, usize, usize)> = Vec::new();
        // Group by group, each judged by every rule that shares the state.
        for (key, group) in groups.iter_mut() {
            let from = out.len();
            let Group { history, last_event, baselines, active, scores, .. } = group;
            let events = [Some(stand_in(last_event, rebuild, key, &mut scratch))];
            let active = *active;
            for (d, dependent) in dependents.iter_mut().enumerate() {
                // The common case of many threshold rules over one state: a compiled test, and
                // for a group that does not meet it and has no alert to resolve, nothing more
                // (unless the rule rolls its alerts up, which follows every group it judges).
                let compiled = dependent.test.as_ref().map(|test| test.holds_on_window(history));
                if compiled == Some(false)
                    && dependent.alerting.active() == 0
                    && !dependent.alerting.rolls_up()
                    && dependent.trace.is_none()
                {
                    continue;
                }
                let plan = &dependent.plan;
                let cluster = clusters[d].get(key);
                let env = Env {
                    sources: source,
                    events: &events,
                    state: Some(history),
                    baselines: None,
                    cluster,
                    regexes,
                    scores: None,
                    intervals: None,
                };
                if let Some(Some(group_scores)) = scores.get_mut(d) {
                    let windows = || evidence(names, history, end, size, slide, None, cluster);
                    let before = group_scores.bytes();
                    dependent.judge_scored(key, end, active, group_scores, &env, windows, out);
                    *scores_bytes = (*scores_bytes + group_scores.bytes()).saturating_sub(before);
                    continue;
                }
                match plan.model.invariant() {
                    // No alert while a group trains; windows without events teach nothing.
                    Some(inv) if baselines[d].training(inv) => {
                        if active {
                            baselines[d].learn(inv, &env);
                        }
                    }
                    Some(inv) => {
                        let judged = Env { baselines: Some(&baselines[d].values), ..env };
                        dependent.note(key, end, active, &judged);
                        let fires = holds(&plan.alert.condition, &judged);
                        let evidence =
                            || evidence(names, history, end, size, slide, Some(&baselines[d].values), cluster);
                        dependent.alerting.observe(key, end, fires, &judged, evidence, out);
                        if active {
                            baselines[d].after_alert(inv, &env);
                        }
                    }
                    None => {
                        dependent.note(key, end, active, &env);
                        let fires = compiled.unwrap_or_else(|| holds(&plan.alert.condition, &env));
                        let evidence = || evidence(names, history, end, size, slide, None, cluster);
                        dependent.alerting.observe(key, end, fires, &env, evidence, out);
                    }
                }
            }
            if out.len() > from {
                runs.push((key, from, out.len()));
            }
        }
        in_key_order(out, first, runs);
        // Without `ss[1]` anywhere, nothing reads a window after its close: keep no history.
        if self.history <= 1 {
            for g in self.groups.values_mut() {
                g.history = History::new();
            }
        }
        self.quiet_closes = if any_active { 0 } else { self.quiet_closes.saturating_add(1) };
        self.forget_idle();
    }

    /// Puts each group's window starting at `start` (or its summary in `incoming`, when judging)
    /// at the head of its history; whether any group had events in it.
    fn close_windows(&mut self, start: Millis, incoming: Option<Vec<(Key, Arc<[Value]>)>>) -> bool {
        let mut incoming = incoming.map(|groups| self.summarised_groups(groups));
        let empty = &self.empty;
        let mut any_active = false;
        for (key, group) in self.groups.iter_mut() {
            let results = match incoming.as_mut() {
                Some(summaries) => summaries.remove(key),
                None => group.open.close(start),
            };
            group.active = results.is_some();
            any_active |= group.active;
            let results = results.unwrap_or_else(|| empty.iter().map(Acc::result).collect());
            group.history.insert(0, results);
            group.history.truncate(self.history);
            group.idle = if group.active { 0 } else { group.idle.saturating_add(1) };
        }
        any_active
    }

    /// Forgets the groups idle for longer than they are remembered (or than the idle timeout),
    /// unless an alert of theirs is active or they have open windows.
    fn forget_idle(&mut self) {
        let remember = self.remember.clamp(1, u32::MAX as usize) as u32;
        // Windows that make the idle time, when that is shorter than what the group remembers.
        let idle_windows = match self.idle_ms {
            0 => u32::MAX,
            ms => (ms / self.slide).clamp(1, i64::from(u32::MAX)) as u32,
        };
        let dependents = &self.dependents;
        let pending = &self.pending;
        let mut expired = 0;
        retain_groups(&mut self.groups, &mut self.scores_bytes, |key, g| {
            let active = dependents.iter().any(|d| d.alerting.is_active(key));
            // A judging operator's group has summaries of windows to come instead.
            let open = !g.open.is_empty() || pending.awaits(key);
            let remembered = g.idle < remember || open || active;
            let idle_out = g.idle >= idle_windows && !open && !active;
            expired += u64::from(remembered && idle_out);
            remembered && !idle_out
        });
        self.evicted_idle += expired;
    }

    /// Runs dependent `d`'s cluster step over the groups that had events in the window.
    fn cluster(&self, d: usize) -> HashMap<Key, ClusterResult> {
        let plan = &self.dependents[d].plan;
        let Some(c) = plan.model.cluster() else { return HashMap::new() };
        let mut peers: HashMap<Key, Vec<(Key, Vec<f64>)>> = HashMap::new();
        let mut scratch = Event::new(self.source[0].stream, 0);
        for (key, group) in &self.groups {
            if !group.active {
                continue;
            }
            let events = [Some(stand_in(&group.last_event, &self.rebuild, key, &mut scratch))];
            let env = Env {
                sources: &self.source,
                events: &events,
                state: Some(&group.history),
                baselines: None,
                cluster: None,
                regexes: &self.regexes,
                scores: None,
                intervals: None,
            };
            let point: Option<Vec<f64>> = c.dims.iter().map(|e| eval(e, &env).as_f64()).collect();
            let Some(point) = point else { continue };
            let peer = Key(c.per.iter().map(|e| eval(e, &env)).collect());
            peers.entry(peer).or_default().push((key.clone(), point));
        }
        let mut out = HashMap::new();
        for (_, mut members) in peers {
            members.sort_by(|a, b| compare_keys(&a.0, &b.0));
            let points: Vec<Vec<f64>> = members.iter().map(|(_, p)| p.clone()).collect();
            for ((key, _), result) in members.into_iter().zip(outlier::judge(&points, c.method, c.distance)) {
                out.insert(key, result);
            }
        }
        out
    }
}

impl Operator for WindowOperator {
    fn trace(&mut self, trace: &Trace) {
        for d in self.dependents.iter_mut().filter(|d| d.plan.name == trace.rule) {
            d.trace = Some(trace.clone());
        }
    }

    fn key_fields(&self, _source: usize) -> Option<Vec<usize>> {
        // A cluster step compares every group of a window: its state is one whole, unless a
        // second stage judges the summaries of its groups.
        let fleet_wide = self.stage == Stage::Whole
            && self.dependents.iter().any(|d| matches!(d.plan.model, vigil_lang::plan::ModelPlan::Outlier(..)));
        let fields = self.rebuild.clone().filter(|p| !p.is_empty() && !fleet_wide)?;
        Some(match self.rolled_up_by.and_then(|i| fields.get(i)) {
            Some(field) => vec![*field],
            None => fields,
        })
    }

    fn on_event(&mut self, _source: usize, event: &Arc<Event>, _out: &mut Vec<Alert>) {
        if !super::operator::binds_entities(&self.key_positions, event) {
            return;
        }
        // The engine has checked the pattern's filter; each field's own `where` is read here.
        let mut args = std::mem::take(&mut self.args);
        let mut left_out = std::mem::take(&mut self.left_out);
        if self.evaluates_args || self.has_filters {
            let events = [Some(event.as_ref())];
            let env = Env::events(&self.source, &events, &self.regexes);
            for (f, (field, value)) in self.state.fields.iter().zip(&mut args) {
                if let (None, Some(arg)) = (field, &f.arg) {
                    *value = eval(arg, &env);
                }
            }
            for (out, filter) in left_out.iter_mut().zip(&self.filters) {
                *out = filter.as_ref().is_some_and(|c| eval(c, &env) != Value::Bool(true));
            }
            if left_out.iter().all(|out| *out) {
                // No field reads it: the event opens no group and no window.
                self.args = args;
                self.left_out = left_out;
                return;
            }
        }
        let series = if self.per_series { super::keys::series_hash(event, &self.key_positions) } else { 0 };
        let last_start = event.ts.div_euclid(self.slide) * self.slide;
        let first_start = last_start - self.size + self.slide;
        let keep_event = self.rebuild.is_none();
        let add = |group: &mut Group, empty: &[Acc], slide: Millis| {
            if keep_event {
                group.last_event = Some(event.clone());
            }
            group.open.update(first_start, last_start, slide, empty, |f, acc| {
                if let (Some((field, value)), Some(false)) = (args.get(f), left_out.get(f)) {
                    acc.add(field.and_then(|i| event.fields.get(i)).unwrap_or(value), event.ts, series);
                }
            });
        };
        // A live group is found from the event's fields in place (the positions of a stand-in
        // event's key values are where the key's values are read); only a new one needs its key.
        let found = match &self.rebuild {
            Some(positions) if !self.state.group_by.is_empty() => {
                self.groups.get_mut(&super::keys::FieldsKey { event, positions })
            }
            _ => None,
        };
        match found {
            Some(group) => add(group, &self.empty, self.slide),
            None => {
                let key = self.group_key(event);
                self.insert_group(key.clone());
                let group = self.groups.get_mut(&key).expect("inserted");
                add(group, &self.empty, self.slide);
            }
        }
        self.args = args;
        self.left_out = left_out;
        let first_end = first_start + self.size;
        if self.next_close.is_none_or(|c| first_end < c) {
            self.next_close = Some(first_end);
        }
    }
    fn on_watermark(&mut self, watermark: Millis, out: &mut Vec<Alert>) {
        while let Some(end) = self.next_close.filter(|end| end - 1 <= watermark) {
            match self.stage {
                Stage::Whole => self.close(end, None, out),
                Stage::Summarise => self.summarise(end),
                Stage::Judge => {
                    let incoming = self.pending.take(end);
                    self.close(end, Some(incoming), out);
                }
            }
            self.next_close = (!self.groups.is_empty()).then_some(end + self.slide);
            if self.stage == Stage::Judge {
                self.next_close = self.pending.closed(end, self.next_close);
            }
        }
        for d in &mut self.dependents {
            d.blind.report(&d.plan.name, Lost::Scores, watermark, out);
            d.blind.expire(watermark, out);
        }
    }

    fn next_deadline(&self) -> Option<Millis> {
        let blind = self.dependents.iter().filter_map(|d| d.blind.next_deadline()).min();
        self.next_close.map(|end| end - 1).into_iter().chain(blind).min()
    }

    /// Once closes have been quiet long enough to change nothing more, jumps over the closes up
    /// to `horizon` that would be quiet too (before any group's first open window): their only
    /// effect is on how long groups have been idle, and on when a condition that holds last
    /// held, which the last of them, closed as usual, sets.
    fn skip_quiet(&mut self, horizon: Millis) {
        let Some(next) = self.next_close else { return };
        if self.quiet_closes < self.settle_closes {
            return;
        }
        let busy = match self.stage {
            Stage::Judge => self.pending.first_end(),
            _ => self.groups.values().filter_map(|g| g.open.first_start()).min().map(|start| start + self.size),
        };
        // The last quiet close: final (its end is at most horizon + 1) and before the first busy
        // one. The closes before it are skipped; it is made.
        let last = busy.map_or(horizon.saturating_add(1), |b| (b - self.slide).min(horizon.saturating_add(1)));
        if last <= next {
            return;
        }
        let skipped = (last - next) / self.slide;
        let idle = u32::try_from(skipped).unwrap_or(u32::MAX);
        for g in self.groups.values_mut() {
            g.idle = g.idle.saturating_add(idle);
        }
        self.forget_idle();
        self.next_close = (!self.groups.is_empty()).then_some(next + skipped * self.slide);
    }

    fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        self.snapshot_bytes()
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), postcard::Error> {
        self.restore_bytes(state)
    }

    fn take_summaries(&mut self) -> Vec<super::summary::Summary> {
        std::mem::take(&mut self.summaries)
    }

    fn evicted(&self) -> Vec<(String, &'static str, u64)> {
        let mut out = Vec::new();
        for d in &self.dependents {
            for (reason, n) in [("cap", self.evicted), ("idle", self.evicted_idle), ("memory", self.evicted_memory)] {
                out.push((d.plan.name.clone(), reason, n));
            }
        }
        out
    }

    fn state_bytes(&self) -> usize {
        let fields = self.empty.len();
        let open = (self.size / self.slide).max(1) as usize;
        let value = std::mem::size_of::<Value>();
        // A group: its key, its record, its open windows, its history (a shared list of
        // values per window), the event it keeps when the key cannot stand in for it.
        let per_group = std::mem::size_of::<(Key, Group)>()
            + self.key_len * value
            + open * (fields + 1) * std::mem::size_of::<Slot>()
            + self.history * (fields * value + 40)
            + if self.rebuild.is_none() { super::operator::event_bytes(self.source[0].stream) } else { 0 }
            + if self.has_scores { self.dependents.len() * std::mem::size_of::<Option<Scores>>() } else { 0 }
            + 32;
        self.groups.len() * per_group
            + self.scores_bytes
            + self.dependents.iter().map(|d| d.alerting.state_bytes()).sum::<usize>()
    }

    /// Drops for memory are said at once (the self-alert); those over the key cap, at the next
    /// watermark.
    fn shrink(&mut self, now: Millis, out: &mut Vec<Alert>) -> bool {
        if self.groups.is_empty() {
            return false;
        }
        self.evicted_memory += self.drop_idlest("memory") as u64;
        for d in &mut self.dependents {
            d.blind.report(&d.plan.name, Lost::Scores, now, out);
        }
        true
    }

    fn live_keys(&self) -> Vec<(String, usize)> {
        self.dependents.iter().map(|d| (d.plan.name.clone(), self.groups.len())).collect()
    }
}
