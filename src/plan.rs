//! What the engine runs: a checked rule with every name bound and every type known.
//!
//! `Display` prints a plan as an indented tree; `vigil explain` shows it and tests snapshot it.

use crate::ast::{format_duration, BinOp, InvariantMode, StepKind, UnaryOp};
use crate::schema::{EntityKind, Stream, Type};
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub struct RulePlan {
    pub name: String,
    pub description: Option<String>,
    pub model: Model,
    pub sources: Vec<SourcePlan>,
    pub sequence: Option<SequencePlan>,
    pub window: Option<WindowPlan>,
    pub state: Option<StatePlan>,
    pub invariant: Option<InvariantPlan>,
    pub cluster: Option<ClusterPlan>,
    pub alert: AlertPlan,
    pub labels: Vec<(String, Vec<TemplatePiece>)>,
    pub annotations: Vec<(String, Vec<TemplatePiece>)>,
    pub returns: Vec<(String, TExpr)>,
}

/// The four kinds of anomaly model of SAQL; a rule is of exactly one.
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
#[derive(Debug, Clone, PartialEq)]
pub struct SourcePlan {
    pub event_var: String,
    pub stream: Stream,
    /// The `type` the operation selects (`fail` selects `FAIL`); `None` takes every event.
    pub event_type: Option<&'static str>,
    pub subject: (EntityKind, String),
    pub object: Option<(EntityKind, String)>,
    pub filter: Option<TExpr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SequencePlan {
    pub steps: Vec<StepPlan>,
    /// Bound on a whole positive match, first event to last.
    pub within_ms: Option<u64>,
    /// Entity variables shared by several steps: the implicit joins.
    pub joins: Vec<(String, EntityKind, Vec<usize>)>,
    pub group_by: Vec<TExpr>,
    pub conditions: Vec<TExpr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    /// Index into `RulePlan::sources`.
    pub source: usize,
    pub kind: StepKind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowPlan {
    pub size_ms: u64,
    /// Equal to `size_ms` for a tumbling window.
    pub slide_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StatePlan {
    pub name: String,
    /// Windows kept per group, the current one included.
    pub history: usize,
    pub fields: Vec<StateFieldPlan>,
    pub group_by: Vec<GroupKey>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StateFieldPlan {
    pub name: String,
    pub agg: AggFunc,
    pub arg: Option<TExpr>,
    pub ty: Type,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AggFunc {
    Count,
    Sum,
    Avg,
    Min,
    Max,
    Stddev,
    /// Percentile 0..=100.
    Percentile(f64),
    DistinctCount,
    Set,
    First,
    Last,
}

impl AggFunc {
    pub const NAMES: [&'static str; 11] =
        ["count", "sum", "avg", "min", "max", "stddev", "percentile", "distinct_count", "set", "first", "last"];
}

impl fmt::Display for AggFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            AggFunc::Count => "count",
            AggFunc::Sum => "sum",
            AggFunc::Avg => "avg",
            AggFunc::Min => "min",
            AggFunc::Max => "max",
            AggFunc::Stddev => "stddev",
            AggFunc::Percentile(_) => "percentile",
            AggFunc::DistinctCount => "distinct_count",
            AggFunc::Set => "set",
            AggFunc::First => "first",
            AggFunc::Last => "last",
        };
        f.write_str(name)
    }
}

/// What a group is keyed by: a whole entity (its key fields) or one value.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupKey {
    Entity { var: String, kind: EntityKind },
    Value(TExpr),
}

#[derive(Debug, Clone, PartialEq)]
pub struct InvariantPlan {
    pub training_windows: u64,
    pub mode: InvariantMode,
    /// Evaluated on the first training window of a group.
    pub init: Vec<(String, TExpr)>,
    /// Evaluated on every training window (and, online, on every window after).
    pub update: Vec<(String, TExpr)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClusterPlan {
    pub dims: Vec<TExpr>,
    pub per: Vec<TExpr>,
    pub method: ClusterMethod,
    pub distance: Distance,
}

#[derive(Debug, Clone, Copy, PartialEq)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distance {
    Euclidean,
    Manhattan,
    Chebyshev,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AlertPlan {
    pub condition: TExpr,
    pub severity: &'static str,
    pub for_ms: u64,
    pub keep_firing_for_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TemplatePiece {
    Text(String),
    Value(TExpr),
}

/// A typed expression with resolved references.
#[derive(Debug, Clone, PartialEq)]
pub struct TExpr {
    pub ty: Type,
    pub kind: TExprKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TExprKind {
    Number(f64),
    Str(String),
    Bool(bool),
    Duration(u64),
    EmptySet,
    List(Vec<TExpr>),
    /// `e.cpu`: a field of the event bound by source `source`, at `index` in its stream's
    /// fields ([`crate::event::TS_INDEX`] for `ts`).
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
}

/// Functions outside state blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        TExprKind::Baseline(name) => f.write_str(name),
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
        writeln!(f, "rule {} ({})", self.name, self.model)?;
        if let Some(d) = &self.description {
            writeln!(f, "  description: {d}")?;
        }
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
        if let Some(seq) = &self.sequence {
            writeln!(f, "  sequence")?;
            for step in &seq.steps {
                let var = &self.sources[step.source].event_var;
                match step.kind {
                    StepKind::Once => writeln!(f, "    then {var}")?,
                    StepKind::Count { min } => writeln!(f, "    then {var} at least {min} times")?,
                    StepKind::Absent(d) => writeln!(f, "    then no {var} for {}", format_duration(d.millis))?,
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
        if let Some(w) = &self.window {
            if w.slide_ms == w.size_ms {
                writeln!(f, "  window tumbling {}", format_duration(w.size_ms))?;
            } else {
                writeln!(f, "  window sliding {} every {}", format_duration(w.size_ms), format_duration(w.slide_ms))?;
            }
        }
        if let Some(s) = &self.state {
            let keys: Vec<String> = s
                .group_by
                .iter()
                .map(|k| match k {
                    GroupKey::Entity { var, kind } => format!("{var} ({})", kind.key_fields().join(", ")),
                    GroupKey::Value(e) => e.to_string(),
                })
                .collect();
            write!(f, "  state {}[{}]", s.name, s.history)?;
            if keys.is_empty() {
                writeln!(f, " (one global group)")?;
            } else {
                writeln!(f, " group by {}", keys.join(", "))?;
            }
            for field in &s.fields {
                let arg = field.arg.as_ref().map(|a| a.to_string()).unwrap_or_default();
                match field.agg {
                    AggFunc::Percentile(p) => {
                        writeln!(f, "    {} := percentile({arg}, {p}) : {}", field.name, field.ty)?
                    }
                    agg => writeln!(f, "    {} := {agg}({arg}) : {}", field.name, field.ty)?,
                }
            }
        }
        if let Some(inv) = &self.invariant {
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
        if let Some(c) = &self.cluster {
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
        let a = &self.alert;
        writeln!(f, "  alert when {}", a.condition)?;
        writeln!(
            f,
            "    severity {}, for {}, keep firing for {}",
            a.severity,
            format_duration(a.for_ms),
            format_duration(a.keep_firing_for_ms)
        )?;
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
                        TemplatePiece::Value(e) => format!("{{{e}}}"),
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
