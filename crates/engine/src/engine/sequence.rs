//! Sequence rules: an NFA over time-ordered events, with joins on shared entity variables,
//! absence (`not e for D`), counting (`e{n,}`) and a bound on every match.
//!
//! Matching is partitioned: by the `group by` values, or else by the entities every step shares
//! (`task t` in `e1 -> e2` means the same task). Each event of the first step starts a partial
//! match; a partial match advances on the first later event that fits its next step (skip till
//! next match), and dies when its `within` bound passes. At the last step every fitting event
//! completes a match with the same prefix, so each usage sample after a task's SCHEDULE is
//! judged against that request; repeated matches of one key are one alert while it fires. An absence step waits until its
//! deadline; a fitting event before then kills the match. A counted first step keeps one
//! counter of recent events per partition instead of one match per event.

use super::alerting::Alerting;
use super::blind::{BlindSpot, Lost};
use super::eval::{holds, Env, RegexCache};
use super::keys::{Key, KeyMap};
use super::operator::{with_events, Operator};
use super::sequence_plan::{place_conditions, retarget};
use crate::alert::{Alert, Evidence, MAX_EVIDENCE};
use crate::event::{Event, Millis, Value};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;
use vigil_lang::plan::{RulePlan, TExpr};
use vigil_lang::plan::{SequencePlan, StepKind, StepPlan};
use vigil_lang::schema::EntityKind;

/// What a sequence operator's snapshot holds.
type SequenceState = (
    KeyMap<Partition>,
    BTreeMap<u64, Key>,
    BinaryHeap<Reverse<(Millis, u64)>>,
    u64,
    Option<Millis>,
    super::alerting::AlertingState,
    BlindSpot,
);

/// What follows it, when the rule learns intervals or has a refractory period: each partition's
/// recent intervals, and the keys in their refractory period. Checkpoints of builds before these
/// end at the state above.
type SequenceExtension = (Vec<(Key, Cadence)>, Vec<(Key, Millis)>);
/// What follows the extension: the partitions silent now, with the wait that called each
/// silence, so that the gap ending it is remembered as it would have been without the restart.
/// Checkpoints of builds before this end at the extension.
type HeldWaits = Vec<(Key, Millis)>;

/// How often a partition's first-step events come: the last one's time and the gaps before it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Cadence {
    last: Millis,
    gaps: VecDeque<Millis>,
    /// The gaps sorted, made when a bound first reads them after a new gap: a host's many
    /// series sampled together start as many waits, all on one set of gaps.
    #[serde(skip)]
    sorted: std::cell::RefCell<Vec<Millis>>,
    /// The wait after which the rule called the partition silent, while that silence lasts: the
    /// gap that ends it is remembered as at most [`HELD_GAP_FACTOR`] times that wait, so that
    /// one outage does not hide the next while it is remembered. Checkpointed apart, in
    /// [`HeldWaits`].
    #[serde(skip)]
    held: Option<Millis>,
}

/// Gaps a cadence remembers: at a 15-second scrape, an hour; at five minutes, most of a day.
/// Many gaps, so that a host whose reports come when something happens (an irregular cadence)
/// has shown its long gaps before it is judged by them; one long gap then widens the wait until
/// it ages out, which quantiles below 1 avoid.
const CADENCE_GAPS: usize = 256;
/// A gap that ended a silence is remembered as at most this many times the wait that called it:
/// a real outage widens the next wait fourfold, not to its own length, while a series whose
/// reports come when something happens learns its long gaps from a few false silences.
/// `vigil eval --outages` measures the choice (README, "Silence, judged by cut outages").
const HELD_GAP_FACTOR: Millis = 4;
/// A partition with no first-step event for this long forgets its cadence.
const CADENCE_MEMORY_MS: Millis = 7 * 24 * 3_600_000;

impl Cadence {
    fn note(&mut self, ts: Millis) {
        // Events at one time (a host's metrics sampled together) make no gap.
        if ts > self.last && self.last != 0 {
            if self.gaps.len() == CADENCE_GAPS {
                self.gaps.pop_front();
            }
            let gap = ts - self.last;
            self.gaps.push_back(self.held.take().map_or(gap, |wait| gap.min(HELD_GAP_FACTOR * wait)));
            self.sorted.get_mut().clear();
        }
        self.last = self.last.max(ts);
    }

    /// The `q` quantile of the recent gaps (the nearest rank), if there is one.
    fn quantile(&self, q: f64) -> Option<Millis> {
        let mut sorted = self.sorted.borrow_mut();
        if sorted.len() != self.gaps.len() {
            sorted.clear();
            sorted.extend(self.gaps.iter().copied());
            sorted.sort_unstable();
        }
        let i = ((sorted.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
        sorted.get(i).copied()
    }
}

/// One entity variable of the rule.
struct EntityVar {
    kind: EntityKind,
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct PartialMatch {
    id: u64,
    /// Index of the next step to satisfy.
    step: usize,
    /// Bound events by source.
    events: Vec<Option<Arc<Event>>>,
    /// Bound entity identities by entity variable.
    entities: Vec<Option<Vec<Value>>>,
    start: Millis,
    last: Millis,
    /// When a timer is due for this match (absence deadline or `within` expiry).
    due: Option<Millis>,
    /// Events counted by a first `e{n,}` step, for evidence.
    counted: Vec<Arc<Event>>,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Partition {
    matches: Vec<PartialMatch>,
    /// For a counted first step: its recent events, oldest first.
    counter: VecDeque<Arc<Event>>,
}

pub struct SequenceOperator {
    plan: Arc<RulePlan>,
    /// The steps of the plan's sequence.
    steps: Vec<StepPlan>,
    regexes: Arc<RegexCache>,
    alerting: Alerting,
    /// Step index of each source.
    step_of: Vec<usize>,
    /// For each source, each entity it binds with the positions of its key fields.
    identity_positions: Vec<Vec<(usize, Vec<usize>)>>,
    entities: Vec<EntityVar>,
    /// Entity variables every step binds; the partition key when there is no `group by`.
    common: Vec<usize>,
    /// `group by` expressions rewritten for each source, so any step's event can compute them.
    group_by: Vec<Vec<TExpr>>,
    /// Conditions checked when a positive step binds (by step).
    bind_conditions: Vec<Vec<TExpr>>,
    /// Conditions an event must meet to count as the absent event (by step).
    absent_conditions: Vec<Vec<TExpr>>,
    within: Option<Millis>,
    /// Absence bounds that are expressions, by `StepKind::AbsentFor` index.
    bounds: Vec<TExpr>,
    partitions: KeyMap<Partition>,
    /// Partition of each live partial match, by id (ids grow, so the first is the oldest).
    locate: BTreeMap<u64, Key>,
    timers: BinaryHeap<Reverse<(Millis, u64)>>,
    next_id: u64,
    /// When counters next need pruning.
    next_sweep: Option<Millis>,
    limits: super::config::Limits,
    /// Partial matches dropped over the cap, for want of progress, and over the state budget.
    evicted_cap: u64,
    evicted_idle: u64,
    evicted_memory: u64,
    /// The self-alert for waiting absences the limits dropped.
    blind: BlindSpot,
    /// Each partition's cadence, when an absence's bound reads `interval`.
    cadence: KeyMap<Cadence>,
    learns_cadence: bool,
    /// When cadences not updated for a week are next forgotten.
    next_cadence_sweep: Millis,
}

impl SequenceOperator {
    pub fn new(
        plan: Arc<RulePlan>,
        seq: &SequencePlan,
        regexes: Arc<RegexCache>,
        limits: super::config::Limits,
    ) -> Self {
        let mut step_of = vec![0; plan.sources.len()];
        for (i, step) in seq.steps.iter().enumerate() {
            step_of[step.source] = i;
        }
        // Entity variables in order of first binding.
        let mut names: Vec<String> = Vec::new();
        let mut entities = Vec::new();
        let mut binds = vec![Vec::new(); plan.sources.len()];
        for (s, src) in plan.sources.iter().enumerate() {
            for (kind, var) in std::iter::once(&src.subject).chain(src.object.as_ref()) {
                let id = match names.iter().position(|n| n == var) {
                    Some(id) => id,
                    None => {
                        names.push(var.clone());
                        entities.push(EntityVar { kind: *kind });
                        names.len() - 1
                    }
                };
                binds[s].push(id);
            }
        }
        let common: Vec<usize> =
            (0..names.len()).filter(|id| seq.steps.iter().all(|st| binds[st.source].contains(id))).collect();
        let var_bound_by =
            |var: &str, s: usize| names.iter().position(|n| n == var).is_some_and(|id| binds[s].contains(&id));
        let group_by = (0..plan.sources.len())
            .map(|s| seq.group_by.iter().map(|e| retarget(e, s, plan.sources[s].stream, &var_bound_by)).collect())
            .collect();

        let (bind_conditions, absent_conditions) = place_conditions(&plan, seq, &step_of, &names, &binds);
        let key_names = if seq.group_by.is_empty() {
            common
                .iter()
                .flat_map(|&id| entities[id].kind.key_fields().iter().map(move |f| (id, *f)))
                .map(|(id, f)| format!("{}.{f}", names[id]))
                .collect()
        } else {
            seq.group_by.iter().map(|e| e.to_string()).collect()
        };
        let within = seq.within_ms.map(|w| w as Millis);
        let identity_positions = plan
            .sources
            .iter()
            .enumerate()
            .map(|(source, src)| {
                std::iter::once(&src.subject)
                    .chain(src.object.as_ref())
                    .zip(&binds[source])
                    .map(|((_, var), &id)| (id, src.key_positions(var)))
                    .collect()
            })
            .collect();
        SequenceOperator {
            steps: seq.steps.clone(),
            identity_positions,
            alerting: Alerting::new(plan.clone(), key_names),
            plan,
            regexes,
            step_of,
            entities,
            common,
            group_by,
            bind_conditions,
            absent_conditions,
            within,
            partitions: KeyMap::default(),
            locate: BTreeMap::new(),
            timers: BinaryHeap::new(),
            next_id: 1,
            next_sweep: None,
            limits,
            evicted_cap: 0,
            evicted_idle: 0,
            evicted_memory: 0,
            blind: BlindSpot::default(),
            cadence: KeyMap::default(),
            learns_cadence: seq.steps.iter().any(|s| matches!(s.kind, StepKind::AbsentFor(_))),
            next_cadence_sweep: Millis::MIN,
            bounds: seq.bounds.clone(),
        }
    }

    fn steps(&self) -> &[StepPlan] {
        &self.steps
    }

    fn partition_key(&self, source: usize, event: &Event) -> Key {
        if !self.group_by[source].is_empty() {
            return with_events(&[], Some((source, event)), self.plan.sources.len(), |events| {
                let env = Env::events(&self.plan.sources, events, &self.regexes);
                Key(self.group_by[source].iter().map(|e| super::eval::eval(e, &env)).collect())
            });
        }
        let identity = &self.identity_positions[source];
        let mut key = Vec::new();
        for id in &self.common {
            if let Some((_, positions)) = identity.iter().find(|(i, _)| i == id) {
                key.extend(positions.iter().map(|&i| event.value(i)));
            }
        }
        Key(key)
    }

    /// Whether `event` at `source` fits `pm`: same entities, and the conditions hold.
    fn fits(&self, pm: &PartialMatch, source: usize, event: &Arc<Event>, conditions: &[TExpr]) -> bool {
        if pm.events.iter().flatten().any(|e| Arc::ptr_eq(e, event)) {
            return false;
        }
        for (id, positions) in &self.identity_positions[source] {
            if let Some(bound) = &pm.entities[*id] {
                if bound.len() != positions.len() || bound.iter().zip(positions).any(|(b, &i)| *b != event.value(i)) {
                    return false;
                }
            }
        }
        if conditions.is_empty() {
            return true;
        }
        with_events(&pm.events, Some((source, event.as_ref())), pm.events.len(), |events| {
            let env = Env::events(&self.plan.sources, events, &self.regexes);
            conditions.iter().all(|c| holds(c, &env))
        })
    }

    fn new_match(&mut self, start: Millis) -> PartialMatch {
        let id = self.next_id;
        self.next_id += 1;
        PartialMatch {
            id,
            step: 0,
            events: vec![None; self.plan.sources.len()],
            entities: vec![None; self.entities.len()],
            start,
            last: start,
            due: None,
            counted: Vec::new(),
        }
    }

    fn bind(&self, pm: &mut PartialMatch, source: usize, event: &Arc<Event>) {
        // An entity bound before has this event's identity: `fits` checked it.
        for (id, positions) in &self.identity_positions[source] {
            if pm.entities[*id].is_none() {
                pm.entities[*id] = Some(positions.iter().map(|&i| event.value(i)).collect());
            }
        }
        pm.events[source] = Some(event.clone());
        pm.last = event.ts;
        pm.step += 1;
    }

    /// After a step: schedule the match's next timer, or report it complete (`Some(time)`). An
    /// absence whose bound cannot be known yet (no interval learned) is not waited for: the
    /// match gets no timer and goes when it is judged ([`SequenceOperator::track`]).
    fn settle(&self, pm: &mut PartialMatch, key: &Key) -> Option<Millis> {
        let steps = self.steps();
        match steps.get(pm.step).map(|s| s.kind) {
            None => Some(pm.last),
            Some(StepKind::Absent(ms)) => {
                pm.due = Some(pm.last + ms as Millis);
                None
            }
            Some(StepKind::AbsentFor(i)) => {
                pm.due = self.bound(i, pm, key).map(|ms| pm.last.saturating_add(ms));
                None
            }
            Some(_) => {
                // A match that makes no progress for the idle time goes before `within` ends.
                let idle = (self.limits.idle_ms > 0).then(|| pm.last + self.limits.idle_ms);
                pm.due = match (self.within.map(|w| pm.start + w + 1), idle) {
                    (Some(w), Some(i)) => Some(w.min(i)),
                    (w, i) => w.or(i),
                };
                None
            }
        }
    }

    /// An absence bound of the `i`th expression for `pm` in partition `key`, in milliseconds.
    fn bound(&self, i: usize, pm: &PartialMatch, key: &Key) -> Option<Millis> {
        let bound = self.bounds.get(i)?;
        let cadence = self.cadence.get(key);
        let intervals = |q: f64| cadence.and_then(|c| c.quantile(q));
        let events: Vec<Option<&Event>> = pm.events.iter().map(|e| e.as_deref()).collect();
        let env = Env { intervals: Some(&intervals), ..Env::events(&self.plan.sources, &events, &self.regexes) };
        match super::eval::eval(bound, &env) {
            Value::Dur(ms) if ms > 0 => Some(ms),
            _ => None,
        }
    }

    fn track(&mut self, key: &Key, pm: PartialMatch) {
        // An absence that cannot be timed is not waited for.
        if pm.due.is_none() && self.steps().get(pm.step).is_some_and(|s| s.kind.is_absence()) {
            return;
        }
        while self.locate.len() >= self.limits.max_keys {
            self.evict_oldest("cap");
        }
        if let Some(due) = pm.due {
            self.timers.push(Reverse((due, pm.id)));
        }
        self.locate.insert(pm.id, key.clone());
        self.partitions.entry(key.clone()).or_default().matches.push(pm);
    }

    /// A complete match, judged by the alert condition. `last` is the event of the last step
    /// when it is not bound in `pm`: a completed match's prefix stays for more such events, and
    /// is not copied to make each one.
    fn complete(
        &mut self,
        key: &Key,
        pm: &PartialMatch,
        last: Option<(usize, &Arc<Event>)>,
        at: Millis,
        out: &mut Vec<Alert>,
    ) {
        let bound = |source: usize| match last {
            Some((s, e)) if s == source => Some(e.clone()),
            _ => pm.events[source].clone(),
        };
        let steps = &self.steps;
        let evidence = || {
            let mut out: Vec<Evidence> = pm.counted.iter().map(|e| Evidence::Event(e.clone())).collect();
            out.extend(
                steps
                    .iter()
                    .skip(usize::from(!pm.counted.is_empty()))
                    .filter_map(|s| bound(s.source))
                    .map(Evidence::Event),
            );
            let skip = out.len().saturating_sub(MAX_EVIDENCE);
            out.drain(..skip);
            out
        };
        let last = last.map(|(s, e)| (s, e.as_ref()));
        with_events(&pm.events, last, pm.events.len(), |events| {
            let env = Env::events(&self.plan.sources, events, &self.regexes);
            if holds(&self.plan.alert.condition, &env) {
                self.alerting.matched(key, at, &env, evidence, out);
            }
        })
    }
}

impl Operator for SequenceOperator {
    fn key_fields(&self, source: usize) -> Option<Vec<usize>> {
        // The partition key, when it is the shared entities' key fields ([`Self::partition_key`]).
        if !self.group_by[source].is_empty() || self.common.is_empty() {
            return None;
        }
        let identity = &self.identity_positions[source];
        let fields: Option<Vec<&Vec<usize>>> =
            self.common.iter().map(|id| identity.iter().find(|(i, _)| i == id).map(|(_, p)| p)).collect();
        fields.map(|f| f.into_iter().flatten().copied().collect())
    }

    fn on_event(&mut self, source: usize, event: &Arc<Event>, out: &mut Vec<Alert>) {
        if !self.identity_positions[source]
            .iter()
            .all(|(_, positions)| super::operator::binds_entities(positions, event))
        {
            return;
        }
        // The engine has checked the pattern's filter.
        let step = self.step_of[source];
        let kind = self.steps()[step].kind;
        let key = self.partition_key(source, event);
        // The partition's matches are taken out while they are judged and put back after.
        let matches = self.partitions.get_mut(&key).map(|part| std::mem::take(&mut part.matches));
        if let Some(matches) = matches {
            let mut kept = Vec::with_capacity(matches.len());
            for mut pm in matches {
                if pm.step != step {
                    kept.push(pm);
                    continue;
                }
                match kind {
                    StepKind::Absent(_) | StepKind::AbsentFor(_) => {
                        if !self.fits(&pm, source, event, &self.absent_conditions[step]) {
                            kept.push(pm);
                        } else {
                            self.locate.remove(&pm.id);
                        }
                    }
                    _ => {
                        let in_time = self.within.is_none_or(|w| event.ts - pm.start <= w);
                        let fits = in_time && self.fits(&pm, source, event, &self.bind_conditions[step]);
                        if fits && step + 1 == self.steps().len() {
                            // The last step: the match is complete, and its prefix stays ready
                            // for more such events until `within` passes (every later usage
                            // sample is checked against the same request).
                            self.complete(&key, &pm, Some((source, event)), event.ts, out);
                            kept.push(pm);
                        } else if fits {
                            // Not the last step, so the match goes on (it completes at the
                            // last step, above, or when an absence's deadline passes).
                            self.bind(&mut pm, source, event);
                            self.settle(&mut pm, &key);
                            if let Some(due) = pm.due {
                                self.timers.push(Reverse((due, pm.id)));
                                kept.push(pm);
                            } else if !self.steps()[pm.step].kind.is_absence() {
                                kept.push(pm);
                            } else {
                                // An absence that cannot be timed yet is not waited for.
                                self.locate.remove(&pm.id);
                            }
                        } else {
                            kept.push(pm);
                        }
                    }
                }
            }
            if let Some(part) = self.partitions.get_mut(&key) {
                part.matches = kept;
                if part.matches.is_empty() && part.counter.is_empty() {
                    self.partitions.remove(&key);
                }
            }
        }
        if step == 0 && self.learns_cadence {
            if self.cadence.len() >= self.limits.max_keys && !self.cadence.contains_key(&key) {
                self.forget_cadences("cap");
            }
            self.cadence.entry(key.clone()).or_default().note(event.ts);
        }
        if step == 0 {
            let mut completed = Vec::new();
            self.start(source, event, kind, &key, &mut completed);
            for (pm, at) in completed {
                self.complete(&key, &pm, None, at, out);
            }
        }
        self.blind.report(&self.plan.name, Lost::Absences, event.ts, out);
    }

    fn on_watermark(&mut self, watermark: Millis, out: &mut Vec<Alert>) {
        // Match timers and alert expiries interleave in time order, matches first on a tie.
        loop {
            let timer = self.timers.peek().map(|Reverse((due, _))| *due).filter(|d| *d <= watermark);
            let expiry = self.alerting.next_expiry().filter(|d| *d <= watermark);
            match (timer, expiry) {
                (None, None) => break,
                (Some(t), Some(e)) if e < t => self.alerting.expire(e, out),
                (Some(_), _) => self.fire_timer(out),
                (None, Some(e)) => self.alerting.expire(e, out),
            }
        }
        self.blind.report(&self.plan.name, Lost::Absences, watermark, out);
        self.blind.expire(watermark, out);
        if self.learns_cadence && watermark >= self.next_cadence_sweep {
            self.cadence.retain(|_, c| watermark - c.last < CADENCE_MEMORY_MS);
            self.next_cadence_sweep = watermark.saturating_add(3_600_000);
        }
        if self.next_sweep.is_some_and(|t| t <= watermark) {
            let within = self.within.unwrap_or(0);
            self.partitions.retain(|_, p| {
                while p.counter.front().is_some_and(|e| watermark - e.ts > within) {
                    p.counter.pop_front();
                }
                !p.matches.is_empty() || !p.counter.is_empty()
            });
            let any_counter = self.partitions.values().any(|p| !p.counter.is_empty());
            self.next_sweep = any_counter.then_some(watermark + within.max(1));
        }
    }

    fn next_deadline(&self) -> Option<Millis> {
        [
            self.timers.peek().map(|Reverse((due, _))| *due),
            self.alerting.next_expiry(),
            self.next_sweep,
            self.blind.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let bytes = postcard::to_stdvec(&(
            &self.partitions,
            &self.locate,
            &self.timers,
            self.next_id,
            self.next_sweep,
            self.alerting.snapshot(),
            &self.blind,
        ))?;
        let quiet = self.alerting.quiet_snapshot();
        if !self.learns_cadence && quiet.is_empty() {
            return Ok(bytes);
        }
        let cadence: Vec<(&Key, &Cadence)> = self.cadence.iter().collect();
        let held: Vec<(&Key, Millis)> = self.cadence.iter().filter_map(|(k, c)| Some((k, c.held?))).collect();
        let bytes = postcard::to_extend(&(cadence, quiet), bytes)?;
        if held.is_empty() {
            return Ok(bytes);
        }
        postcard::to_extend(&held, bytes)
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), postcard::Error> {
        let ((partitions, locate, timers, next_id, next_sweep, alerting, blind), rest): (SequenceState, &[u8]) =
            postcard::take_from_bytes(state)?;
        let ((cadence, quiet), rest): (SequenceExtension, &[u8]) =
            if rest.is_empty() { (Default::default(), rest) } else { postcard::take_from_bytes(rest)? };
        let held: HeldWaits = if rest.is_empty() { Vec::new() } else { postcard::from_bytes(rest)? };
        self.cadence = cadence.into_iter().collect();
        for (key, wait) in held {
            if let Some(c) = self.cadence.get_mut(&key) {
                c.held = Some(wait);
            }
        }
        self.alerting.restore_quiet(quiet);
        self.blind = blind;
        self.partitions = partitions;
        self.locate = locate;
        self.timers = timers;
        self.next_id = next_id;
        self.next_sweep = next_sweep;
        self.alerting.restore(alerting);
        Ok(())
    }

    fn evicted(&self) -> Vec<(String, &'static str, u64)> {
        let name = &self.plan.name;
        vec![
            (name.clone(), "cap", self.evicted_cap),
            (name.clone(), "idle", self.evicted_idle),
            (name.clone(), "memory", self.evicted_memory),
        ]
    }

    fn state_bytes(&self) -> usize {
        // Each partial match: its record, its slots, and the events it holds (shared with
        // the engine only while they are fresh); each partition its key and map entry.
        let sources = self.plan.sources.len();
        let event = super::operator::event_bytes(self.plan.sources[0].stream);
        let per_match = std::mem::size_of::<PartialMatch>() + sources * (8 + event) + 64;
        let counted: usize = self.partitions.values().map(|p| p.counter.len()).sum();
        self.cadence.len() * (std::mem::size_of::<(Key, Cadence)>() + 2 * CADENCE_GAPS * 8 + 64)
            + self.locate.len() * (per_match + 48)
            + self.partitions.len() * (std::mem::size_of::<(Key, Partition)>() + 64)
            + counted * (event + 8)
            + self.alerting.state_bytes()
    }

    fn shrink(&mut self, now: Millis, out: &mut Vec<Alert>) -> bool {
        if !self.locate.is_empty() {
            for _ in 0..(self.locate.len() / 16).max(1) {
                self.evict_oldest("memory");
            }
        } else if !self.cadence.is_empty() {
            self.forget_cadences("memory");
        } else {
            return false;
        }
        self.blind.report(&self.plan.name, Lost::Absences, now, out);
        true
    }

    fn live_keys(&self) -> Vec<(String, usize)> {
        let matches: usize =
            self.partitions.values().map(|p| p.matches.len() + usize::from(!p.counter.is_empty())).sum();
        vec![(self.plan.name.clone(), matches + self.alerting.active())]
    }
}

impl SequenceOperator {
    /// Handles the earliest due timer: an absence that held, or a `within` bound that passed.
    fn fire_timer(&mut self, out: &mut Vec<Alert>) {
        let Some(Reverse((due, id))) = self.timers.pop() else { return };
        let Some(key) = self.locate.get(&id).cloned() else { return };
        let Some(part) = self.partitions.get_mut(&key) else { return };
        let Some(pos) = part.matches.iter().position(|m| m.id == id && m.due == Some(due)) else { return };
        let mut pm = part.matches.swap_remove(pos);
        self.locate.remove(&id);
        if self.steps()[pm.step].kind.is_absence() {
            // The wait is over with no fitting event: the absence holds.
            if let Some(c) = self.cadence.get_mut(&key) {
                c.held = Some(due - pm.last);
            }
            pm.last = due;
            pm.step += 1;
            match self.settle(&mut pm, &key) {
                Some(at) => self.complete(&key, &pm, None, at, out),
                None => self.track(&key, pm),
            }
        } else if self.within.is_none_or(|w| due < pm.start + w + 1) {
            // No progress for the idle time: the match is dropped, and counted.
            self.evicted_idle += 1;
        }
        // Otherwise the `within` bound passed before the next step came: the match is dropped.
        if self.partitions.get(&key).is_some_and(|p| p.matches.is_empty() && p.counter.is_empty()) {
            self.partitions.remove(&key);
        }
    }

    /// Forgets the cadences of the sixteenth of partitions heard from longest ago: until they
    /// show a gap again, their absences are not waited for, so the rule is partly blind.
    fn forget_cadences(&mut self, reason: &'static str) {
        let n = (self.cadence.len() / 16).max(1);
        let mut lasts: Vec<Millis> = self.cadence.values().map(|c| c.last).collect();
        let cutoff = *lasts.select_nth_unstable(n - 1).1;
        let mut left = n;
        self.cadence.retain(|_, c| {
            let forget = left > 0 && c.last <= cutoff;
            left -= usize::from(forget);
            !forget
        });
        self.count_evicted(reason, n as u64);
        for _ in 0..n {
            self.blind.dropped(reason);
        }
    }

    /// Counts evictions by their reason (`memory`, or the key cap).
    fn count_evicted(&mut self, reason: &'static str, n: u64) {
        *if reason == "memory" { &mut self.evicted_memory } else { &mut self.evicted_cap } += n;
    }

    /// Drops the partial match that started first, to stay under the cap (or the state
    /// budget). A match waiting on an absence goes blind: noted for the self-alert.
    fn evict_oldest(&mut self, reason: &'static str) {
        let Some((id, key)) = self.locate.pop_first() else { return };
        self.count_evicted(reason, 1);
        let steps = &self.steps;
        if let Some(part) = self.partitions.get_mut(&key) {
            if let Some(pos) = part.matches.iter().position(|m| m.id == id) {
                let pm = part.matches.swap_remove(pos);
                if steps.get(pm.step).is_some_and(|s| s.kind.is_absence()) {
                    self.blind.dropped(reason);
                }
            }
            if part.matches.is_empty() && part.counter.is_empty() {
                self.partitions.remove(&key);
            }
        }
    }

    /// An event of the first step starts a match, or counts towards one.
    fn start(
        &mut self,
        source: usize,
        event: &Arc<Event>,
        kind: StepKind,
        key: &Key,
        completed: &mut Vec<(PartialMatch, Millis)>,
    ) {
        let fresh = self.new_match(event.ts);
        if !self.fits(&fresh, source, event, &self.bind_conditions[0]) {
            return;
        }
        match kind {
            StepKind::Count { min } => {
                let within = self.within.unwrap_or(0);
                let part = self.partitions.entry(key.clone()).or_default();
                part.counter.push_back(event.clone());
                while part.counter.front().is_some_and(|e| event.ts - e.ts > within) {
                    part.counter.pop_front();
                }
                if (part.counter.len() as u64) < min {
                    if self.next_sweep.is_none() {
                        self.next_sweep = Some(event.ts + within.max(1));
                    }
                    return;
                }
                let waiting = part.matches.iter().any(|m| m.step == 1);
                let counted: Vec<Arc<Event>> = part.counter.iter().cloned().collect();
                if self.next_sweep.is_none() {
                    self.next_sweep = Some(event.ts + within.max(1));
                }
                if waiting {
                    return;
                }
                let mut pm = fresh;
                pm.start = counted[0].ts;
                pm.counted = counted;
                self.bind(&mut pm, source, event);
                match self.settle(&mut pm, key) {
                    Some(at) => completed.push((pm, at)),
                    None => self.track(key, pm),
                }
            }
            _ => {
                let mut pm = fresh;
                self.bind(&mut pm, source, event);
                match self.settle(&mut pm, key) {
                    Some(at) => completed.push((pm, at)),
                    None => self.track(key, pm),
                }
            }
        }
    }
}
