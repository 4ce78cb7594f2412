//! What the engine runs: a checked rule with every name bound and every type known.
//!
//! `Display` prints a plan as an indented tree; `vigil explain` shows it and tests snapshot it.
//! A plan is one of the kinds of model ([`ModelPlan`]), each with exactly the parts it runs
//! on, so that no invalid mix can reach the engine; and it has an identity ([`RulePlan::state_id`])
//! that says which state it keeps, taken from its structure rather than from how it prints.

use crate::ast::{format_duration, BinOp, HoleFormat, InvariantMode, UnaryOp};
use crate::schema::{EntityKind, Stream, Type};
use serde::Serialize;
use std::fmt;

mod alert;
mod score;
mod source;
mod state;
pub use alert::{AlertPlan, RollupPlan};
pub use score::{ScorePlan, ScoreSlot, ScoreStep, ScorerSpec};
pub use state::{AggFunc, GroupKey, StateFieldPlan, StatePlan};

#[derive(Debug, Clone, PartialEq)]
pub struct RulePlan {
    pub name: String,
    pub description: Option<String>,
    pub sources: Vec<SourcePlan>,
    pub model: ModelPlan,
    pub alert: AlertPlan,
    pub labels: Vec<(String, Vec<TemplatePiece>)>,
    pub annotations: Vec<(String, Vec<TemplatePiece>)>,
    pub returns: Vec<(String, TExpr)>,
}

/// What a rule computes, by kind of model; each kind carries exactly what it runs on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum ModelPlan {
    /// One pattern and its filter.
    SingleEvent,
    /// Several patterns related in time.
    Sequence(SequencePlan),
    /// Windowed state judged against its own history.
    TimeSeries(WindowedPlan),
    /// Windowed state judged against a baseline learned over the first windows.
    Invariant(WindowedPlan, InvariantPlan),
    /// Windowed state judged against its peers' in the same window.
    Outlier(WindowedPlan, ClusterPlan),
    /// Windowed state judged by streaming anomaly scorers over each group's own past.
    Scored(WindowedPlan, ScorePlan),
}

/// The window over a rule's single pattern and the state kept per group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowedPlan {
    pub window: WindowPlan,
    pub state: StatePlan,
}

impl ModelPlan {
    /// The kind of model, for people and the API.
    pub fn kind(&self) -> Model {
        match self {
            ModelPlan::SingleEvent => Model::SingleEvent,
            ModelPlan::Sequence(_) => Model::Sequence,
            ModelPlan::TimeSeries(_) | ModelPlan::Scored(..) => Model::TimeSeries,
            ModelPlan::Invariant(..) => Model::Invariant,
            ModelPlan::Outlier(..) => Model::Outlier,
        }
    }

    pub fn windowed(&self) -> Option<&WindowedPlan> {
        match self {
            ModelPlan::TimeSeries(w)
            | ModelPlan::Invariant(w, _)
            | ModelPlan::Outlier(w, _)
            | ModelPlan::Scored(w, _) => Some(w),
            ModelPlan::SingleEvent | ModelPlan::Sequence(_) => None,
        }
    }

    pub fn scores(&self) -> Option<&ScorePlan> {
        match self {
            ModelPlan::Scored(_, s) => Some(s),
            _ => None,
        }
    }

    pub fn invariant(&self) -> Option<&InvariantPlan> {
        match self {
            ModelPlan::Invariant(_, inv) => Some(inv),
            _ => None,
        }
    }

    pub fn cluster(&self) -> Option<&ClusterPlan> {
        match self {
            ModelPlan::Outlier(_, c) => Some(c),
            _ => None,
        }
    }
}

/// Which state a rule keeps: a hash of what its state depends on (its patterns, its model, its
/// alert condition and timing), not of its description, labels, annotations, severity or
/// returned values, and not of how the plan prints. Operators and checkpoints are keyed by it:
/// a rule edited only in those keeps its windows, matches and active alerts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct StateId(pub String);

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stable hash of a value's structure: its postcard bytes, hashed.
pub fn structural_hash(value: &impl Serialize) -> String {
    let bytes = postcard::to_stdvec(value).unwrap_or_default();
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))
}

impl RulePlan {
    pub fn kind(&self) -> Model {
        self.model.kind()
    }

    /// Whether the rule alerts on silence: a sequence that ends in an absence (`-> not e2 for
    /// D`), whose alerts say that events stopped, not what they said.
    pub fn judges_silence(&self) -> bool {
        self.sequence().is_some_and(|seq| seq.steps.last().is_some_and(|s| s.kind.is_absence()))
    }

    pub fn sequence(&self) -> Option<&SequencePlan> {
        match &self.model {
            ModelPlan::Sequence(seq) => Some(seq),
            _ => None,
        }
    }

    /// Every expression of the plan, for passes such as regex compilation.
    pub fn exprs(&self) -> Vec<&TExpr> {
        let mut out: Vec<&TExpr> = Vec::new();
        out.extend(self.sources.iter().filter_map(|s| s.filter.as_ref()));
        match &self.model {
            ModelPlan::SingleEvent => {}
            ModelPlan::Sequence(seq) => out.extend(seq.conditions.iter().chain(&seq.group_by).chain(&seq.bounds)),
            ModelPlan::TimeSeries(w)
            | ModelPlan::Invariant(w, _)
            | ModelPlan::Outlier(w, _)
            | ModelPlan::Scored(w, _) => {
                out.extend(w.state.fields.iter().filter_map(|f| f.arg.as_ref()));
                out.extend(w.state.group_by.iter().filter_map(|k| match k {
                    GroupKey::Value(e) => Some(e),
                    GroupKey::Entity { .. } => None,
                }));
            }
        }
        if let Some(inv) = self.model.invariant() {
            out.extend(inv.init.iter().chain(&inv.update).map(|(_, e)| e));
        }
        if let Some(c) = self.model.cluster() {
            out.extend(c.dims.iter().chain(&c.per));
        }
        if let Some(s) = self.model.scores() {
            out.extend(s.slots.iter().map(|slot| slot.input()));
        }
        out.push(&self.alert.condition);
        for (_, pieces) in self.labels.iter().chain(&self.annotations) {
            out.extend(pieces.iter().filter_map(|piece| match piece {
                TemplatePiece::Value(e, _) => Some(e),
                TemplatePiece::Text(_) => None,
            }));
        }
        out.extend(self.returns.iter().map(|(_, e)| e));
        out
    }

    /// The identity of the state this rule keeps; see [`StateId`].
    pub fn state_id(&self) -> StateId {
        #[derive(Serialize)]
        struct Identity<'a> {
            name: &'a str,
            sources: &'a [SourcePlan],
            model: &'a ModelPlan,
            condition: &'a TExpr,
            for_ms: u64,
            keep_firing_for_ms: u64,
            // Left out while every version is 0, so that the identities of rules over kinds
            // whose keys never changed stay what earlier versions stored.
            #[serde(skip_serializing_if = "Vec::is_empty")]
            key_versions: Vec<(EntityKind, u32)>,
            // Likewise for scorers whose state changed ([`ScorerSpec::state_version`]).
            #[serde(skip_serializing_if = "Vec::is_empty")]
            scorer_versions: Vec<(&'static str, u32)>,
        }
        let mut key_versions: Vec<(EntityKind, u32)> = Vec::new();
        for s in &self.sources {
            for kind in std::iter::once(s.subject.0).chain(s.object.as_ref().map(|o| o.0)) {
                if kind.key_version() > 0 && !key_versions.iter().any(|(k, _)| *k == kind) {
                    key_versions.push((kind, kind.key_version()));
                }
            }
        }
        let scorer_versions =
            if let ModelPlan::Scored(_, score) = &self.model { score.state_versions() } else { vec![] };
        StateId(structural_hash(&Identity {
            name: &self.name,
            sources: &self.sources,
            model: &self.model,
            condition: &self.alert.condition,
            for_ms: self.alert.for_ms,
            keep_firing_for_ms: self.alert.keep_firing_for_ms,
            key_versions,
            scorer_versions,
        }))
    }
}

/// The kinds of anomaly model of SAQL; a rule is of exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// One event pattern and a filter.
    SingleEvent,
    /// Several patterns related in time (`with`).
    Sequence,
    TimeSeries,
    Invariant,
    Outlier,
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Model::SingleEvent => "rule-based, single event",
            Model::Sequence => "rule-based, event sequence",
            Model::TimeSeries => "time-series",
            Model::Invariant => "invariant-based",
            Model::Outlier => "outlier-based",
        })
    }
}

/// One event pattern: which events it selects and which variables it binds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourcePlan {
    pub event_var: String,
    pub stream: Stream,
    /// The `type` the operation selects (`fail` selects `FAIL`); `None` takes every event.
    pub event_type: Option<&'static str>,
    pub subject: (EntityKind, String),
    pub object: Option<(EntityKind, String)>,
    pub filter: Option<TExpr>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SequencePlan {
    pub steps: Vec<StepPlan>,
    /// Bound on a whole positive match, first event to last.
    pub within_ms: Option<u64>,
    /// Entity variables shared by several steps: the implicit joins.
    pub joins: Vec<(String, EntityKind, Vec<usize>)>,
    pub group_by: Vec<TExpr>,
    pub conditions: Vec<TExpr>,
    /// Absence bounds that are expressions (`StepKind::AbsentFor`). Left out of the structure
    /// when empty, so that the state identity of rules without them is what it was before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bounds: Vec<TExpr>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPlan {
    /// Index into `RulePlan::sources`.
    pub source: usize,
    pub kind: StepKind,
}

/// What one step of a sequence waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StepKind {
    /// The event occurs once.
    Once,
    /// The event occurs at least `min` times (`e{5,}`).
    Count { min: u64 },
    /// The event does not occur for this many milliseconds after the previous step.
    Absent(u64),
    /// The same, for as long as the sequence's bound of this index says when the step before
    /// binds (it may read the partition's usual interval).
    AbsentFor(usize),
}

impl StepKind {
    pub fn is_absence(&self) -> bool {
        matches!(self, StepKind::Absent(_) | StepKind::AbsentFor(_))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WindowPlan {
    pub size_ms: u64,
    /// Equal to `size_ms` for a tumbling window.
    pub slide_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InvariantPlan {
    pub training_windows: u64,
    pub mode: InvariantMode,
    /// Evaluated on the first training window of a group.
    pub init: Vec<(String, TExpr)>,
    /// Evaluated on every training window (and, online, on every window after).
    pub update: Vec<(String, TExpr)>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterPlan {
    pub dims: Vec<TExpr>,
    pub per: Vec<TExpr>,
    pub method: ClusterMethod,
    pub distance: Distance,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum ClusterMethod {
    Dbscan {
        eps: f64,
        min_pts: u64,
    },
    /// Robust z-score from the median absolute deviation above this threshold.
    Mad {
        threshold: f64,
    },
    /// Classic z-score above this threshold.
    ZScore {
        threshold: f64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Distance {
    Euclidean,
    Manhattan,
    Chebyshev,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TemplatePiece {
    Text(String),
    /// A value, shown in a format.
    Value(TExpr, HoleFormat),
}

/// A typed expression with resolved references.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TExpr {
    pub ty: Type,
    pub kind: TExprKind,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum TExprKind {
    Number(f64),
    Str(String),
    Bool(bool),
    Duration(u64),
    EmptySet,
    List(Vec<TExpr>),
    /// `e.cpu`: a field of the event bound by source `source`, at `index` in its stream's
    /// fields ([`crate::schema::TS_INDEX`] for `ts`).
    EventField {
        var: String,
        source: usize,
        field: &'static str,
        index: usize,
    },
    /// `t.user`: a field of an entity, read from the event of source `source`.
    EntityField {
        var: String,
        source: usize,
        field: &'static str,
        index: usize,
    },
    /// A whole entity, compared by its key (`m1 != m2`).
    Entity {
        var: String,
        kind: EntityKind,
    },
    /// `ss[ago].field`; `index` is the field's position in the state.
    StateField {
        state: String,
        ago: usize,
        field: String,
        index: usize,
    },
    /// `ss[from..to].field`, oldest last.
    StateRange {
        state: String,
        from: usize,
        to: usize,
        field: String,
        index: usize,
    },
    Baseline(String),
    ClusterField(&'static str),
    Call(Func, Vec<TExpr>),
    Unary(UnaryOp, Box<TExpr>),
    Binary(BinOp, Box<TExpr>, Box<TExpr>),
    /// `labels["env"]`.
    Lookup(Box<TExpr>, Box<TExpr>),
    Cardinality(Box<TExpr>),
    // Variants are added at the end: a plan's structure, variant numbers included, is the
    // identity of the state its rule keeps (`StateId`).
    /// A slot of the rule's `score` block: its index, and its name or how it was computed.
    Score {
        slot: usize,
        name: String,
    },
    /// The usual time between events of the first step in the match's partition (a sequence's
    /// absence bound): the `quantile` of its recent gaps.
    Interval {
        source: usize,
        quantile: f64,
    },
}

/// Functions outside state blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Func {
    Abs,
    Sqrt,
    Ln,
    Round,
    Floor,
    Ceil,
    Lower,
    Upper,
    /// Two-argument minimum and maximum.
    Min2,
    Max2,
    /// Reductions over a history range.
    ListAvg,
    ListSum,
    ListMin,
    ListMax,
    ListStddev,
    ListCount,
    /// The first of two values that is present: `coalesce(e.kind, "")`.
    Coalesce,
}

impl Func {
    pub fn name(self) -> &'static str {
        match self {
            Func::Abs => "abs",
            Func::Sqrt => "sqrt",
            Func::Ln => "ln",
            Func::Round => "round",
            Func::Floor => "floor",
            Func::Ceil => "ceil",
            Func::Lower => "lower",
            Func::Upper => "upper",
            Func::Min2 | Func::ListMin => "min",
            Func::Max2 | Func::ListMax => "max",
            Func::ListAvg => "avg",
            Func::ListSum => "sum",
            Func::ListStddev => "stddev",
            Func::ListCount => "count",
            Func::Coalesce => "coalesce",
        }
    }
}

impl fmt::Display for TExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_texpr(f, self, 0)
    }
}

fn write_texpr(f: &mut fmt::Formatter<'_>, e: &TExpr, parent: u8) -> fmt::Result {
    match &e.kind {
        TExprKind::Number(n) => write!(f, "{n}"),
        TExprKind::Str(s) => write!(f, "{s:?}"),
        TExprKind::Bool(b) => write!(f, "{b}"),
        TExprKind::Duration(ms) => f.write_str(&format_duration(*ms)),
        TExprKind::EmptySet => f.write_str("empty_set"),
        TExprKind::List(items) => {
            f.write_str("[")?;
            write_args(f, items)?;
            f.write_str("]")
        }
        TExprKind::EventField { var, field, .. } | TExprKind::EntityField { var, field, .. } => {
            write!(f, "{var}.{field}")
        }
        TExprKind::Entity { var, .. } => f.write_str(var),
        TExprKind::StateField { state, ago, field, .. } => write!(f, "{state}[{ago}].{field}"),
        TExprKind::StateRange { state, from, to, field, .. } => write!(f, "{state}[{from}..{to}].{field}"),
        TExprKind::Baseline(name) | TExprKind::Score { name, .. } => f.write_str(name),
        TExprKind::Interval { quantile, .. } if *quantile == 0.5 => f.write_str("interval()"),
        TExprKind::Interval { quantile, .. } => write!(f, "interval(q = {quantile})"),
        TExprKind::ClusterField(field) => write!(f, "cluster.{field}"),
        TExprKind::Call(func, args) => {
            write!(f, "{}(", func.name())?;
            write_args(f, args)?;
            f.write_str(")")
        }
        TExprKind::Unary(UnaryOp::Not, inner) => {
            if parent > 3 {
                write!(f, "(not ")?;
                write_texpr(f, inner, 3)?;
                f.write_str(")")
            } else {
                f.write_str("not ")?;
                write_texpr(f, inner, 3)
            }
        }
        TExprKind::Unary(UnaryOp::Neg, inner) => {
            f.write_str("-")?;
            write_texpr(f, inner, 8)
        }
        TExprKind::Binary(op, l, r) => {
            let prec = op.precedence();
            if prec < parent {
                f.write_str("(")?;
            }
            write_texpr(f, l, prec)?;
            write!(f, " {} ", op.symbol())?;
            write_texpr(f, r, prec + 1)?;
            if prec < parent {
                f.write_str(")")?;
            }
            Ok(())
        }
        TExprKind::Lookup(map, key) => {
            write_texpr(f, map, 9)?;
            write!(f, "[{key}]")
        }
        TExprKind::Cardinality(inner) => write!(f, "|{inner}|"),
    }
}

fn write_args(f: &mut fmt::Formatter<'_>, items: &[TExpr]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

impl fmt::Display for RulePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rule {} ({})", self.name, self.kind())?;
        if let Some(d) = &self.description {
            writeln!(f, "  description: {d}")?;
        }
        self.write_sources(f)?;
        self.write_model(f)?;
        self.write_outputs(f)
    }
}

impl RulePlan {
    fn write_sources(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.sources.iter().enumerate() {
            write!(f, "  source #{i} {}: {}", s.event_var, s.stream.name())?;
            if let Some(t) = s.event_type {
                write!(f, " where type == {t:?}")?;
            }
            write!(f, "\n    subject {} {}", s.subject.0.name(), s.subject.1)?;
            if let Some((kind, var)) = &s.object {
                write!(f, ", object {} {var}", kind.name())?;
            }
            writeln!(f)?;
            if let Some(filter) = &s.filter {
                writeln!(f, "    filter {filter}")?;
            }
        }
        Ok(())
    }

    fn write_model(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(seq) = self.sequence() {
            writeln!(f, "  sequence")?;
            for step in &seq.steps {
                let var = &self.sources[step.source].event_var;
                match step.kind {
                    StepKind::Once => writeln!(f, "    then {var}")?,
                    StepKind::Count { min } => writeln!(f, "    then {var} at least {min} times")?,
                    StepKind::Absent(ms) => writeln!(f, "    then no {var} for {}", format_duration(ms))?,
                    StepKind::AbsentFor(i) => {
                        let bound = seq.bounds.get(i).map(|b| b.to_string()).unwrap_or_default();
                        writeln!(f, "    then no {var} for {bound}")?
                    }
                }
            }
            if let Some(ms) = seq.within_ms {
                writeln!(f, "    within {}", format_duration(ms))?;
            }
            for (var, kind, sources) in &seq.joins {
                let events: Vec<&str> = sources.iter().map(|&i| self.sources[i].event_var.as_str()).collect();
                writeln!(f, "    join {} {var} across {}", kind.name(), events.join(", "))?;
            }
            if !seq.group_by.is_empty() {
                writeln!(f, "    partition by {}", join(&seq.group_by))?;
            }
            for c in &seq.conditions {
                writeln!(f, "    where {c}")?;
            }
        }
        if let Some(WindowedPlan { window: w, state: s }) = self.model.windowed() {
            if w.slide_ms == w.size_ms {
                writeln!(f, "  window tumbling {}", format_duration(w.size_ms))?;
            } else {
                writeln!(f, "  window sliding {} every {}", format_duration(w.size_ms), format_duration(w.slide_ms))?;
            }
            write!(f, "{s}")?;
        }
        if let Some(inv) = self.model.invariant() {
            let mode = match inv.mode {
                InvariantMode::Offline => "offline",
                InvariantMode::Online => "online",
            };
            writeln!(f, "  invariant {mode}, trained over {} windows", inv.training_windows)?;
            for (name, e) in &inv.init {
                writeln!(f, "    init {name} := {e} : {}", e.ty)?;
            }
            for (name, e) in &inv.update {
                writeln!(f, "    update {name} = {e}")?;
            }
        }
        if let Some(scores) = self.model.scores() {
            writeln!(f, "  score, at each window with events")?;
            for (i, slot) in scores.slots.iter().enumerate() {
                let name = slot.name.clone().unwrap_or_else(|| format!("${i}"));
                match &slot.step {
                    ScoreStep::Expr(e) => writeln!(f, "    {name} := {e} : {}", e.ty)?,
                    ScoreStep::Scorer(spec, input) => {
                        let params: Vec<String> = spec.params().iter().map(|(n, v)| format!(", {n}={v}")).collect();
                        writeln!(f, "    {name} := {}({input}{}) : number", spec.name(), params.join(""))?
                    }
                }
            }
        }
        if let Some(c) = self.model.cluster() {
            let method = match c.method {
                ClusterMethod::Dbscan { eps, min_pts } => format!("DBSCAN(eps={eps}, minpts={min_pts})"),
                ClusterMethod::Mad { threshold } => format!("MAD(threshold={threshold})"),
                ClusterMethod::ZScore { threshold } => format!("z-score(threshold={threshold})"),
            };
            writeln!(f, "  cluster {method}, distance {:?}", c.distance)?;
            writeln!(f, "    points {}", join(&c.dims))?;
            if !c.per.is_empty() {
                writeln!(f, "    peer groups by {}", join(&c.per))?;
            }
        }
        Ok(())
    }

    fn write_outputs(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.alert;
        writeln!(f, "  alert when {}", a.condition)?;
        writeln!(
            f,
            "    severity {}, for {}, keep firing for {}",
            a.severity,
            format_duration(a.for_ms),
            format_duration(a.keep_firing_for_ms)
        )?;
        if a.refractory_ms > 0 {
            writeln!(f, "    refractory {}", format_duration(a.refractory_ms))?;
        }
        if let Some(r) = &a.rollup {
            writeln!(f, "  rollup by {}, severity {}", r.by, r.severity)?;
        }
        for (title, fields) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if fields.is_empty() {
                continue;
            }
            writeln!(f, "  {title}")?;
            for (name, pieces) in fields {
                let text: String = pieces
                    .iter()
                    .map(|p| match p {
                        TemplatePiece::Text(t) => t.clone(),
                        TemplatePiece::Value(e, format) => format!("{{{e}{format}}}"),
                    })
                    .collect();
                writeln!(f, "    {name} = {text:?}")?;
            }
        }
        writeln!(f, "  return")?;
        for (name, e) in &self.returns {
            writeln!(f, "    {name} = {e} : {}", e.ty)?;
        }
        Ok(())
    }
}

fn join(items: &[TExpr]) -> String {
    items.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")
}
