//! The physical plan: what the engine builds from a rule set. Operators (one per single-event
//! or sequence rule, one per group of windowed rules that compute the same state), the pattern
//! filters they share, the routing indexes that send an event only where it can matter, and the
//! gate that refuses events no rule takes before they are built. `vigil explain --physical`
//! prints it.

use super::config::Limits;
use super::eval::RegexCache;
use super::operator::Operator;
use super::routing::{required_for, Gate, SharedFilter, StreamRoutes, Target};
use super::{filter, sequence, window};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use vigil_lang::plan::{structural_hash, ModelPlan, RulePlan, StateId};
use vigil_lang::schema::Stream;

/// What one operator serves: its rules, and the identity of the state it keeps.
#[derive(Clone)]
pub struct Served {
    pub plans: Vec<Arc<RulePlan>>,
    /// The operator's rules' [`StateId`]s together: what its checkpointed state is kept under,
    /// and what a reload matches it by.
    pub id: StateId,
    pub kind: OperatorKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorKind {
    Filter,
    Sequence,
    Window,
}

/// The layout the engine runs: everything of the physical plan but the operators' state.
pub struct Layout {
    /// By operator.
    pub served: Vec<Served>,
    /// By [`Stream::index`], up to the last stream a rule reads.
    pub routes: Vec<StreamRoutes>,
    pub filters: Vec<SharedFilter>,
    pub gate: Gate,
}

/// The windowed rules of `plans`, one builder per state: rules whose windowed state is the same
/// computation share one operator (SAQL's master-dependent scheme). With `two_stage`, rules
/// with a cluster step share only with each other, so that their operator can be split in two
/// ([`super::stage_two`]).
pub fn window_builders(
    plans: &[Arc<RulePlan>],
    two_stage: bool,
    regexes: &Arc<RegexCache>,
) -> Vec<window::WindowOperatorBuilder> {
    let mut shared: HashMap<String, usize> = HashMap::new();
    let mut windows: Vec<window::WindowOperatorBuilder> = Vec::new();
    for plan in plans {
        let Some(w) = plan.model.windowed() else { continue };
        let mut state = window::shared_state(plan, w);
        if two_stage && plan.model.cluster().is_some() {
            state.push_str(" cluster");
        }
        match shared.get(&state) {
            Some(&i) => windows[i].add(plan.clone()),
            None => {
                shared.insert(state, windows.len());
                windows.push(window::WindowOperatorBuilder::new(plan.clone(), w, regexes.clone()));
            }
        }
    }
    windows
}

/// Builds the operators and the layout for `plans`. Rules whose windowed state is the same
/// computation share one operator ([`window_builders`]); with `two_stage`, the operators of
/// rules with a cluster step that can be split in two are their stage one.
pub fn build(
    plans: &[Arc<RulePlan>],
    limits: Limits,
    regexes: &Arc<RegexCache>,
    two_stage: bool,
) -> (Vec<Box<dyn Operator>>, Layout) {
    let mut operators: Vec<Box<dyn Operator>> = Vec::new();
    let mut served: Vec<Served> = Vec::new();
    let mut routes: Vec<StreamRoutes> = Vec::new();
    let mut filters: Vec<SharedFilter> = Vec::new();
    let mut filter_ids: HashMap<String, usize> = HashMap::new();
    let mut filter_of = |plan: &Arc<RulePlan>, source: usize| -> Option<usize> {
        let src = &plan.sources[source];
        let key = structural_hash(&(src.filter.as_ref()?, source, src.stream, src.event_type));
        Some(*filter_ids.entry(key).or_insert_with(|| {
            filters.push(SharedFilter::new(plan.clone(), source));
            filters.len() - 1
        }))
    };
    for plan in plans {
        let (op, kind): (Box<dyn Operator>, OperatorKind) = match &plan.model {
            ModelPlan::SingleEvent => {
                (Box::new(filter::FilterOperator::new(plan.clone(), regexes.clone())), OperatorKind::Filter)
            }
            ModelPlan::Sequence(seq) => (
                Box::new(sequence::SequenceOperator::new(plan.clone(), seq, regexes.clone(), limits)),
                OperatorKind::Sequence,
            ),
            ModelPlan::TimeSeries(..) | ModelPlan::Invariant(..) | ModelPlan::Outlier(..) | ModelPlan::Scored(..) => {
                continue
            }
        };
        let index = operators.len();
        operators.push(op);
        served.push(Served { plans: vec![plan.clone()], id: plan.state_id(), kind });
        for (i, src) in plan.sources.iter().enumerate() {
            let target = Target { op: index, source: i, filter: filter_of(plan, i) };
            routes_of(&mut routes, src.stream).add(src, required_for(plan, i), target);
        }
    }
    for builder in window_builders(plans, two_stage, regexes) {
        let index = operators.len();
        let first = builder.plans()[0].clone();
        let target = Target { op: index, source: 0, filter: filter_of(&first, 0) };
        routes_of(&mut routes, first.sources[0].stream).add(&first.sources[0], required_for(&first, 0), target);
        served.push(Served { plans: builder.plans().to_vec(), id: builder.id(), kind: OperatorKind::Window });
        let stage = if two_stage && builder.splittable() { window::Stage::Summarise } else { window::Stage::Whole };
        operators.push(Box::new(builder.build_stage(limits, stage)));
    }
    let gate = Gate::new(&routes, &filters);
    (operators, Layout { served, routes, filters, gate })
}

/// The routes of `stream`, the table grown to hold them.
fn routes_of(routes: &mut Vec<StreamRoutes>, stream: Stream) -> &mut StreamRoutes {
    if routes.len() <= stream.index() {
        routes.resize_with(stream.index() + 1, StreamRoutes::default);
    }
    &mut routes[stream.index()]
}

impl Layout {
    /// The streams some rule reads, in the order of their ids.
    fn streams(&self) -> impl Iterator<Item = Stream> + '_ {
        self.served
            .iter()
            .flat_map(|s| s.plans.iter().flat_map(|p| p.sources.iter().map(|src| src.stream)))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "operators")?;
        for (i, s) in self.served.iter().enumerate() {
            let names: Vec<&str> = s.plans.iter().map(|p| p.name.as_str()).collect();
            let kind = match s.kind {
                OperatorKind::Filter => "filter",
                OperatorKind::Sequence => "sequence",
                OperatorKind::Window if names.len() > 1 => "window (shared state)",
                OperatorKind::Window => "window",
            };
            writeln!(f, "  #{i} {kind}: {}", names.join(", "))?;
            writeln!(f, "     state {}", &s.id.0[..16])?;
        }
        if !self.filters.is_empty() {
            writeln!(f, "shared filters (each evaluated once per event)")?;
            for (i, filter) in self.filters.iter().enumerate() {
                writeln!(f, "  f{i}: {}", filter.describe())?;
            }
        }
        writeln!(f, "routing")?;
        for stream in self.streams() {
            let Some(r) = self.routes.get(stream.index()).filter(|r| !r.is_empty()) else { continue };
            writeln!(f, "  {}", stream.name())?;
            describe(r, f, &self.served)?;
        }
        writeln!(f, "gate")?;
        for stream in self.streams() {
            match self.gate.tests(stream) {
                Some(0) => writeln!(f, "  {}: no rule reads it; every event only moves time", stream.name())?,
                Some(n) => writeln!(
                    f,
                    "  {}: judged from its numbers ({n} filter{}); an event no filter passes is not built",
                    stream.name(),
                    if n == 1 { "" } else { "s" }
                )?,
                None => writeln!(f, "  {}: every event is built", stream.name())?,
            }
        }
        Ok(())
    }
}

/// A stream's routes as `vigil explain --physical` prints them.
fn describe(r: &StreamRoutes, f: &mut fmt::Formatter<'_>, served: &[Served]) -> fmt::Result {
    let target = |t: &Target| {
        let rules: Vec<&str> = served[t.op].plans.iter().map(|p| p.name.as_str()).collect();
        let filter = t.filter.map(|i| format!(" after f{i}")).unwrap_or_default();
        format!("#{} ({}){filter}", t.op, rules.join(", "))
    };
    let list = |targets: &mut dyn Iterator<Item = &Target>| targets.map(target).collect::<Vec<_>>().join("; ");
    if !r.any.is_empty() {
        writeln!(f, "    every event -> {}", list(&mut r.any.iter()))?;
    }
    let mut types: Vec<_> = r.by_type.iter().collect();
    types.sort_by(|a, b| a.0.cmp(b.0));
    for (t, targets) in types {
        writeln!(f, "    type {t} -> {}", list(&mut targets.iter()))?;
    }
    for (field, index) in &r.by_value {
        writeln!(f, "    indexed by field #{field}, {} values", index.len())?;
        let mut values: Vec<_> = index.iter().collect();
        values.sort_by(|a, b| a.0.cmp(b.0));
        for (value, targets) in values.iter().take(10) {
            writeln!(f, "      {value:?} -> {}", list(&mut targets.iter().map(|(t, _)| t)))?;
        }
        if values.len() > 10 {
            writeln!(f, "      ... {} more values", values.len() - 10)?;
        }
    }
    Ok(())
}
