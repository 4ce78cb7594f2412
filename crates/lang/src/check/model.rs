//! The clauses of each model: the window, the sequence, how models may mix, and what an
//! alert carries (its condition, labels, annotations and returned values).

use super::*;

impl RuleChecker<'_> {
    pub(super) fn window(&mut self) -> Option<WindowPlan> {
        let windows: Vec<&WindowSpec> = self.rule.patterns.iter().filter_map(|p| p.window.as_ref()).collect();
        let w = *windows.first()?;
        for extra in &windows[1..] {
            self.error(
                Diagnostic::new(
                    codes::MODEL_MIX,
                    "only one pattern of a rule may have a window",
                    extra.span,
                    "second window",
                )
                .with_secondary(w.span, "first window"),
            );
        }
        if w.size.millis == 0 {
            self.error(Diagnostic::new(
                codes::DURATION_RANGE,
                "a window must be longer than zero",
                w.size.span,
                "zero length",
            ));
            return None;
        }
        let slide = w.slide.map_or(w.size.millis, |s| s.millis);
        if let Some(s) = w.slide {
            if s.millis == 0 {
                self.error(Diagnostic::new(
                    codes::DURATION_RANGE,
                    "a window must slide by more than zero",
                    s.span,
                    "zero slide",
                ));
                return None;
            }
            if s.millis > w.size.millis {
                self.error(
                    Diagnostic::new(
                        codes::WINDOW,
                        "a window cannot slide further than its length",
                        s.span,
                        "longer than the window",
                    )
                    .with_note("events between two windows would belong to none"),
                );
                return None;
            }
            if w.size.millis % s.millis != 0 {
                self.error(
                    Diagnostic::new(
                        codes::WINDOW,
                        "a window's length must be a whole number of slides",
                        w.span,
                        "length is not a multiple of the slide",
                    )
                    .with_help(format!(
                        "use a slide that divides {}, e.g. `#time({}, {})`",
                        format_duration(w.size.millis),
                        format_duration(w.size.millis),
                        format_duration(gcd(w.size.millis, s.millis))
                    )),
                );
                return None;
            }
        }
        Some(WindowPlan { size_ms: w.size.millis, slide_ms: slide })
    }

    /// What one group of a windowed rule costs: one event updates every window open at its
    /// time, and a group keeps those windows and its history, a value per field each.
    pub(super) fn state_cost(&mut self, w: &WindowPlan, st: &StatePlan) {
        let Some(spec) = self.rule.patterns.iter().find_map(|p| p.window.as_ref()) else { return };
        let open = w.size_ms / w.slide_ms;
        if open > MAX_OPEN_WINDOWS {
            self.error(
                Diagnostic::new(
                    codes::COST,
                    format!("each event would update {open} windows; at most {MAX_OPEN_WINDOWS} are allowed"),
                    spec.span,
                    "too many windows open at once",
                )
                .with_note("a sliding window keeps length/slide windows open per group, and every event updates each")
                .with_help(format!(
                    "slide further, e.g. `#time({}, {})`, or use a shorter window",
                    format_duration(w.size_ms),
                    format_duration(coarser_slide(w.size_ms))
                )),
            );
            return;
        }
        let values = (open + st.history as u64).saturating_mul(st.fields.len().max(1) as u64);
        if values > MAX_GROUP_VALUES {
            let span = self.rule.state.as_ref().map_or(spec.span, |s| s.history.map_or(s.name.span, |(_, at)| at));
            self.error(
                Diagnostic::new(
                    codes::COST,
                    format!("each group would keep {values} values; at most {MAX_GROUP_VALUES} are allowed"),
                    span,
                    "too much state per group",
                )
                .with_note(format!(
                    "a group keeps {open} open window(s) and {} past one(s), {} field(s) each; with many groups \
                     this is memory the service runs out of",
                    st.history,
                    st.fields.len()
                ))
                .with_help("keep fewer windows in `state[k]`, or fewer fields"),
            );
        }
    }

    pub(super) fn sequence(&mut self) -> Option<SequencePlan> {
        let r = self.rule;
        let Some(w) = &r.with else {
            if r.patterns.len() > 1 {
                self.error(
                    Diagnostic::new(
                        codes::SEQUENCE_SHAPE,
                        format!("{} patterns but no `with` clause relating them", r.patterns.len()),
                        r.patterns[1].span,
                        "second pattern",
                    )
                    .with_help(format!(
                        "say how the events follow each other, e.g. `with {} -> {} within 10 min`",
                        r.patterns[0].event.name, r.patterns[1].event.name
                    )),
                );
            }
            return None;
        };
        let (steps, bounds) = self.sequence_steps(w);
        self.sequence_bounds(w, &steps);
        let all: Vec<usize> = (0..self.sources.len()).collect();
        let scope = Scope {
            place: "the `with` clause",
            vars: Vars::Sources(&all),
            state: false,
            baselines: false,
            cluster: false,
            scores: false,
            special: Special::None,
        };
        let group_by = w.group_by.iter().map(|e| self.scalar(e, &scope)).collect();
        let conditions = w.conditions.iter().map(|c| self.condition(c, &scope)).collect();
        let mut joins: Vec<(String, EntityKind, Vec<usize>)> = self
            .entity_order
            .iter()
            .filter_map(|name| {
                let info = &self.entities[name];
                let mut srcs: Vec<usize> = info.bindings.iter().map(|(s, _)| *s).collect();
                srcs.dedup();
                (srcs.len() > 1).then(|| (name.clone(), info.kind, srcs))
            })
            .collect();
        joins.sort_by_key(|(_, _, s)| s[0]);
        Some(SequencePlan { steps, within_ms: w.within.map(|d| d.millis), joins, group_by, conditions, bounds })
    }

    /// The steps of `with`, each checked: a known event, once, an absence not first, a count
    /// only first; and every pattern sequenced. With them, the absence bounds that are
    /// expressions.
    fn sequence_steps(&mut self, w: &WithClause) -> (Vec<StepPlan>, Vec<TExpr>) {
        let r = self.rule;
        let mut steps = Vec::new();
        let mut bounds = Vec::new();
        let mut used: HashMap<&str, Span> = HashMap::new();
        for (i, step) in w.steps.iter().enumerate() {
            let Some(info) = self.events.get(&step.event.name) else {
                let names: Vec<&str> = r.patterns.iter().map(|p| p.event.name.as_str()).collect();
                self.error(
                    Diagnostic::new(
                        codes::UNKNOWN_NAME,
                        format!("no pattern binds an event `{}`", step.event.name),
                        step.event.span,
                        "unknown event",
                    )
                    .with_help(suggestion(&step.event.name, &names)),
                );
                continue;
            };
            let source = info.source;
            if let Some(first) = used.insert(&step.event.name, step.event.span) {
                self.error(
                    twice(format!("`{}` appears twice in the sequence", step.event.name), step.event.span, first)
                        .with_help("to match the same kind of event twice, write two patterns with different names"),
                );
            }
            match &step.kind {
                kind if i == 0 && kind.is_absence() => {
                    let start = w.steps.iter().find(|s| !s.kind.is_absence()).map_or("e0", |s| s.event.name.as_str());
                    let bound = match kind {
                        ast::StepKind::Absent(d) => format_duration(d.millis),
                        _ => "10 min".to_string(),
                    };
                    self.error(
                        Diagnostic::new(
                            codes::SEQUENCE_SHAPE,
                            "a sequence cannot start with an absence",
                            step.span,
                            "nothing before it",
                        )
                        .with_note("an absence is measured from the step before it")
                        .with_help(format!(
                            "put the event that starts the wait first: `with {start} -> not {} for {bound}`",
                            step.event.name,
                        )),
                    )
                }
                ast::StepKind::Absent(d) if d.millis == 0 => self.error(Diagnostic::new(
                    codes::DURATION_RANGE,
                    "an absence must last longer than zero",
                    d.span,
                    "zero length",
                )),
                ast::StepKind::Count { min } => {
                    let min = *min;
                    if min == 0 || min > MAX_COUNT {
                        self.error(
                            Diagnostic::new(
                                codes::SEQUENCE_SHAPE,
                                "invalid repetition count",
                                step.span,
                                "count out of range",
                            )
                            .with_help(format!("write `e{{n,}}` with 1 <= n <= {MAX_COUNT}")),
                        )
                    }
                    if i > 0 {
                        self.error(
                            Diagnostic::new(
                                codes::SEQUENCE_SHAPE,
                                "only the first step of a sequence can be counted",
                                step.span,
                                "counted later in the sequence",
                            )
                            .with_note("a count starts a match: `with e1{5,} -> e2 within 1 h`"),
                        )
                    }
                }
                _ => {}
            }
            let kind = match &step.kind {
                ast::StepKind::Once => plan::StepKind::Once,
                ast::StepKind::Count { min } => plan::StepKind::Count { min: *min },
                ast::StepKind::Absent(d) => plan::StepKind::Absent(d.millis),
                ast::StepKind::AbsentFor(e) => {
                    bounds.push(self.absence_bound(w, e));
                    plan::StepKind::AbsentFor(bounds.len() - 1)
                }
            };
            steps.push(StepPlan { source, kind });
        }
        self.unsequenced(&used);
        (steps, bounds)
    }

    /// An absence's bound that is an expression: a duration, which may read the usual interval
    /// between the first step's events.
    fn absence_bound(&mut self, w: &WithClause, e: &Expr) -> TExpr {
        let first = w.steps.first().and_then(|s| self.events.get(&s.event.name)).map_or(0, |i| i.source);
        let scope = Scope {
            place: "an absence's bound",
            vars: Vars::Sources(&[]),
            state: false,
            baselines: false,
            cluster: false,
            scores: false,
            special: Special::Interval(first),
        };
        let bound = self.expr(e, &scope);
        self.require(bound.ty, &[Type::Duration], e.span, "an absence lasts a duration");
        bound
    }

    /// Reports patterns bound but not in the sequence.
    fn unsequenced(&mut self, used: &HashMap<&str, Span>) {
        let r = self.rule;
        for p in &r.patterns {
            if !used.contains_key(p.event.name.as_str()) && self.events.contains_key(&p.event.name) {
                self.error(
                    Diagnostic::new(
                        codes::SEQUENCE_SHAPE,
                        format!("event `{}` is not in the `with` sequence", p.event.name),
                        p.event.span,
                        "bound here but never sequenced",
                    )
                    .with_help("add it to the sequence or remove the pattern"),
                );
            }
        }
    }

    /// Reports a sequence without the bound it needs, or too short to be one.
    fn sequence_bounds(&mut self, w: &WithClause, steps: &[StepPlan]) {
        let positive = steps.iter().filter(|s| !s.kind.is_absence()).count();
        let counted = steps.iter().any(|s| matches!(s.kind, plan::StepKind::Count { .. }));
        if (positive > 1 || counted) && w.within.is_none() {
            self.error(
                Diagnostic::new(
                    codes::UNBOUNDED_SEQUENCE,
                    "this sequence has no time bound",
                    w.span,
                    "add `within` here",
                )
                .with_note("without a bound, partial matches would be kept forever")
                .with_help("bound the whole match, e.g. `with e1 -> e2 within 10 min`"),
            );
        }
        if let Some(d) = w.within {
            if d.millis == 0 {
                self.error(Diagnostic::new(
                    codes::DURATION_RANGE,
                    "`within` must be longer than zero",
                    d.span,
                    "zero length",
                ));
            }
        }
        if steps.len() == 1 && matches!(steps[0].kind, plan::StepKind::Once) {
            self.error(
                Diagnostic::new(codes::SEQUENCE_SHAPE, "a `with` clause needs two steps or a count", w.span, "only one event")
                    .with_help("relate two events (`e1 -> e2`), count one (`e{5,}`) or wait for an absence (`e1 -> not e2 for 1 h`)"),
            );
        }
    }

    /// Reports combinations of models a rule cannot have.
    pub(super) fn mixing_checks(&mut self, windowed: bool, sequenced: bool) {
        let r = self.rule;
        if windowed && r.patterns.len() > 1 {
            let span = r.patterns.iter().find_map(|p| p.window.as_ref()).map(|w| w.span).unwrap_or(r.name.span);
            self.error(
                Diagnostic::new(
                    codes::MODEL_MIX,
                    "a window aggregates a single pattern",
                    span,
                    "window in a multi-pattern rule",
                )
                .with_help("bound sequences with `within`; count repeated events with `e{n,}`"),
            );
        }
        if let (Some(state), false) = (&r.state, windowed) {
            self.error(
                Diagnostic::new(
                    codes::STATE_NEEDS_WINDOW,
                    "state needs a window to aggregate over",
                    state.span,
                    "no window",
                )
                .with_help("add a window to the pattern, e.g. `... as e #time(5 min)`"),
            );
        }
        if windowed && r.state.is_none() {
            let span = r.patterns.iter().find_map(|p| p.window.as_ref()).map(|w| w.span).unwrap_or(r.name.span);
            self.error(
                Diagnostic::new(
                    codes::STATE_NEEDS_WINDOW,
                    "a window needs a `state` block to aggregate into",
                    span,
                    "window without state",
                )
                .with_help("add e.g. `state ss { n := count() } group by m`"),
            );
        }
        if sequenced && r.state.is_some() {
            if let Some(s) = &r.state {
                self.error(Diagnostic::new(
                    codes::MODEL_MIX,
                    "a rule is either a sequence or a windowed state, not both",
                    s.span,
                    "state in a sequence rule",
                ));
            }
        }
        if let (Some(inv), None) = (&r.invariant, &r.state) {
            self.error(Diagnostic::new(
                codes::INVARIANT,
                "an invariant learns from a `state` block, and this rule has none",
                inv.span,
                "no state to learn from",
            ));
        }
        if let (Some(c), None) = (&r.cluster, &r.state) {
            self.error(Diagnostic::new(
                codes::CLUSTER,
                "clustering compares the groups of a `state` block, and this rule has none",
                c.span,
                "no state to cluster",
            ));
        }
        if let (Some(inv), Some(c)) = (&r.invariant, &r.cluster) {
            self.error(
                Diagnostic::new(
                    codes::MODEL_MIX,
                    "a rule has an invariant or a cluster step, not both",
                    c.span,
                    "cluster step",
                )
                .with_secondary(inv.span, "invariant"),
            );
        }
        self.score_mixing();
    }

    pub(super) fn alert(&mut self, scope: &Scope) -> AlertPlan {
        let Some(a) = &self.rule.alert else {
            return AlertPlan {
                condition: TExpr { ty: Type::Bool, kind: TExprKind::Bool(true) },
                severity: "warning",
                for_ms: 0,
                keep_firing_for_ms: 0,
                refractory_ms: 0,
                rollup: None,
            };
        };
        let condition = match &a.condition {
            Some(c) => self.condition(c, scope),
            None => TExpr { ty: Type::Bool, kind: TExprKind::Bool(true) },
        };
        let severity = self.severity(a.severity.as_ref());
        AlertPlan {
            condition,
            severity,
            for_ms: a.for_.map_or(0, |d| d.millis),
            keep_firing_for_ms: a.keep_firing_for.map_or(0, |d| d.millis),
            refractory_ms: a.refractory.map_or(0, |d| d.millis),
            rollup: None,
        }
    }

    /// A severity's name (`warning` when none is given, or an unknown one after its error).
    fn severity(&mut self, given: Option<&Ident>) -> &'static str {
        let Some(s) = given else { return "warning" };
        match schema::SEVERITIES.iter().find(|v| **v == s.name) {
            Some(v) => v,
            None => {
                self.error(
                    Diagnostic::new(
                        codes::SEVERITY,
                        format!("unknown severity `{}`", s.name),
                        s.span,
                        "not a severity",
                    )
                    .with_help(suggestion(&s.name, schema::SEVERITIES)),
                );
                "warning"
            }
        }
    }

    /// The `rollup` clause: it gathers the alerts of a window rule's groups by one of the
    /// fields of their key, which must leave others (a series' name beside its host).
    pub(super) fn rollup(&mut self, state: Option<&StatePlan>) -> Option<RollupPlan> {
        let r = self.rule.rollup.as_ref()?;
        let severity = self.severity(r.severity.as_ref());
        let by = r.by.to_string();
        let Some(state) = state.filter(|_| self.rule.alert.is_some()) else {
            self.error(Diagnostic::new(
                codes::ROLLUP,
                "a roll-up needs a rule with a state and an alert",
                r.span,
                "gathers the alerts of a state's groups",
            ));
            return None;
        };
        let keys = state.key_names();
        if !keys.contains(&by) || keys.len() < 2 {
            let names: Vec<&str> = keys.iter().map(String::as_str).collect();
            let why = if keys.len() < 2 { "the whole key: nothing to gather" } else { "not a field of the key" };
            self.error(
                Diagnostic::new(codes::ROLLUP, format!("cannot roll up by `{by}`"), r.by.span, why)
                    .with_note(format!("the groups' key is {}", names.join(", "))),
            );
            return None;
        }
        Some(RollupPlan { by, severity })
    }

    pub(super) fn templates(
        &mut self,
        fields: &[TemplateField],
        what: &str,
        scope: &Scope,
    ) -> Vec<(String, Vec<TemplatePiece>)> {
        let mut seen: HashMap<&str, Span> = HashMap::new();
        let mut out = Vec::new();
        for f in fields {
            if let Some(first) = seen.insert(&f.name.name, f.name.span) {
                self.error(twice(format!("{what} `{}` is given twice", f.name.name), f.name.span, first));
                continue;
            }
            let pieces = f
                .template
                .parts
                .iter()
                .map(|p| match p {
                    TemplatePart::Text(t) => TemplatePiece::Text(t.clone()),
                    TemplatePart::Hole(e, format) => {
                        let v = self.expr(e, scope);
                        self.value_type(&v, e.span);
                        TemplatePiece::Value(v, *format)
                    }
                })
                .collect();
            out.push((f.name.name.clone(), pieces));
        }
        out
    }

    pub(super) fn returns(
        &mut self,
        scope: &Scope,
        positive: &[usize],
        state: Option<&StatePlan>,
    ) -> Vec<(String, TExpr)> {
        let Some(items) = &self.rule.returns else {
            return self.default_returns(positive, state);
        };
        let mut seen: HashMap<String, Span> = HashMap::new();
        let mut out = Vec::new();
        for item in items {
            let value = self.expr(&item.value, scope);
            self.value_type(&value, item.value.span);
            let (name, span) = match &item.alias {
                Some(a) => (a.name.clone(), a.span),
                None => (item.value.to_string(), item.value.span),
            };
            if let Some(first) = seen.insert(name.clone(), span) {
                self.error(
                    twice(format!("the rule returns `{name}` twice"), span, first)
                        .with_help("give one of them a name with `as`"),
                );
                continue;
            }
            out.push((name, value));
        }
        out
    }

    /// Without `return`, an alert carries the keys of the entities it is about.
    pub(super) fn default_returns(&self, positive: &[usize], state: Option<&StatePlan>) -> Vec<(String, TExpr)> {
        let mut out = Vec::new();
        let push_entity = |out: &mut Vec<(String, TExpr)>, var: &str, kind: EntityKind, source: usize| {
            for field in kind.key_fields() {
                let ty = self.sources.get(source).and_then(|s| s.stream.field(field)).unwrap_or(Type::Str);
                out.push((
                    format!("{var}.{field}"),
                    TExpr {
                        ty,
                        kind: TExprKind::EntityField {
                            var: var.to_string(),
                            source,
                            field,
                            index: self
                                .sources
                                .get(source)
                                .map_or(0, |s| crate::schema::field_position(s.stream, field)),
                        },
                    },
                ));
            }
        };
        match state {
            Some(s) => {
                for key in &s.group_by {
                    match key {
                        GroupKey::Entity { var, kind } => push_entity(&mut out, var, *kind, 0),
                        GroupKey::Value(e) => out.push((e.to_string(), e.clone())),
                    }
                }
            }
            None => {
                for var in &self.entity_order {
                    let info = &self.entities[var];
                    if let Some((source, _)) = info.bindings.iter().find(|(s, _)| positive.contains(s)) {
                        push_entity(&mut out, var, info.kind, *source);
                    }
                }
            }
        }
        out
    }

    // ---- expressions --------------------------------------------------------------------
}

/// The smallest round slide that divides `size` and keeps at most [`MAX_OPEN_WINDOWS`]
/// windows open (`size` itself at worst).
fn coarser_slide(size: u64) -> u64 {
    const ROUND: [u64; 14] = [1, 5, 10, 15, 30, 60, 300, 600, 900, 1_800, 3_600, 7_200, 21_600, 86_400];
    ROUND
        .iter()
        .map(|s| s * 1_000)
        .find(|&slide| size.is_multiple_of(slide) && size / slide <= MAX_OPEN_WINDOWS)
        .unwrap_or(size)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
