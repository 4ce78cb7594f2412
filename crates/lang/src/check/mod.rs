//! The checker: resolves names, checks types and bounds, and turns each rule of the AST into a
//! [`RulePlan`]. It reports every problem it finds; a rule with any problem yields no plan.

use crate::ast::{self, *};
use crate::diagnostic::{codes, suggestion, Diagnostic};
use crate::plan::{self, *};
use crate::schema::{self, Catalog, EntityKind, Role, Stream, Type};
use std::collections::{HashMap, HashSet};

mod bind;
mod expr;
mod model;
mod scope;
mod score;
mod state;

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
/// are in the diagnostics, together with duplicate rule names. Patterns are resolved against
/// `catalog`: the rule set's streams and kinds.
pub fn check(file: &ast::File, catalog: &Catalog) -> (Vec<RulePlan>, Vec<Diagnostic>) {
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
        let mut checker = RuleChecker::new(rule, catalog);
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
    /// Whether the rule's score names are visible.
    scores: bool,
    special: Special,
}

impl<'s> Scope<'s> {
    /// A scope of `vars` that sees no state, baseline, cluster or score.
    fn new(place: &'static str, vars: Vars<'s>) -> Self {
        Scope { place, vars, state: false, baselines: false, cluster: false, scores: false, special: Special::None }
    }
}

/// Calls that only some places take.
#[derive(Clone, Copy, PartialEq)]
enum Special {
    None,
    /// Scorer calls: in a `score` block.
    Scorers,
    /// `interval(e)` of the given source: in an absence's bound.
    Interval(usize),
}

struct RuleChecker<'a> {
    rule: &'a RuleDecl,
    catalog: &'a Catalog,
    diags: Vec<Diagnostic>,
    sources: Vec<SourcePlan>,
    events: HashMap<String, EventInfo>,
    entities: HashMap<String, EntityInfo>,
    /// Entity variables in order of first binding, for default returns.
    entity_order: Vec<String>,
    state: Option<StateInfo>,
    baselines: HashMap<String, Type>,
    has_cluster: bool,
    /// The `score` block's slots so far, and the slot of each name it gives.
    score_slots: Vec<ScoreSlot>,
    score_names: HashMap<String, usize>,
}

impl<'a> RuleChecker<'a> {
    fn new(rule: &'a RuleDecl, catalog: &'a Catalog) -> Self {
        RuleChecker {
            rule,
            catalog,
            diags: Vec::new(),
            sources: Vec::new(),
            events: HashMap::new(),
            entities: HashMap::new(),
            entity_order: Vec::new(),
            state: None,
            baselines: HashMap::new(),
            has_cluster: false,
            score_slots: Vec::new(),
            score_names: HashMap::new(),
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
                    scores: false,
                    special: Special::None,
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
        let scores = self.score_clause();

        let positive: Vec<usize> = match &sequence {
            Some(seq) => seq.steps.iter().filter(|s| !s.kind.is_absence()).map(|s| s.source).collect(),
            None => (0..self.sources.len()).collect(),
        };
        let scope = self.output_scope(&positive);
        let mut alert = self.alert(&scope);
        alert.rollup = self.rollup(state.as_ref());
        let labels = self.templates(&r.labels, "label", &scope);
        let annotations = self.templates(&r.annotations, "annotation", &scope);
        let returns = self.returns(&scope, &positive, state.as_ref());

        if self.sources.len() > 1 && sequence.is_none() {
            return None;
        }
        let model = assemble(sequence, window, state, invariant, cluster, scores)?;
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
}

/// The model of a rule from its checked clauses: the combinations `mixing_checks` and the
/// clauses' own checks let through; any other has been reported.
fn assemble(
    sequence: Option<SequencePlan>,
    window: Option<WindowPlan>,
    state: Option<StatePlan>,
    invariant: Option<InvariantPlan>,
    cluster: Option<ClusterPlan>,
    scores: Option<ScorePlan>,
) -> Option<ModelPlan> {
    Some(match (sequence, window, state, invariant, cluster, scores) {
        (None, None, None, None, None, None) => ModelPlan::SingleEvent,
        (Some(seq), None, None, None, None, None) => ModelPlan::Sequence(seq),
        (None, Some(window), Some(state), None, None, None) => ModelPlan::TimeSeries(WindowedPlan { window, state }),
        (None, Some(window), Some(state), Some(inv), None, None) => {
            ModelPlan::Invariant(WindowedPlan { window, state }, inv)
        }
        (None, Some(window), Some(state), None, Some(c), None) => ModelPlan::Outlier(WindowedPlan { window, state }, c),
        (None, Some(window), Some(state), None, None, Some(s)) => ModelPlan::Scored(WindowedPlan { window, state }, s),
        _ => return None,
    })
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
