//! The checker: resolves names, checks types and bounds, and turns each rule of the AST into a
//! [`RulePlan`]. It reports every problem it finds; a rule with any problem yields no plan.

use crate::ast::{self, *};
use crate::diagnostic::{codes, suggestion, Diagnostic};
use crate::plan::{self, *};
use crate::schema::{self, entity_fields, operations_of, EntityKind, Role, Stream, Type};
use std::collections::{HashMap, HashSet};

/// Most windows a state may keep, and most a baseline may train on.
const MAX_HISTORY: u64 = 10_000;
const MAX_TRAINING_WINDOWS: u64 = 1_000_000;
/// Windows one event may update: a window's length over its slide.
const MAX_OPEN_WINDOWS: u64 = 1_000;
/// Values one group of a windowed rule may keep: its open and past windows, times its fields.
const MAX_GROUP_VALUES: u64 = 100_000;
/// Most repetitions a counted step may ask for; each is a live partial match.
const MAX_COUNT: u64 = 100_000;

/// Checks every rule of a file. Rules with problems are left out of the plans; their problems
/// are in the diagnostics, together with duplicate rule names.
pub fn check(file: &ast::File) -> (Vec<RulePlan>, Vec<Diagnostic>) {
    let mut plans = Vec::new();
    let mut diags = Vec::new();
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for rule in &file.rules {
        if let Some(first) = seen.get(rule.name.name.as_str()) {
            diags.push(
                Diagnostic::new(
                    codes::DUPLICATE_RULE,
                    format!("rule `{}` is defined twice", rule.name.name),
                    rule.name.span,
                    "defined again here",
                )
                .with_secondary(*first, "first defined here"),
            );
        } else {
            seen.insert(&rule.name.name, rule.name.span);
        }
        let mut checker = RuleChecker::new(rule);
        let plan = checker.run();
        if checker.diags.is_empty() {
            plans.extend(plan);
        }
        diags.append(&mut checker.diags);
    }
    (plans, diags)
}

struct EventInfo {
    source: usize,
    stream: Stream,
}

struct EntityInfo {
    kind: EntityKind,
    span: Span,
    /// Sources that bind this variable, with its place in each.
    bindings: Vec<(usize, Role)>,
}

struct StateInfo {
    name: String,
    history: usize,
    fields: HashMap<String, Type>,
    field_order: Vec<String>,
    /// Group keys as the user wrote them, for matching expressions in the alert.
    key_texts: Vec<String>,
    entity_keys: Vec<String>,
}

/// Which variables an expression may use.
#[derive(Clone, Copy)]
enum Vars<'s> {
    /// Event and entity variables bound by these sources.
    Sources(&'s [usize]),
    /// Only the state's group keys (after aggregation, one value per group is all there is).
    GroupKeys,
}

#[derive(Clone, Copy)]
struct Scope<'s> {
    /// Where the expression stands, for messages: "the alert", "a pattern filter".
    place: &'static str,
    vars: Vars<'s>,
    state: bool,
    baselines: bool,
    cluster: bool,
}

struct RuleChecker<'a> {
    rule: &'a RuleDecl,
    diags: Vec<Diagnostic>,
    sources: Vec<SourcePlan>,
    events: HashMap<String, EventInfo>,
    entities: HashMap<String, EntityInfo>,
    /// Entity variables in order of first binding, for default returns.
    entity_order: Vec<String>,
    state: Option<StateInfo>,
    baselines: HashMap<String, Type>,
    has_cluster: bool,
}

impl<'a> RuleChecker<'a> {
    fn new(rule: &'a RuleDecl) -> Self {
        RuleChecker {
            rule,
            diags: Vec::new(),
            sources: Vec::new(),
            events: HashMap::new(),
            entities: HashMap::new(),
            entity_order: Vec::new(),
            state: None,
            baselines: HashMap::new(),
            has_cluster: false,
        }
    }

    fn error(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    fn run(&mut self) -> Option<RulePlan> {
        let r = self.rule;
        for (clause, span) in &r.repeated {
            self.error(Diagnostic::new(
                codes::REPEATED_CLAUSE,
                format!("a rule has at most one `{clause}` clause"),
                *span,
                "repeated here",
            ));
        }
        if r.patterns.is_empty() {
            self.error(
                Diagnostic::new(
                    codes::NO_PATTERN,
                    format!("rule `{}` matches no events", r.name.name),
                    r.name.span,
                    "no event pattern",
                )
                .with_help("start the rule with a pattern such as `task t fail machine m as e`"),
            );
            return None;
        }
        for p in &r.patterns {
            self.bind_pattern(p);
        }
        let filters: Vec<Option<TExpr>> = r
            .patterns
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let only = [i];
                let scope = Scope {
                    place: "a pattern filter",
                    vars: Vars::Sources(&only),
                    state: false,
                    baselines: false,
                    cluster: false,
                };
                p.filter.as_ref().map(|f| self.condition(f, &scope))
            })
            .collect();
        for (src, filter) in self.sources.iter_mut().zip(filters) {
            src.filter = filter;
        }

        let window = self.window();
        let sequence = self.sequence();
        let windowed = r.patterns.iter().any(|p| p.window.is_some());
        self.mixing_checks(windowed, sequence.is_some());
        let state = self.state_clause();
        if let (Some(w), Some(st)) = (&window, &state) {
            self.state_cost(w, st);
        }
        let invariant = self.invariant();
        let cluster = self.cluster();

        let positive: Vec<usize> = match &sequence {
            Some(seq) => {
                seq.steps.iter().filter(|s| !matches!(s.kind, plan::StepKind::Absent(_))).map(|s| s.source).collect()
            }
            None => (0..self.sources.len()).collect(),
        };
        let scope = self.output_scope(&positive);
        let alert = self.alert(&scope);
        let labels = self.templates(&r.labels, "label", &scope);
        let annotations = self.templates(&r.annotations, "annotation", &scope);
        let returns = self.returns(&scope, &positive, state.as_ref());

        if self.sources.len() > 1 && sequence.is_none() {
            return None;
        }
        // The combinations `mixing_checks` and the clauses' own checks let through; any other
        // has been reported.
        let model = match (sequence, window, state, invariant, cluster) {
            (None, None, None, None, None) => ModelPlan::SingleEvent,
            (Some(seq), None, None, None, None) => ModelPlan::Sequence(seq),
            (None, Some(window), Some(state), None, None) => ModelPlan::TimeSeries(WindowedPlan { window, state }),
            (None, Some(window), Some(state), Some(inv), None) => {
                ModelPlan::Invariant(WindowedPlan { window, state }, inv)
            }
            (None, Some(window), Some(state), None, Some(c)) => ModelPlan::Outlier(WindowedPlan { window, state }, c),
            _ => return None,
        };
        Some(RulePlan {
            name: r.name.name.clone(),
            description: r.description.as_ref().map(|(d, _)| d.clone()),
            model,
            sources: std::mem::take(&mut self.sources),
            alert,
            labels,
            annotations,
            returns,
        })
    }

    /// Resolves a pattern's operation and registers its variables.
    fn bind_pattern(&mut self, p: &Pattern) {
        let index = self.sources.len();
        let Some(subject_kind) = EntityKind::from_name(&p.subject_kind.name) else {
            unreachable!("the grammar admits only known entity kinds")
        };
        let ops: Vec<&schema::Operation> = operations_of(subject_kind).collect();
        let op = ops.iter().find(|o| o.name == p.operation.name).copied();
        let Some(op) = op else {
            let names: Vec<&str> = ops.iter().map(|o| o.name).collect();
            self.error(
                Diagnostic::new(
                    codes::UNKNOWN_OPERATION,
                    format!("unknown operation `{}` for a {}", p.operation.name, subject_kind.name()),
                    p.operation.span,
                    "no such operation",
                )
                .with_help(suggestion(&p.operation.name, &names)),
            );
            // Register the variables anyway so later uses do not report them as unknown.
            self.register_event(&p.event, Stream::TaskEvent, index);
            self.register_entity(&p.subject, subject_kind, index, Role::Subject);
            if let Some((kind, var)) = &p.object {
                if let Some(k) = EntityKind::from_name(&kind.name) {
                    self.register_entity(var, k, index, Role::Object);
                }
            }
            self.sources.push(placeholder_source(&p.event.name, Stream::TaskEvent, subject_kind, &p.subject.name));
            return;
        };
        let mut object = None;
        match (&p.object, op.object) {
            (Some((kind, var)), Some(expected)) => {
                if kind.name == expected.name() {
                    object = Some((expected, var.name.clone()));
                } else {
                    self.error(Diagnostic::new(
                        codes::UNKNOWN_ENTITY,
                        format!(
                            "`{} {}` takes a {} as its object, not a {}",
                            subject_kind.name(),
                            op.name,
                            expected.name(),
                            kind.name
                        ),
                        kind.span,
                        format!("expected `{}`", expected.name()),
                    ));
                }
            }
            (Some((kind, _)), None) => self.error(
                Diagnostic::new(
                    codes::UNKNOWN_ENTITY,
                    format!("`{} {}` takes no object", subject_kind.name(), op.name),
                    kind.span,
                    "unexpected object",
                )
                .with_note(format!(
                    "{} events describe the {} alone",
                    op.stream.name(),
                    subject_kind.name()
                )),
            ),
            (None, Some(expected)) if !op.object_optional => self.error(Diagnostic::new(
                codes::UNKNOWN_ENTITY,
                format!("`{} {}` needs a {} as its object", subject_kind.name(), op.name, expected.name()),
                p.operation.span,
                "object missing after this",
            )),
            _ => {}
        }
        self.register_event(&p.event, op.stream, index);
        self.register_entity(&p.subject, subject_kind, index, Role::Subject);
        if let (Some((kind, var)), Some((_, _))) = (&p.object, &object) {
            if let Some(k) = EntityKind::from_name(&kind.name) {
                self.register_entity(var, k, index, Role::Object);
            }
        }
        self.sources.push(SourcePlan {
            event_var: p.event.name.clone(),
            stream: op.stream,
            event_type: op.event_type,
            subject: (subject_kind, p.subject.name.clone()),
            object,
            filter: None,
        });
    }

    fn register_event(&mut self, var: &Ident, stream: Stream, source: usize) {
        if self.events.contains_key(&var.name) || self.entities.contains_key(&var.name) {
            self.error(Diagnostic::new(
                codes::DUPLICATE_NAME,
                format!("`{}` is already bound", var.name),
                var.span,
                "each event needs a name of its own",
            ));
            return;
        }
        self.events.insert(var.name.clone(), EventInfo { source, stream });
    }

    fn register_entity(&mut self, var: &Ident, kind: EntityKind, source: usize, role: Role) {
        if self.events.contains_key(&var.name) {
            self.error(Diagnostic::new(
                codes::DUPLICATE_NAME,
                format!("`{}` already names an event", var.name),
                var.span,
                "an entity needs a different name",
            ));
            return;
        }
        match self.entities.get_mut(&var.name) {
            Some(info) if info.kind != kind => {
                let (first_kind, first_span) = (info.kind, info.span);
                self.error(
                    Diagnostic::new(
                        codes::ENTITY_CONFLICT,
                        format!("`{}` is a {} here but a {} before", var.name, kind.name(), first_kind.name()),
                        var.span,
                        format!("used as a {}", kind.name()),
                    )
                    .with_secondary(first_span, format!("bound as a {} here", first_kind.name()))
                    .with_note("reusing a variable means \"the same entity\", so both places need the same kind"),
                );
            }
            Some(info) => info.bindings.push((source, role)),
            None => {
                self.entities
                    .insert(var.name.clone(), EntityInfo { kind, span: var.span, bindings: vec![(source, role)] });
                self.entity_order.push(var.name.clone());
            }
        }
    }

    fn window(&mut self) -> Option<WindowPlan> {
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
    fn state_cost(&mut self, w: &WindowPlan, st: &StatePlan) {
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

    fn sequence(&mut self) -> Option<SequencePlan> {
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
        let mut steps = Vec::new();
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
            match step.kind {
                ast::StepKind::Absent(d) if i == 0 => {
                    let start = w
                        .steps
                        .iter()
                        .find(|s| !matches!(s.kind, ast::StepKind::Absent(_)))
                        .map_or("e0", |s| s.event.name.as_str());
                    self.error(
                        Diagnostic::new(
                            codes::SEQUENCE_SHAPE,
                            "a sequence cannot start with an absence",
                            step.span,
                            "nothing before it",
                        )
                        .with_note("an absence is measured from the step before it")
                        .with_help(format!(
                            "put the event that starts the wait first: `with {start} -> not {} for {}`",
                            step.event.name,
                            format_duration(d.millis)
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
            let kind = match step.kind {
                ast::StepKind::Once => plan::StepKind::Once,
                ast::StepKind::Count { min } => plan::StepKind::Count { min },
                ast::StepKind::Absent(d) => plan::StepKind::Absent(d.millis),
            };
            steps.push(StepPlan { source, kind });
        }
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
        let positive = steps.iter().filter(|s| !matches!(s.kind, plan::StepKind::Absent(_))).count();
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
        let all: Vec<usize> = (0..self.sources.len()).collect();
        let scope = Scope {
            place: "the `with` clause",
            vars: Vars::Sources(&all),
            state: false,
            baselines: false,
            cluster: false,
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
        Some(SequencePlan { steps, within_ms: w.within.map(|d| d.millis), joins, group_by, conditions })
    }

    /// Reports combinations of models a rule cannot have.
    fn mixing_checks(&mut self, windowed: bool, sequenced: bool) {
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
    }

    fn state_clause(&mut self) -> Option<StatePlan> {
        let s = self.rule.state.as_ref()?;
        // Without a window (already reported) the state is still bound, so that its uses do not
        // cascade into "unknown name" errors.
        let name = s.name.name.clone();
        if self.events.contains_key(&name) || self.entities.contains_key(&name) {
            self.error(Diagnostic::new(
                codes::DUPLICATE_NAME,
                format!("`{name}` already names a variable"),
                s.name.span,
                "state needs its own name",
            ));
        }
        let history = match s.history {
            None => 1,
            Some((k, span)) if k == 0 || k > MAX_HISTORY => {
                self.error(Diagnostic::new(
                    codes::HISTORY_RANGE,
                    format!("a state keeps 1 to {MAX_HISTORY} windows"),
                    span,
                    format!("{k} is out of range"),
                ));
                1
            }
            Some((k, _)) => k as usize,
        };
        let only = [0usize];
        let scope = Scope {
            place: "the state block",
            vars: Vars::Sources(&only),
            state: false,
            baselines: false,
            cluster: false,
        };
        let mut fields = Vec::new();
        let mut types = HashMap::new();
        let mut order = Vec::new();
        let mut seen: HashMap<&str, Span> = HashMap::new();
        for f in &s.fields {
            if let Some(first) = seen.insert(&f.name.name, f.name.span) {
                self.error(twice(format!("state field `{}` is defined twice", f.name.name), f.name.span, first));
                continue;
            }
            if let Some(field) = self.aggregate(f, &scope) {
                types.insert(field.name.clone(), field.ty);
                order.push(field.name.clone());
                fields.push(field);
            }
        }
        if s.fields.is_empty() {
            self.error(
                Diagnostic::new(
                    codes::STATE_NEEDS_WINDOW,
                    format!("state `{name}` has no fields"),
                    s.span,
                    "empty state",
                )
                .with_help("add an aggregate, e.g. `n := count()`"),
            );
        }
        let mut group_by = Vec::new();
        let mut key_texts = Vec::new();
        let mut entity_keys = Vec::new();
        for g in &s.group_by {
            if let ExprKind::Name(n) = &g.kind {
                if let Some(info) = self.entities.get(n) {
                    group_by.push(GroupKey::Entity { var: n.clone(), kind: info.kind });
                    entity_keys.push(n.clone());
                    key_texts.push(n.clone());
                    continue;
                }
            }
            let e = self.scalar(g, &scope);
            key_texts.push(g.to_string());
            group_by.push(GroupKey::Value(e));
        }
        self.state =
            Some(StateInfo { name: name.clone(), history, fields: types, field_order: order, key_texts, entity_keys });
        Some(StatePlan { name, history, fields, group_by })
    }

    /// A state field: exactly one aggregate call.
    fn aggregate(&mut self, f: &StateField, scope: &Scope) -> Option<StateFieldPlan> {
        let ExprKind::Call(func, args) = &f.value.kind else {
            self.error(
                Diagnostic::new(codes::AGGREGATE_CONTEXT, format!("state field `{}` must be an aggregate", f.name.name), f.value.span, "not an aggregate")
                    .with_help("use one of count, sum, avg, min, max, stddev, percentile, distinct_count, set, first, last; compute ratios in `alert`"),
            );
            return None;
        };
        let name = func.name.as_str();
        if !AggFunc::NAMES.contains(&name) {
            self.error(
                Diagnostic::new(
                    codes::UNKNOWN_FUNCTION,
                    format!("unknown aggregate `{name}`"),
                    func.span,
                    "not an aggregate",
                )
                .with_help(suggestion(name, &AggFunc::NAMES)),
            );
            return None;
        }
        if let Some(named) = args.iter().find_map(|a| a.name.as_ref()) {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                "aggregates take positional arguments",
                named.span,
                "named argument",
            ));
            return None;
        }
        let (want, usage) = match name {
            "count" => (0..=1, "count() or count(x)"),
            "percentile" => (2..=2, "percentile(x, p) with p from 0 to 100"),
            _ => (1..=1, "one argument"),
        };
        if !want.contains(&args.len()) {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                format!(
                    "`{name}` takes {usage}, not {} argument{}",
                    args.len(),
                    if args.len() == 1 { "" } else { "s" }
                ),
                f.value.span,
                "wrong number of arguments",
            ));
            return None;
        }
        let arg = args.first().map(|a| self.scalar(&a.value, scope));
        let arg_ty = arg.as_ref().map_or(Type::Number, |a| a.ty);
        let (agg, ty) = match name {
            "count" => (AggFunc::Count, Type::Number),
            "distinct_count" => (AggFunc::DistinctCount, Type::Number),
            "set" => {
                self.expect(
                    arg_ty,
                    &[Type::Str, Type::Number],
                    args[0].value.span,
                    "`set` collects strings or numbers",
                );
                (AggFunc::Set, Type::Set)
            }
            "first" => (AggFunc::First, arg_ty),
            "last" => (AggFunc::Last, arg_ty),
            "percentile" => {
                self.expect(arg_ty, &[Type::Number], args[0].value.span, "`percentile` needs numbers");
                let p = match args[1].value.kind {
                    ExprKind::Number(p) if (0.0..=100.0).contains(&p) => p,
                    _ => {
                        self.error(Diagnostic::new(
                            codes::ARGUMENTS,
                            "the percentile must be a number from 0 to 100",
                            args[1].value.span,
                            "not a percentile",
                        ));
                        50.0
                    }
                };
                (AggFunc::Percentile(p), Type::Number)
            }
            other => {
                self.expect(arg_ty, &[Type::Number], args[0].value.span, &format!("`{other}` needs numbers"));
                let agg = match other {
                    "sum" => AggFunc::Sum,
                    "avg" => AggFunc::Avg,
                    "min" => AggFunc::Min,
                    "max" => AggFunc::Max,
                    _ => AggFunc::Stddev,
                };
                (agg, Type::Number)
            }
        };
        Some(StateFieldPlan { name: f.name.name.clone(), agg, arg, ty })
    }

    fn invariant(&mut self) -> Option<InvariantPlan> {
        let inv = self.rule.invariant.as_ref()?;
        self.state.as_ref()?;
        let (n, nspan) = inv.windows;
        if n == 0 || n > MAX_TRAINING_WINDOWS {
            self.error(Diagnostic::new(
                codes::INVARIANT,
                format!("an invariant trains over 1 to {MAX_TRAINING_WINDOWS} windows"),
                nspan,
                format!("{n} is out of range"),
            ));
        }
        let mode = match inv.mode.name.as_str() {
            "offline" => InvariantMode::Offline,
            "online" => InvariantMode::Online,
            other => {
                self.error(
                    Diagnostic::new(
                        codes::INVARIANT,
                        format!("unknown invariant mode `{other}`"),
                        inv.mode.span,
                        "not a mode",
                    )
                    .with_help(suggestion(other, &["offline", "online"]))
                    .with_note("offline freezes the baseline after training; online keeps updating it"),
                );
                InvariantMode::Offline
            }
        };
        let mut init = Vec::new();
        let mut update = Vec::new();
        for st in &inv.statements {
            let scope =
                Scope { place: "the invariant", vars: Vars::GroupKeys, state: true, baselines: true, cluster: false };
            let value = self.expr(&st.value, &scope);
            if st.is_init {
                if self.baselines.contains_key(&st.target.name) {
                    self.error(Diagnostic::new(
                        codes::DUPLICATE_NAME,
                        format!("baseline `{}` is declared twice", st.target.name),
                        st.target.span,
                        "declared again",
                    ));
                    continue;
                }
                if self.state.as_ref().is_some_and(|s| s.name == st.target.name)
                    || self.events.contains_key(&st.target.name)
                    || self.entities.contains_key(&st.target.name)
                {
                    self.error(Diagnostic::new(
                        codes::DUPLICATE_NAME,
                        format!("`{}` already names something else", st.target.name),
                        st.target.span,
                        "choose another name",
                    ));
                    continue;
                }
                self.value_type(&value, st.value.span);
                self.baselines.insert(st.target.name.clone(), value.ty);
                init.push((st.target.name.clone(), value));
            } else {
                match self.baselines.get(&st.target.name).copied() {
                    None => {
                        let names: Vec<&str> = self.baselines.keys().map(String::as_str).collect();
                        self.error(
                            Diagnostic::new(
                                codes::UNKNOWN_NAME,
                                format!("baseline `{}` is updated but never declared", st.target.name),
                                st.target.span,
                                "not declared",
                            )
                            .with_help(
                                match crate::diagnostic::nearest(&st.target.name, names.iter().copied()) {
                                    Some(c) => format!("did you mean `{c}`?"),
                                    None => format!("declare it first: `{} := ...`", st.target.name),
                                },
                            ),
                        );
                    }
                    Some(ty) if !compatible(ty, value.ty) => self.error(Diagnostic::new(
                        codes::TYPE_MISMATCH,
                        format!("baseline `{}` is a {ty} but is updated with a {}", st.target.name, value.ty),
                        st.value.span,
                        format!("this is a {}", value.ty),
                    )),
                    Some(_) => update.push((st.target.name.clone(), value)),
                }
            }
        }
        if init.is_empty() {
            self.error(
                Diagnostic::new(codes::INVARIANT, "the invariant declares no baseline", inv.span, "nothing to learn")
                    .with_help("declare and update a baseline: `{ seen := empty_set; seen = seen union ss.users }`"),
            );
        }
        Some(InvariantPlan { training_windows: n, mode, init, update })
    }

    fn cluster(&mut self) -> Option<ClusterPlan> {
        let c = self.rule.cluster.as_ref()?;
        self.state.as_ref()?;
        self.has_cluster = true;
        const ARGS: [&str; 3] = ["points", "method", "distance"];
        let mut dims = None;
        let mut per = Vec::new();
        let mut method = None;
        let mut distance = Distance::Euclidean;
        for arg in &c.args {
            match (arg.name.name.as_str(), &arg.value) {
                ("points", ClusterValue::Points { dims: d, per: p, .. }) => {
                    let scope = Scope {
                        place: "the cluster points",
                        vars: Vars::GroupKeys,
                        state: true,
                        baselines: false,
                        cluster: false,
                    };
                    let checked: Vec<TExpr> = d
                        .iter()
                        .map(|e| {
                            let t = self.expr(e, &scope);
                            self.expect(t.ty, &[Type::Number], e.span, "a point's coordinates are numbers");
                            t
                        })
                        .collect();
                    dims = Some(checked);
                    let key_scope = Scope {
                        place: "the peer groups",
                        vars: Vars::GroupKeys,
                        state: false,
                        baselines: false,
                        cluster: false,
                    };
                    per = p.iter().map(|e| self.scalar(e, &key_scope)).collect();
                }
                ("points", ClusterValue::Expr(e)) => self.error(
                    Diagnostic::new(codes::CLUSTER, "`points` takes `all(...)`", e.span, "not a point set")
                        .with_help("write `points = all(ss.cpu) per t.job_id`"),
                ),
                ("method", ClusterValue::Expr(e)) => method = self.cluster_method(e),
                ("distance", ClusterValue::Expr(e)) => {
                    distance = match &e.kind {
                        ExprKind::Str(s) if s == "ed" || s == "euclidean" => Distance::Euclidean,
                        ExprKind::Str(s) if s == "manhattan" => Distance::Manhattan,
                        ExprKind::Str(s) if s == "chebyshev" => Distance::Chebyshev,
                        _ => {
                            self.error(
                                Diagnostic::new(codes::CLUSTER, "unknown distance", e.span, "not a distance")
                                    .with_help("use \"ed\" (euclidean), \"manhattan\" or \"chebyshev\""),
                            );
                            distance
                        }
                    }
                }
                (name, _) if ARGS.contains(&name) => self.error(Diagnostic::new(
                    codes::CLUSTER,
                    format!("`{name}` takes an expression"),
                    arg.name.span,
                    "wrong kind of value",
                )),
                (name, _) => self.error(
                    Diagnostic::new(
                        codes::ARGUMENTS,
                        format!("unknown cluster argument `{name}`"),
                        arg.name.span,
                        "not an argument",
                    )
                    .with_help(suggestion(name, &ARGS)),
                ),
            }
        }
        let Some(dims) = dims else {
            self.error(
                Diagnostic::new(codes::CLUSTER, "the cluster step needs `points`", c.span, "no points")
                    .with_help("add `points = all(ss.cpu) per t.job_id`"),
            );
            return None;
        };
        let Some(method) = method else {
            if !c.args.iter().any(|a| a.name.name == "method") {
                self.error(
                    Diagnostic::new(codes::CLUSTER, "the cluster step needs a `method`", c.span, "no method")
                        .with_help("add `method = dbscan(0.05, 3)` or `method = mad(3.5)`"),
                );
            }
            return None;
        };
        Some(ClusterPlan { dims, per, method, distance })
    }

    fn cluster_method(&mut self, e: &Expr) -> Option<ClusterMethod> {
        const METHODS: [&str; 3] = ["dbscan", "mad", "zscore"];
        let help = "write `dbscan(eps, minpts)`, `mad(threshold)` or `zscore(threshold)`";
        let ExprKind::Call(name, args) = &e.kind else {
            self.error(
                Diagnostic::new(codes::CLUSTER, "`method` names a clustering method", e.span, "not a method")
                    .with_help(help),
            );
            return None;
        };
        let numbers: Option<Vec<f64>> = args
            .iter()
            .map(|a| match a.value.kind {
                ExprKind::Number(n) if n > 0.0 => Some(n),
                _ => None,
            })
            .collect();
        let method = match (name.name.to_ascii_lowercase().as_str(), numbers.as_deref()) {
            ("dbscan", Some(&[eps, min_pts])) if min_pts.fract() == 0.0 => {
                Some(ClusterMethod::Dbscan { eps, min_pts: min_pts as u64 })
            }
            ("mad", Some(&[threshold])) => Some(ClusterMethod::Mad { threshold }),
            ("zscore", Some(&[threshold])) => Some(ClusterMethod::ZScore { threshold }),
            (other, _) if !METHODS.contains(&other) => {
                self.error(
                    Diagnostic::new(
                        codes::CLUSTER,
                        format!("unknown clustering method `{}`", name.name),
                        name.span,
                        "not a method",
                    )
                    .with_help(suggestion(other, &METHODS)),
                );
                return None;
            }
            _ => None,
        };
        if method.is_none() {
            self.error(
                Diagnostic::new(
                    codes::CLUSTER,
                    format!("wrong arguments for `{}`", name.name),
                    e.span,
                    "expected positive numbers",
                )
                .with_help(help)
                .with_note("DBSCAN's minpts is a whole number"),
            );
        }
        method
    }

    /// The scope of `alert`, labels, annotations and `return`.
    fn output_scope<'s>(&self, positive: &'s [usize]) -> Scope<'s> {
        if self.state.is_some() {
            Scope {
                place: "the alert",
                vars: Vars::GroupKeys,
                state: true,
                baselines: self.rule.invariant.is_some(),
                cluster: self.has_cluster,
            }
        } else {
            Scope { place: "the alert", vars: Vars::Sources(positive), state: false, baselines: false, cluster: false }
        }
    }

    fn alert(&mut self, scope: &Scope) -> AlertPlan {
        let Some(a) = &self.rule.alert else {
            return AlertPlan {
                condition: TExpr { ty: Type::Bool, kind: TExprKind::Bool(true) },
                severity: "warning",
                for_ms: 0,
                keep_firing_for_ms: 0,
            };
        };
        let condition = match &a.condition {
            Some(c) => self.condition(c, scope),
            None => TExpr { ty: Type::Bool, kind: TExprKind::Bool(true) },
        };
        let severity = match &a.severity {
            None => "warning",
            Some(s) => match schema::SEVERITIES.iter().find(|v| **v == s.name) {
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
            },
        };
        AlertPlan {
            condition,
            severity,
            for_ms: a.for_.map_or(0, |d| d.millis),
            keep_firing_for_ms: a.keep_firing_for.map_or(0, |d| d.millis),
        }
    }

    fn templates(&mut self, fields: &[TemplateField], what: &str, scope: &Scope) -> Vec<(String, Vec<TemplatePiece>)> {
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
                    TemplatePart::Hole(e) => {
                        let v = self.expr(e, scope);
                        self.value_type(&v, e.span);
                        TemplatePiece::Value(v)
                    }
                })
                .collect();
            out.push((f.name.name.clone(), pieces));
        }
        out
    }

    fn returns(&mut self, scope: &Scope, positive: &[usize], state: Option<&StatePlan>) -> Vec<(String, TExpr)> {
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
    fn default_returns(&self, positive: &[usize], state: Option<&StatePlan>) -> Vec<(String, TExpr)> {
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
                                .map_or(0, |s| crate::event::field_position(s.stream, field)),
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

    /// An expression that must be a bool.
    fn condition(&mut self, e: &Expr, scope: &Scope) -> TExpr {
        let t = self.expr(e, scope);
        if !compatible(t.ty, Type::Bool) {
            self.error(
                Diagnostic::new(
                    codes::NOT_BOOLEAN,
                    format!("{} must be true or false, but this is a {}", capitalise(scope.place), t.ty),
                    e.span,
                    format!("this is a {}", t.ty),
                )
                .with_help("compare it with something, e.g. `x > 0.9`"),
            );
        }
        t
    }

    /// An expression that must be a single value (a key or an aggregate's argument).
    fn scalar(&mut self, e: &Expr, scope: &Scope) -> TExpr {
        let t = self.expr(e, scope);
        self.expect(
            t.ty,
            &[Type::Number, Type::Str, Type::Bool, Type::Duration, Type::Time],
            e.span,
            "a single value is needed here",
        );
        t
    }

    /// Reports values that cannot be carried by an alert or stored in a baseline.
    fn value_type(&mut self, t: &TExpr, span: Span) {
        if matches!(t.ty, Type::State | Type::Cluster | Type::Event(_)) {
            self.error(Diagnostic::new(
                codes::TYPE_MISMATCH,
                format!("a {} is not a value", t.ty),
                span,
                "take one of its fields",
            ));
        }
    }

    fn expect(&mut self, got: Type, want: &[Type], span: Span, why: &str) -> bool {
        if want.iter().any(|w| compatible(got, *w)) {
            return true;
        }
        let names: Vec<String> = want.iter().map(|t| t.to_string()).collect();
        self.error(
            Diagnostic::new(
                codes::TYPE_MISMATCH,
                format!("expected {}, found {got}", names.join(" or ")),
                span,
                format!("this is a {got}"),
            )
            .with_note(why.to_string()),
        );
        false
    }

    fn expr(&mut self, e: &Expr, scope: &Scope) -> TExpr {
        match &e.kind {
            ExprKind::Number(n) => typed(Type::Number, TExprKind::Number(*n)),
            ExprKind::Str(s) => typed(Type::Str, TExprKind::Str(s.clone())),
            ExprKind::Bool(b) => typed(Type::Bool, TExprKind::Bool(*b)),
            ExprKind::Duration(ms) => typed(Type::Duration, TExprKind::Duration(*ms)),
            ExprKind::EmptySet => typed(Type::Set, TExprKind::EmptySet),
            ExprKind::List(items) => {
                let typed_items: Vec<TExpr> = items.iter().map(|i| self.scalar(i, scope)).collect();
                if let Some(first) = typed_items.first().map(|t| t.ty) {
                    if let Some((bad, item)) = typed_items.iter().zip(items).find(|(t, _)| !compatible(t.ty, first)) {
                        self.error(Diagnostic::new(
                            codes::TYPE_MISMATCH,
                            format!("a list holds values of one type; this one starts with a {first}"),
                            item.span,
                            format!("this is a {}", bad.ty),
                        ));
                    }
                }
                let items = typed_items;
                typed(Type::Literals, TExprKind::List(items))
            }
            ExprKind::Name(n) => self.name(n, e.span, scope),
            ExprKind::ClusterRef => {
                if !scope.cluster {
                    self.error(
                        Diagnostic::new(codes::UNKNOWN_NAME, "`cluster` is not defined here", e.span, "no cluster result")
                            .with_note("`cluster` is the result of a rule's `cluster(...)` step, and exists in its alert and return"),
                    );
                    return error_expr();
                }
                typed(Type::Cluster, TExprKind::Bool(false))
            }
            ExprKind::Member(base, field) => self.member(e, base, field, scope),
            ExprKind::Index(base, idx) => self.index(e, base, idx, scope),
            ExprKind::Range(..) => {
                self.error(
                    Diagnostic::new(codes::TYPE_MISMATCH, "a range of windows needs a field", e.span, "no field taken")
                        .with_help(format!("take a field, e.g. `avg({}.cpu)`", e)),
                );
                error_expr()
            }
            ExprKind::Call(name, args) => self.call(e, name, args, scope),
            ExprKind::Unary(op, inner) => {
                let t = self.expr(inner, scope);
                let (want, ty): (&[Type], Type) = match op {
                    UnaryOp::Not => (&[Type::Bool], Type::Bool),
                    UnaryOp::Neg => (&[Type::Number, Type::Duration], t.ty),
                };
                let ok = self.expect(
                    t.ty,
                    want,
                    inner.span,
                    if *op == UnaryOp::Not { "`not` negates a condition" } else { "`-` negates a number" },
                );
                TExpr { ty: if ok { ty } else { Type::Error }, kind: TExprKind::Unary(*op, Box::new(t)) }
            }
            ExprKind::Binary(op, l, r) => self.binary(e, *op, l, r, scope),
            ExprKind::Cardinality(inner) => {
                let t = self.expr(inner, scope);
                self.expect(
                    t.ty,
                    &[Type::Set, Type::List, Type::Literals, Type::Str],
                    inner.span,
                    "`|x|` counts the members of a set or list, or the characters of a string",
                );
                TExpr { ty: Type::Number, kind: TExprKind::Cardinality(Box::new(t)) }
            }
        }
    }

    fn name(&mut self, n: &str, span: Span, scope: &Scope) -> TExpr {
        if let Some(info) = self.events.get(n) {
            let source = info.source;
            self.check_access(n, source_set(&[source]), span, scope);
            self.error(
                Diagnostic::new(codes::TYPE_MISMATCH, format!("`{n}` is an event, not a value"), span, "an event")
                    .with_help(format!(
                        "take one of its fields, e.g. `{n}.{}`",
                        info_first_field(self.events[n].stream)
                    )),
            );
            return error_expr();
        }
        if let Some(info) = self.entities.get(n) {
            let kind = info.kind;
            let sources: Vec<usize> = info.bindings.iter().map(|(s, _)| *s).collect();
            if !self.check_access(n, source_set(&sources), span, scope) {
                return error_expr();
            }
            if let Vars::GroupKeys = scope.vars {
                if !self.state.as_ref().is_some_and(|s| s.entity_keys.iter().any(|k| k == n)) {
                    self.not_a_key(n, span);
                    return error_expr();
                }
            }
            return typed(Type::Entity(kind), TExprKind::Entity { var: n.to_string(), kind });
        }
        if let Some(state) = &self.state {
            if state.name == n && scope.state {
                let example = state.field_order.first().cloned().unwrap_or_else(|| "field".into());
                self.error(
                    Diagnostic::new(codes::TYPE_MISMATCH, format!("`{n}` is a state, not a value"), span, "a state")
                        .with_help(format!("take a field, e.g. `{n}.{example}` or `{n}[1].{example}`")),
                );
                return error_expr();
            }
        }
        if scope.baselines {
            if let Some(ty) = self.baselines.get(n) {
                return typed(*ty, TExprKind::Baseline(n.to_string()));
            }
        }
        let mut candidates: Vec<&str> = self.events.keys().chain(self.entities.keys()).map(String::as_str).collect();
        if scope.state {
            candidates.extend(self.state.iter().map(|s| s.name.as_str()));
        }
        if scope.baselines {
            candidates.extend(self.baselines.keys().map(String::as_str));
        }
        candidates.sort();
        let mut d =
            Diagnostic::new(codes::UNKNOWN_NAME, format!("unknown name `{n}`"), span, "not defined in this rule");
        if let Some(c) = crate::diagnostic::nearest(n, candidates.iter().copied()) {
            d = d.with_help(format!("did you mean `{c}`?"));
        } else if n.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            d = d.with_help(format!("strings are quoted: \"{n}\""));
        }
        self.error(d);
        error_expr()
    }

    /// Whether a variable bound by `sources` may be used in `scope`; reports why not.
    fn check_access(&mut self, var: &str, sources: HashSet<usize>, span: Span, scope: &Scope) -> bool {
        match scope.vars {
            Vars::Sources(allowed) => {
                if sources.iter().any(|s| allowed.contains(s)) {
                    return true;
                }
                let absent = self.rule.with.as_ref().is_some_and(|w| {
                    w.steps.iter().any(|st| {
                        matches!(st.kind, ast::StepKind::Absent(_))
                            && self.events.get(&st.event.name).is_some_and(|i| sources.contains(&i.source))
                    })
                });
                let d = if absent {
                    Diagnostic::new(codes::FOREIGN_VARIABLE, format!("`{var}` belongs to an event that must not happen"), span, "never bound when the alert fires")
                        .with_note("an absent event has no values; relate it to earlier events in its pattern's `where` or in `with`")
                } else {
                    Diagnostic::new(codes::FOREIGN_VARIABLE, format!("`{var}` is not bound by this pattern"), span, format!("bound by another pattern, not usable in {}", scope.place))
                        .with_help("a pattern's `where` sees only its own variables; relate two events in the `with` clause, e.g. `with e1 -> e2 within 1 h, e2.cpu > e1.cpu_request`")
                };
                self.error(d);
                false
            }
            Vars::GroupKeys => true,
        }
    }

    fn not_a_key(&mut self, text: &str, span: Span) {
        let (state, keys) = match &self.state {
            Some(s) => (s.name.clone(), s.key_texts.join(", ")),
            None => (String::new(), String::new()),
        };
        self.error(
            Diagnostic::new(
                codes::FOREIGN_VARIABLE,
                format!("`{text}` is not a group key of state `{state}`"),
                span,
                "has many values in a window",
            )
            .with_note(if keys.is_empty() {
                format!("state `{state}` has one global group")
            } else {
                format!("the group keys are: {keys}")
            })
            .with_help("aggregate it in the state block, or add it to `group by`"),
        );
    }

    fn member(&mut self, e: &Expr, base: &Expr, field: &Ident, scope: &Scope) -> TExpr {
        match &base.kind {
            ExprKind::Name(n) if self.events.contains_key(n) => {
                let (source, stream) = (self.events[n].source, self.events[n].stream);
                if !self.check_access(n, source_set(&[source]), base.span, scope) {
                    return error_expr();
                }
                let Some(ty) = stream.field(&field.name) else {
                    self.unknown_field(
                        &field.name,
                        field.span,
                        &format!("event `{n}` ({})", stream.name()),
                        &stream.field_names(),
                    );
                    return error_expr();
                };
                if let Vars::GroupKeys = scope.vars {
                    if !self.is_value_key(e) {
                        self.not_a_key(&e.to_string(), e.span);
                        return error_expr();
                    }
                }
                let field = static_field(stream, &field.name);
                typed(
                    ty,
                    TExprKind::EventField {
                        var: n.clone(),
                        source,
                        field,
                        index: crate::event::field_position(stream, field),
                    },
                )
            }
            ExprKind::Name(n) if self.entities.contains_key(n) => self.entity_field(e, n, field, scope),
            ExprKind::Name(n) if scope.state && self.state.as_ref().is_some_and(|s| &s.name == n) => {
                self.state_field(n, 0, field, false, None)
            }
            ExprKind::Index(inner, idx) if scope.state && self.is_state(inner) => {
                let ExprKind::Name(n) = &inner.kind else { unreachable!("is_state checked a name") };
                let (message, label) = match idx.kind {
                    ExprKind::Number(i) if i.fract() == 0.0 && (0.0..MAX_HISTORY as f64).contains(&i) => {
                        return self.state_field(n, i as usize, field, false, Some(idx.span));
                    }
                    ExprKind::Number(i) if i.fract() == 0.0 && i > 0.0 => (
                        format!("a state keeps at most {MAX_HISTORY} windows, so this index is out of range"),
                        "past any history",
                    ),
                    _ => ("a window index is a whole number".to_string(), "not a window index"),
                };
                self.error(
                    Diagnostic::new(codes::HISTORY_RANGE, message, idx.span, label)
                        .with_help(format!("`{n}[0]` is the current window, `{n}[1]` the one before")),
                );
                error_expr()
            }
            ExprKind::Range(inner, from, to) if scope.state && self.is_state(inner) => {
                let ExprKind::Name(n) = &inner.kind else { unreachable!("is_state checked a name") };
                if from > to {
                    self.error(
                        Diagnostic::new(
                            codes::HISTORY_RANGE,
                            format!("range {from}..{to} runs backwards"),
                            base.span,
                            "start is after end",
                        )
                        .with_help(format!("write `{n}[{to}..{from}]`")),
                    );
                    return error_expr();
                }
                let (from, to) = (*from as usize, *to as usize);
                let t = self.state_field(n, to, field, true, Some(base.span));
                let TExprKind::StateField { index, .. } = t.kind else { return t };
                typed(
                    Type::List,
                    TExprKind::StateRange { state: n.clone(), from, to, field: field.name.clone(), index },
                )
            }
            ExprKind::ClusterRef if scope.cluster => {
                const FIELDS: [(&str, Type); 6] = [
                    ("outlier", Type::Bool),
                    ("score", Type::Number),
                    ("median", Type::Number),
                    ("mean", Type::Number),
                    ("mad", Type::Number),
                    ("size", Type::Number),
                ];
                match FIELDS.iter().find(|(f, _)| *f == field.name) {
                    Some((f, ty)) => typed(*ty, TExprKind::ClusterField(f)),
                    None => {
                        let names: Vec<&str> = FIELDS.iter().map(|(f, _)| *f).collect();
                        self.unknown_field(&field.name, field.span, "`cluster`", &names);
                        error_expr()
                    }
                }
            }
            _ => {
                let t = self.expr(base, scope);
                if t.ty != Type::Error {
                    self.error(Diagnostic::new(
                        codes::UNKNOWN_FIELD,
                        format!("a {} has no fields", t.ty),
                        field.span,
                        "no such field",
                    ));
                }
                error_expr()
            }
        }
    }

    fn is_state(&self, e: &Expr) -> bool {
        matches!(&e.kind, ExprKind::Name(n) if self.state.as_ref().is_some_and(|s| &s.name == n))
    }

    /// Whether an expression is, as written, one of the state's group-by values.
    fn is_value_key(&self, e: &Expr) -> bool {
        let text = e.to_string();
        self.state.as_ref().is_some_and(|s| s.key_texts.contains(&text))
    }

    fn state_field(&mut self, state: &str, ago: usize, field: &Ident, range: bool, idx_span: Option<Span>) -> TExpr {
        let info = self.state.as_ref().expect("state is in scope");
        let history = info.history;
        let ty = info.fields.get(&field.name).copied();
        let names: Vec<String> = info.field_order.clone();
        if ago >= history {
            let span = idx_span.unwrap_or(field.span);
            let d = Diagnostic::new(
                codes::HISTORY_RANGE,
                format!(
                    "state `{state}` keeps {history} window{}, so index {ago} is out of range",
                    if history == 1 { "" } else { "s" }
                ),
                span,
                format!("valid indexes are 0..{}", history - 1),
            )
            .with_help(format!("declare more history: `state[{}] {state} {{ ... }}`", ago.saturating_add(1)));
            self.error(d);
            return error_expr();
        }
        let Some(ty) = ty else {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            self.unknown_field(&field.name, field.span, &format!("state `{state}`"), &names);
            return error_expr();
        };
        if range && ty != Type::Number && ty != Type::Error {
            self.error(Diagnostic::new(
                codes::TYPE_MISMATCH,
                format!("a range of windows needs a number field; `{}` is a {ty}", field.name),
                field.span,
                "not a number",
            ));
            return error_expr();
        }
        let index = names.iter().position(|n| *n == field.name).unwrap_or(0);
        typed(ty, TExprKind::StateField { state: state.to_string(), ago, field: field.name.clone(), index })
    }

    fn entity_field(&mut self, e: &Expr, var: &str, field: &Ident, scope: &Scope) -> TExpr {
        let info = &self.entities[var];
        let kind = info.kind;
        let bindings = info.bindings.clone();
        let sources: Vec<usize> = bindings.iter().map(|(s, _)| *s).collect();
        if !self.check_access(var, source_set(&sources), e.span, scope) {
            return error_expr();
        }
        if let Vars::GroupKeys = scope.vars {
            let grouped_entity = self.state.as_ref().is_some_and(|s| s.entity_keys.iter().any(|k| k == var));
            let ok = (grouped_entity && kind.key_fields().contains(&field.name.as_str())) || self.is_value_key(e);
            if !ok {
                self.not_a_key(&e.to_string(), e.span);
                return error_expr();
            }
        }
        let visible: Vec<(usize, Role)> = match scope.vars {
            Vars::Sources(allowed) => bindings.iter().copied().filter(|(s, _)| allowed.contains(s)).collect(),
            Vars::GroupKeys => bindings.clone(),
        };
        for (source, role) in &visible {
            let stream = self.sources[*source].stream;
            if let Some(f) = entity_fields(kind, stream, *role).iter().find(|f| **f == field.name) {
                let ty = stream.field(f).unwrap_or(Type::Str);
                let index = crate::event::field_position(stream, f);
                return typed(ty, TExprKind::EntityField { var: var.to_string(), source: *source, field: f, index });
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for (source, role) in &visible {
            for f in entity_fields(kind, self.sources[*source].stream, *role) {
                if !names.contains(f) {
                    names.push(f);
                }
            }
        }
        let mut d = Diagnostic::new(
            codes::UNKNOWN_FIELD,
            format!("unknown field `{}` on {} `{var}`", field.name, kind.name()),
            field.span,
            "no such field",
        )
        .with_help(suggestion(&field.name, &names));
        // The field may exist on the event rather than on the entity.
        if let Some((source, _)) = visible.first() {
            let src = &self.sources[*source];
            if src.stream.field(&field.name).is_some() {
                d = d.with_help(format!(
                    "`{}` is a field of the event: write `{}.{}`",
                    field.name, src.event_var, field.name
                ));
            }
        }
        self.error(d);
        error_expr()
    }

    fn unknown_field(&mut self, field: &str, span: Span, owner: &str, names: &[&str]) {
        self.error(
            Diagnostic::new(codes::UNKNOWN_FIELD, format!("unknown field `{field}` on {owner}"), span, "no such field")
                .with_help(suggestion(field, names)),
        );
    }

    fn index(&mut self, e: &Expr, base: &Expr, idx: &Expr, scope: &Scope) -> TExpr {
        if scope.state && self.is_state(base) {
            let ExprKind::Name(n) = &base.kind else { unreachable!() };
            let example =
                self.state.as_ref().and_then(|s| s.field_order.first().cloned()).unwrap_or_else(|| "field".into());
            self.error(
                Diagnostic::new(
                    codes::TYPE_MISMATCH,
                    format!("`{e}` is a whole window of state `{n}`"),
                    e.span,
                    "take a field",
                )
                .with_help(format!("write e.g. `{e}.{example}`")),
            );
            return error_expr();
        }
        let map = self.expr(base, scope);
        let key = self.expr(idx, scope);
        if map.ty == Type::Error {
            return error_expr();
        }
        if !compatible(map.ty, Type::Map) {
            self.error(
                Diagnostic::new(
                    codes::TYPE_MISMATCH,
                    format!("a {} cannot be indexed", map.ty),
                    base.span,
                    format!("this is a {}", map.ty),
                )
                .with_note("`x[\"key\"]` looks up a metric label; `ss[1]` is a past window of a state"),
            );
            return error_expr();
        }
        self.expect(key.ty, &[Type::Str], idx.span, "labels are looked up by name");
        typed(Type::Str, TExprKind::Lookup(Box::new(map), Box::new(key)))
    }

    fn call(&mut self, e: &Expr, name: &Ident, args: &[CallArg], scope: &Scope) -> TExpr {
        if let Some(named) = args.iter().find_map(|a| a.name.as_ref()) {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                format!("`{}` takes positional arguments", name.name),
                named.span,
                "named argument",
            ));
            return error_expr();
        }
        let targs: Vec<TExpr> = args.iter().map(|a| self.expr(&a.value, scope)).collect();
        let tys: Vec<Type> = targs.iter().map(|t| t.ty).collect();
        if tys.contains(&Type::Error) {
            return error_expr();
        }
        let n = name.name.as_str();
        let one_number = |f: Func| (tys.len() == 1 && compatible(tys[0], Type::Number)).then_some((f, Type::Number));
        let resolved = match n {
            "abs" => one_number(Func::Abs),
            "sqrt" => one_number(Func::Sqrt),
            "ln" => one_number(Func::Ln),
            "round" => one_number(Func::Round),
            "floor" => one_number(Func::Floor),
            "ceil" => one_number(Func::Ceil),
            "lower" | "upper" if tys.len() == 1 && compatible(tys[0], Type::Str) => {
                Some((if n == "lower" { Func::Lower } else { Func::Upper }, Type::Str))
            }
            "min" | "max" if tys.len() == 2 && compatible(tys[0], Type::Number) && compatible(tys[1], Type::Number) => {
                Some((if n == "min" { Func::Min2 } else { Func::Max2 }, Type::Number))
            }
            "avg" | "sum" | "min" | "max" | "stddev" | "count" if tys.len() == 1 && compatible(tys[0], Type::List) => {
                let f = match n {
                    "avg" => Func::ListAvg,
                    "sum" => Func::ListSum,
                    "min" => Func::ListMin,
                    "max" => Func::ListMax,
                    "stddev" => Func::ListStddev,
                    _ => Func::ListCount,
                };
                Some((f, Type::Number))
            }
            _ => None,
        };
        if let Some((func, ty)) = resolved {
            return typed(ty, TExprKind::Call(func, targs));
        }
        const FUNCS: [&str; 14] = [
            "abs", "sqrt", "ln", "round", "floor", "ceil", "lower", "upper", "min", "max", "avg", "sum", "stddev",
            "count",
        ];
        const REDUCTIONS: [&str; 6] = ["avg", "sum", "min", "max", "stddev", "count"];
        if REDUCTIONS.contains(&n) {
            let state = self.state.as_ref().map(|s| s.name.clone());
            let d = match state.filter(|_| scope.state) {
                Some(ss) => Diagnostic::new(
                    codes::AGGREGATE_CONTEXT,
                    format!("`{n}` here takes a range of past windows"),
                    e.span,
                    "not a range of windows",
                )
                .with_help(format!(
                    "write e.g. `{n}({ss}[1..3].field)`; to aggregate events, add a field to state `{ss}`"
                )),
                None => Diagnostic::new(
                    codes::AGGREGATE_CONTEXT,
                    format!("aggregate `{n}` used outside a state block"),
                    e.span,
                    "aggregates events",
                )
                .with_note("aggregates over events need a window and a `state` block")
                .with_help(format!(
                    "add a window and a state, e.g. `#time(5 min)` and `state ss {{ x := {n}(...) }}`, then use `ss.x`"
                )),
            };
            self.error(d);
            return error_expr();
        }
        if FUNCS.contains(&n) {
            let shown: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
            self.error(
                Diagnostic::new(
                    codes::ARGUMENTS,
                    format!("`{n}` cannot take ({})", shown.join(", ")),
                    e.span,
                    "wrong arguments",
                )
                .with_note(signature(n).to_string()),
            );
            return error_expr();
        }
        let mut all: Vec<&str> = FUNCS.to_vec();
        all.extend(AggFunc::NAMES);
        let d = if AggFunc::NAMES.contains(&n) {
            Diagnostic::new(
                codes::AGGREGATE_CONTEXT,
                format!("aggregate `{n}` used outside a state block"),
                name.span,
                "aggregates belong in `state`",
            )
            .with_help(format!("define it in the state, e.g. `state ss {{ x := {n}(...) }}`, then use `ss.x`"))
        } else {
            Diagnostic::new(codes::UNKNOWN_FUNCTION, format!("unknown function `{n}`"), name.span, "no such function")
                .with_help(suggestion(n, &all))
        };
        self.error(d);
        error_expr()
    }

    fn binary(&mut self, e: &Expr, op: BinOp, l: &Expr, r: &Expr, scope: &Scope) -> TExpr {
        let lt = self.expr(l, scope);
        let rt = self.expr(r, scope);
        let (a, b) = (lt.ty, rt.ty);
        if a == Type::Error || b == Type::Error {
            return TExpr { ty: Type::Error, kind: TExprKind::Binary(op, Box::new(lt), Box::new(rt)) };
        }
        use Type::*;
        let ty = match op {
            BinOp::And | BinOp::Or => {
                self.expect(a, &[Bool], l.span, &format!("`{}` joins conditions", op.symbol()));
                self.expect(b, &[Bool], r.span, &format!("`{}` joins conditions", op.symbol()));
                Some(Bool)
            }
            BinOp::Eq | BinOp::Ne => {
                let ok = match (a, b) {
                    (Entity(x), Entity(y)) => x == y,
                    (Entity(_), _) | (_, Entity(_)) => false,
                    (x, y) => x == y && matches!(x, Number | Str | Bool | Duration | Time | Set),
                };
                ok.then_some(Bool)
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                (a == b && matches!(a, Number | Duration | Time | Str)).then_some(Bool)
            }
            BinOp::Match | BinOp::Like => {
                self.expect(a, &[Str], l.span, &format!("`{}` matches strings", op.symbol()));
                match &r.kind {
                    ExprKind::Str(pattern) if op == BinOp::Match => {
                        if let Err(err) = regex::Regex::new(pattern) {
                            let msg = err.to_string();
                            let last = msg
                                .lines()
                                .last()
                                .unwrap_or("invalid")
                                .trim()
                                .trim_start_matches("error: ")
                                .to_string();
                            self.error(Diagnostic::new(codes::BAD_REGEX, "invalid regular expression", r.span, last));
                        }
                    }
                    ExprKind::Str(_) => {}
                    _ => self.error(
                        Diagnostic::new(
                            codes::TYPE_MISMATCH,
                            format!("the pattern after `{}` must be a string literal", op.symbol()),
                            r.span,
                            "not a literal",
                        )
                        .with_note("patterns are compiled once, when the rule loads"),
                    ),
                }
                Some(Bool)
            }
            BinOp::In | BinOp::NotIn => {
                let elem = match (&rt.kind, b) {
                    (TExprKind::List(items), Literals) => items.first().map(|i| i.ty),
                    (_, Set) => None,
                    _ => {
                        self.error(
                            Diagnostic::new(
                                codes::TYPE_MISMATCH,
                                format!("`{}` needs a list or a set on its right", op.symbol()),
                                r.span,
                                format!("this is a {b}"),
                            )
                            .with_help("write e.g. `e.type in [\"FAIL\", \"KILL\"]`"),
                        );
                        return error_expr();
                    }
                };
                if let Some(elem) = elem {
                    if !compatible(a, elem) {
                        self.error(Diagnostic::new(
                            codes::TYPE_MISMATCH,
                            format!("looking for a {a} in a list of {elem}s"),
                            e.span,
                            "types differ",
                        ));
                    }
                }
                Some(Bool)
            }
            BinOp::Union | BinOp::Diff | BinOp::Intersect => (a == Set && b == Set).then_some(Set),
            BinOp::Add | BinOp::Sub => match (a, b) {
                (Number, Number) => Some(Number),
                (Duration, Duration) => Some(Duration),
                (Time, Duration) => Some(Time),
                (Time, Time) if op == BinOp::Sub => Some(Duration),
                _ => None,
            },
            BinOp::Mul => match (a, b) {
                (Number, Number) => Some(Number),
                (Number, Duration) | (Duration, Number) => Some(Duration),
                _ => None,
            },
            BinOp::Div => match (a, b) {
                (Number, Number) | (Duration, Duration) => Some(Number),
                (Duration, Number) => Some(Duration),
                _ => None,
            },
            BinOp::Rem => (a == Number && b == Number).then_some(Number),
        };
        let Some(ty) = ty else {
            let mut d = Diagnostic::new(
                codes::TYPE_MISMATCH,
                format!("`{}` cannot combine a {a} and a {b}", op.symbol()),
                e.span,
                format!("{a} {} {b}", op.symbol()),
            );
            if (a == Number && b == Duration) || (a == Duration && b == Number) {
                d = d.with_help("give the number a unit, e.g. `5 min`");
            } else if a == Set || b == Set {
                d = d.with_help("compare the size of a set with `|s|`, or combine sets with union, diff, intersect");
            }
            self.error(d);
            return error_expr();
        };
        TExpr { ty, kind: TExprKind::Binary(op, Box::new(lt), Box::new(rt)) }
    }
}

/// A name given a second time: the diagnostic points at the repeat and back at the first.
fn twice(message: String, again: Span, first: Span) -> Diagnostic {
    Diagnostic::new(codes::DUPLICATE_NAME, message, again, "again here").with_secondary(first, "first here")
}

fn typed(ty: Type, kind: TExprKind) -> TExpr {
    TExpr { ty, kind }
}

fn error_expr() -> TExpr {
    TExpr { ty: Type::Error, kind: TExprKind::Bool(false) }
}

fn compatible(a: Type, b: Type) -> bool {
    a == b || a == Type::Error || b == Type::Error
}

fn source_set(sources: &[usize]) -> HashSet<usize> {
    sources.iter().copied().collect()
}

fn info_first_field(stream: Stream) -> &'static str {
    stream.fields().iter().find(|(_, t)| *t == Type::Number).map_or("ts", |(n, _)| n)
}

/// The catalogue's own `&'static str` for a field name known to exist.
fn static_field(stream: Stream, field: &str) -> &'static str {
    if field == "ts" {
        return "ts";
    }
    stream.fields().iter().find(|(n, _)| *n == field).map_or("ts", |(n, _)| n)
}

fn placeholder_source(event: &str, stream: Stream, kind: EntityKind, subject: &str) -> SourcePlan {
    SourcePlan {
        event_var: event.to_string(),
        stream,
        event_type: None,
        subject: (kind, subject.to_string()),
        object: None,
        filter: None,
    }
}

fn signature(name: &str) -> &'static str {
    match name {
        "lower" | "upper" => "it takes one string",
        "min" | "max" => "it takes two numbers, or a range of windows such as `ss[1..3].cpu`",
        _ => "it takes one number",
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// The smallest round slide that divides `size` and keeps at most [`MAX_OPEN_WINDOWS`]
/// windows open (`size` itself at worst).
fn coarser_slide(size: u64) -> u64 {
    const ROUND: [u64; 14] = [1, 5, 10, 15, 30, 60, 300, 600, 900, 1_800, 3_600, 7_200, 21_600, 86_400];
    ROUND.iter().map(|s| s * 1_000).find(|&slide| size % slide == 0 && size / slide <= MAX_OPEN_WINDOWS).unwrap_or(size)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
