//! Building a window operator: which rules share one windowed state, and the operator that
//! runs it, each aggregate's argument and filter and each group key's positions read once.

use super::*;

/// What makes two rules' windowed states the same computation: the pattern and its filter,
/// the window, the aggregates and the grouping (not the history kept, which the operator
/// takes as the longest of its rules'). A structural hash, as [`RulePlan::state_id`] is.
pub fn shared_state(plan: &RulePlan, windowed: &WindowedPlan) -> String {
    #[derive(serde::Serialize)]
    struct Shared<'a> {
        stream: vigil_lang::schema::Stream,
        event_type: Option<&'static str>,
        subject: &'a str,
        object: Option<&'a str>,
        filter: &'a Option<vigil_lang::plan::TExpr>,
        window: &'a WindowPlan,
        fields: Vec<(&'a str, vigil_lang::plan::AggFunc, &'a Option<vigil_lang::plan::TExpr>)>,
        group_by: &'a [GroupKey],
    }
    let src = &plan.sources[0];
    let state = &windowed.state;
    vigil_lang::plan::structural_hash(&Shared {
        stream: src.stream,
        event_type: src.event_type,
        subject: &src.subject.1,
        object: src.object.as_ref().map(|o| o.1.as_str()),
        filter: &src.filter,
        window: &windowed.window,
        fields: state.fields.iter().map(|f| (f.name.as_str(), f.agg, &f.arg)).collect(),
        group_by: &state.group_by,
    })
}

/// Collects the rules that share one windowed state before building the operator.
pub struct WindowOperatorBuilder {
    plans: Vec<Arc<RulePlan>>,
    /// The first rule's window and state, which every rule added shares.
    windowed: WindowedPlan,
    regexes: Arc<RegexCache>,
}

impl WindowOperatorBuilder {
    pub fn new(plan: Arc<RulePlan>, windowed: &WindowedPlan, regexes: Arc<RegexCache>) -> Self {
        WindowOperatorBuilder { plans: vec![plan], windowed: windowed.clone(), regexes }
    }

    pub fn add(&mut self, plan: Arc<RulePlan>) {
        self.plans.push(plan);
    }

    pub fn plans(&self) -> &[Arc<RulePlan>] {
        &self.plans
    }

    /// Whether the operator can be split in two stages ([`Stage`]).
    pub fn splittable(&self) -> bool {
        WindowOperator::splittable(&self.plans, &self.windowed.state)
    }

    /// The operator's state identity: what its checkpointed state is kept under.
    pub fn id(&self) -> vigil_lang::plan::StateId {
        let ids: Vec<vigil_lang::plan::StateId> = self.plans.iter().map(|p| p.state_id()).collect();
        vigil_lang::plan::StateId(vigil_lang::plan::structural_hash(&ids))
    }

    pub fn build(self, limits: crate::engine::config::Limits) -> WindowOperator {
        self.build_stage(limits, Stage::Whole)
    }

    /// The operator for one stage of a rule split in two ([`Stage`]).
    pub fn build_stage(self, limits: crate::engine::config::Limits, stage: Stage) -> WindowOperator {
        let peers_by_key = stages::peers_by_key(&self.plans, &self.windowed.state, &self.plans[0].sources[0]);
        let first = self.plans[0].clone();
        let WindowedPlan { window, state } = self.windowed;
        let history = self.plans.iter().filter_map(|p| p.model.windowed()).map(|w| w.state.history).max().unwrap_or(1);
        let key_names = state.key_names();
        // A group's scorers have learned its past: they are kept through a week of quiet (a
        // series that reports daily stays known), or the idle timeout, whichever is shorter.
        let scored = (SCORED_MEMORY_MS as u64).div_ceil(window.slide_ms) as usize;
        let remember = self
            .plans
            .iter()
            .map(|p| match (p.model.invariant(), p.model.scores()) {
                (Some(i), _) => i.training_windows as usize,
                (None, Some(_)) => scored,
                (None, None) => 0,
            })
            .max()
            .unwrap_or(0)
            .max(history);
        let dependents: Vec<Dependent> = self
            .plans
            .into_iter()
            .map(|plan| Dependent {
                alerting: Alerting::new(plan.clone(), key_names.clone()),
                scores: plan.model.scores().cloned(),
                test: plan.model.invariant().is_none().then(|| NumberTest::of_window(&plan.alert.condition)).flatten(),
                blind: BlindSpot::default(),
                trace: None,
                plan,
            })
            .collect();
        let args = field_args(&state);
        // After this many closes in a row with no events in any group, more such closes change
        // nothing but how long each group has been idle: every history holds only empty
        // windows, and every alert has had its `for` and `keep_firing_for` to settle. (Quiet
        // windows teach an invariant nothing, and the cluster step sees no group.)
        let lifecycle = dependents
            .iter()
            .map(|d| d.plan.alert.for_ms.max(d.plan.alert.keep_firing_for_ms).div_ceil(window.slide_ms))
            .max()
            .unwrap_or(0);
        let settle_closes = u32::try_from((history as u64).max(lifecycle) + 2).unwrap_or(u32::MAX);
        let group_entities = group_entity_positions(&state, &first.sources[0]);
        // A group keyed by every entity key of its events holds one series: the aggregates kept
        // per series need not hash it (`rate` over `group by s`).
        let groups_by_series = crate::engine::operator::entity_key_positions(&first.sources[0])
            .iter()
            .all(|(_, p)| group_entities.iter().flatten().any(|q| q == p));
        WindowOperator {
            stage,
            peers_by_key,
            summaries: Vec::new(),
            pending: Pending::default(),
            quiet_closes: 0,
            settle_closes,
            empty: state.fields.iter().map(|f| Acc::new(f.agg, f.arg.is_some())).collect(),
            evaluates_args: state.fields.iter().zip(&args).any(|(f, (field, _))| f.arg.is_some() && field.is_none()),
            args,
            filters: state.fields.iter().map(|f| f.filter.clone()).collect(),
            has_filters: state.fields.iter().any(|f| f.filter.is_some()),
            left_out: vec![false; state.fields.len()],
            per_series: state.fields.iter().any(|f| f.agg.per_series()) && !groups_by_series,
            rolled_up_by: rolled_up_by(&dependents, &key_names),
            has_invariant: dependents.iter().any(|d: &Dependent| d.plan.model.invariant().is_some()),
            has_scores: dependents.iter().any(|d: &Dependent| d.scores.is_some()),
            rebuild: rebuild_positions(&state, &first.sources[0]),
            key_positions: crate::engine::operator::entity_key_positions(&first.sources[0])
                .into_iter()
                .map(|(_, i)| i)
                .collect(),
            group_entities,
            source: first.sources.clone(),
            field_names: state.fields.iter().map(|f| f.name.clone()).collect(),
            state,
            size: window.size_ms as Millis,
            slide: window.slide_ms as Millis,
            history,
            remember,
            groups: KeyMap::default(),
            scores_bytes: 0,
            snapshot_room: Default::default(),
            next_close: None,
            dependents,
            regexes: self.regexes,
            max_keys: limits.max_keys,
            idle_ms: limits.idle_ms,
            key_len: key_names.len(),
            evicted: 0,
            evicted_idle: 0,
            evicted_memory: 0,
        }
    }
}

/// By aggregate: the position of the event field that is its whole argument, read in place, or
/// none when the argument is evaluated (the value beside it is where it is kept).
fn field_args(state: &StatePlan) -> Vec<(Option<usize>, Value)> {
    state
        .fields
        .iter()
        .map(|f| match f.arg.as_ref().map(|a| &a.kind) {
            Some(TExprKind::EventField { source: 0, index, .. } | TExprKind::EntityField { source: 0, index, .. })
                if *index != crate::event::TS_INDEX =>
            {
                (Some(*index), Value::Null)
            }
            _ => (None, Value::Null),
        })
        .collect()
}

/// By group key: where an entity key's attributes are in the events (empty for a value).
fn group_entity_positions(state: &StatePlan, source: &vigil_lang::plan::SourcePlan) -> Vec<Vec<usize>> {
    state
        .group_by
        .iter()
        .map(|k| match k {
            GroupKey::Entity { var, .. } => source.key_positions(var),
            GroupKey::Value(_) => Vec::new(),
        })
        .collect()
}

/// Where in the key the rules' roll-up field is, when some roll their alerts up and all of those
/// by the same field.
fn rolled_up_by(dependents: &[Dependent], key_names: &[String]) -> Option<usize> {
    let mut fields = dependents.iter().filter_map(|d| d.plan.alert.rollup.as_ref().map(|r| r.by.as_str()));
    let first = fields.next()?;
    if fields.any(|f| f != first) {
        return None;
    }
    key_names.iter().rposition(|n| n == first)
}
