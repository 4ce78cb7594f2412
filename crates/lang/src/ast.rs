//! What the user wrote: a spanned syntax tree, before any name is resolved.
//!
//! Every node that a diagnostic may point at carries its [`Span`] (byte offsets into the source).
//! The checker turns this tree into a [`crate::plan::RulePlan`]; nothing downstream of it looks
//! at the AST.

use std::fmt;

/// Byte range `start..end` in the source text of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Self {
        Span { start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// A name as written, with where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// A duration in milliseconds, as written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Duration {
    pub millis: u64,
    pub span: Span,
}

/// One source file: its rules and declarations, each in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct File {
    pub rules: Vec<RuleDecl>,
    pub entities: Vec<EntityDecl>,
    pub streams: Vec<StreamDecl>,
}

/// `entity NAME (key, ...)`: a kind of entity and the attributes that identify one.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityDecl {
    pub name: Ident,
    pub keys: Vec<Ident>,
    pub span: Span,
}

/// `stream NAME { ... }`: the events of one stream, what entities they name and which
/// operations patterns can select from them.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamDecl {
    pub name: Ident,
    pub span: Span,
    /// The fields in the order events keep them.
    pub fields: Vec<FieldDecl>,
    pub bindings: Vec<BindingDecl>,
    /// The field whose value selects an operation.
    pub operation: Option<Ident>,
    pub ops: Vec<OpDecl>,
}

/// `name: type`, or `name?: type` for a field events may leave out.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldDecl {
    pub name: Ident,
    pub ty: Ident,
    pub optional: bool,
}

/// Which place of a pattern a binding is for: `subject entity ...`, `object entity ...`, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlaceDecl {
    Subject,
    Object,
    Both,
}

/// `entity KIND (attr, attr = field)` inside a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingDecl {
    pub place: PlaceDecl,
    pub kind: Ident,
    /// An attribute and the field it is read from, the attribute's own name when not given.
    pub attrs: Vec<(Ident, Ident)>,
    pub span: Span,
}

/// `op SUBJECT NAME [OBJECT[?]] [= "VALUE"]`.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDecl {
    pub subject: Ident,
    pub name: Ident,
    /// The object kind, and whether a pattern may leave the object out.
    pub object: Option<(Ident, bool)>,
    /// The value of the operation field this operation selects; every event when `None`.
    pub value: Option<(String, Span)>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuleDecl {
    pub name: Ident,
    pub span: Span,
    pub description: Option<(String, Span)>,
    pub patterns: Vec<Pattern>,
    pub with: Option<WithClause>,
    pub state: Option<StateClause>,
    pub invariant: Option<InvariantClause>,
    pub cluster: Option<ClusterClause>,
    pub score: Option<ScoreClause>,
    pub alert: Option<AlertClause>,
    pub rollup: Option<RollupClause>,
    pub labels: Vec<TemplateField>,
    pub annotations: Vec<TemplateField>,
    pub returns: Option<Vec<ReturnItem>>,
    /// Clauses that may appear once but appeared again: (clause keyword, span of the repeat).
    pub repeated: Vec<(&'static str, Span)>,
}

/// `task t evict machine m as e where ... #time(5 min)`
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    pub span: Span,
    pub subject_kind: Ident,
    pub subject: Ident,
    pub operation: Ident,
    pub object: Option<(Ident, Ident)>,
    pub event: Ident,
    pub filter: Option<Expr>,
    pub window: Option<WindowSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WindowSpec {
    pub span: Span,
    pub size: Duration,
    pub slide: Option<Duration>,
}

/// `with e1 -> e2 within 10 min group by t.job_id, m1 != m2`
#[derive(Debug, Clone, PartialEq)]
pub struct WithClause {
    pub span: Span,
    pub steps: Vec<SeqStep>,
    pub within: Option<Duration>,
    pub group_by: Vec<Expr>,
    pub conditions: Vec<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SeqStep {
    pub span: Span,
    pub event: Ident,
    pub kind: StepKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    /// The event occurs once.
    Once,
    /// The event occurs at least `min` times (`e{5,}`).
    Count { min: u64 },
    /// The event does not occur for this long after the previous step.
    Absent(Duration),
    /// The same, for as long as an expression of durations says (`max(10 min, 3 * interval(e1))`).
    AbsentFor(Expr),
}

impl StepKind {
    pub fn is_absence(&self) -> bool {
        matches!(self, StepKind::Absent(_) | StepKind::AbsentFor(_))
    }
}

/// `score { z := robust_z(ss.v), ... }`
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreClause {
    pub span: Span,
    pub fields: Vec<StateField>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StateClause {
    pub span: Span,
    pub name: Ident,
    /// `state[k]`: how many windows are kept (the current one included).
    pub history: Option<(u64, Span)>,
    pub fields: Vec<StateField>,
    pub group_by: Vec<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StateField {
    pub name: Ident,
    pub value: Expr,
    /// `where <condition>`: the events the aggregate reads; all of the window's without it.
    pub filter: Option<Expr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum InvariantMode {
    Offline,
    Online,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InvariantClause {
    pub span: Span,
    pub windows: (u64, Span),
    pub mode: Ident,
    pub statements: Vec<InvariantStmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InvariantStmt {
    pub span: Span,
    pub target: Ident,
    /// `:=` declares and initialises; `=` updates after each training window.
    pub is_init: bool,
    pub value: Expr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClusterClause {
    pub span: Span,
    pub args: Vec<ClusterArg>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClusterArg {
    pub name: Ident,
    pub value: ClusterValue,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ClusterValue {
    /// `all(ss.cpu, ss.mem) per t.job_id`
    Points {
        span: Span,
        dims: Vec<Expr>,
        per: Vec<Expr>,
    },
    Expr(Expr),
}

#[derive(Debug, Clone, PartialEq)]
pub struct AlertClause {
    pub span: Span,
    /// `None` when the rule alerts on every match.
    pub condition: Option<Expr>,
    pub severity: Option<Ident>,
    pub for_: Option<Duration>,
    pub keep_firing_for: Option<Duration>,
    pub refractory: Option<Duration>,
}

/// `rollup by s.host severity warning`
#[derive(Debug, Clone, PartialEq)]
pub struct RollupClause {
    pub span: Span,
    /// The key field whose value the roll-up gathers alerts by.
    pub by: Expr,
    pub severity: Option<Ident>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TemplateField {
    pub name: Ident,
    pub template: Template,
}

/// A string with `{expr}` holes; `{{` and `}}` are literal braces.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub span: Span,
    pub parts: Vec<TemplatePart>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TemplatePart {
    Text(String),
    /// `{expr}` or `{expr:format}`.
    Hole(Expr, HoleFormat),
}

/// How a template hole shows a number (other values show as text): `{x}` four significant
/// digits, `{x:.2}` two decimals, `{x:si}` 1.2k / 3.4M, `{x:bytes}` 1.5 GiB, `{x:percent}` a
/// fraction as 95%, `{x:duration}` milliseconds as 1.5 h, `{x:raw}` every digit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum HoleFormat {
    #[default]
    Default,
    Decimals(u8),
    Si,
    Bytes,
    Percent,
    Duration,
    Raw,
}

impl HoleFormat {
    /// The format a hole's `:format` names.
    pub fn parse(text: &str) -> Option<HoleFormat> {
        Some(match text.trim() {
            "si" => HoleFormat::Si,
            "bytes" => HoleFormat::Bytes,
            "percent" => HoleFormat::Percent,
            "duration" => HoleFormat::Duration,
            "raw" => HoleFormat::Raw,
            t => HoleFormat::Decimals(t.strip_prefix('.')?.parse().ok().filter(|n| *n <= 15)?),
        })
    }
}

impl std::fmt::Display for HoleFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoleFormat::Default => Ok(()),
            HoleFormat::Decimals(n) => write!(f, ":.{n}"),
            HoleFormat::Si => f.write_str(":si"),
            HoleFormat::Bytes => f.write_str(":bytes"),
            HoleFormat::Percent => f.write_str(":percent"),
            HoleFormat::Duration => f.write_str(":duration"),
            HoleFormat::Raw => f.write_str(":raw"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReturnItem {
    pub value: Expr,
    pub alias: Option<Ident>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub span: Span,
    pub kind: ExprKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    Number(f64),
    Str(String),
    Bool(bool),
    Duration(u64),
    EmptySet,
    List(Vec<Expr>),
    /// A bare name: a variable, a state, an invariant baseline.
    Name(String),
    /// `cluster`, the result of the rule's clustering step.
    ClusterRef,
    /// `x.field`
    Member(Box<Expr>, Ident),
    /// `x[i]`: history of a state, or a label lookup.
    Index(Box<Expr>, Box<Expr>),
    /// `ss[1..3]`: a range of past windows, inclusive.
    Range(Box<Expr>, u64, u64),
    Call(Ident, Vec<CallArg>),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `|s|`
    Cardinality(Box<Expr>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CallArg {
    pub name: Option<Ident>,
    pub value: Expr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum UnaryOp {
    Not,
    Neg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Match,
    Like,
    In,
    NotIn,
    Union,
    Diff,
    Intersect,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Or => "or",
            BinOp::And => "and",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Match => "=~",
            BinOp::Like => "like",
            BinOp::In => "in",
            BinOp::NotIn => "not in",
            BinOp::Union => "union",
            BinOp::Diff => "diff",
            BinOp::Intersect => "intersect",
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
        }
    }

    /// Binding strength, higher binds tighter; used to print with only the needed parentheses.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq
            | BinOp::Ne
            | BinOp::Lt
            | BinOp::Le
            | BinOp::Gt
            | BinOp::Ge
            | BinOp::Match
            | BinOp::Like
            | BinOp::In
            | BinOp::NotIn => 4,
            BinOp::Union | BinOp::Diff | BinOp::Intersect => 5,
            BinOp::Add | BinOp::Sub => 6,
            BinOp::Mul | BinOp::Div | BinOp::Rem => 7,
        }
    }
}

/// Formats a duration in the largest unit that divides it: `90000` ms prints as `90 s`.
/// A duration for people, to one decimal in its largest unit: `7977.9 years`, `3.5 h`, `250 ms`.
pub fn human_duration(millis: u64) -> String {
    const UNITS: [(f64, &str); 6] = [
        (31_557_600_000.0, "years"),
        (86_400_000.0, "days"),
        (3_600_000.0, "h"),
        (60_000.0, "min"),
        (1_000.0, "s"),
        (1.0, "ms"),
    ];
    let ms = millis as f64;
    let (size, unit) = UNITS.iter().find(|(size, _)| ms >= *size).copied().unwrap_or((1.0, "ms"));
    let text = format!("{:.1}", ms / size);
    format!("{} {unit}", text.strip_suffix(".0").unwrap_or(&text))
}

pub fn format_duration(millis: u64) -> String {
    const UNITS: [(u64, &str); 5] =
        [(604_800_000, "w"), (86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1_000, "s")];
    if millis == 0 {
        return "0 s".to_string();
    }
    for (size, unit) in UNITS {
        if millis.is_multiple_of(size) {
            return format!("{} {unit}", millis / size);
        }
    }
    format!("{millis} ms")
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_expr(f, self, 0)
    }
}

fn write_expr(f: &mut fmt::Formatter<'_>, e: &Expr, parent_prec: u8) -> fmt::Result {
    match &e.kind {
        ExprKind::Number(n) => write!(f, "{n}"),
        ExprKind::Str(s) => write!(f, "{s:?}"),
        ExprKind::Bool(b) => write!(f, "{b}"),
        ExprKind::Duration(ms) => f.write_str(&format_duration(*ms)),
        ExprKind::EmptySet => f.write_str("empty_set"),
        ExprKind::List(items) => {
            f.write_str("[")?;
            write_list(f, items)?;
            f.write_str("]")
        }
        ExprKind::Name(n) => f.write_str(n),
        ExprKind::ClusterRef => f.write_str("cluster"),
        ExprKind::Member(base, field) => {
            write_expr(f, base, 9)?;
            write!(f, ".{}", field.name)
        }
        ExprKind::Index(base, idx) => {
            write_expr(f, base, 9)?;
            write!(f, "[{idx}]")
        }
        ExprKind::Range(base, lo, hi) => {
            write_expr(f, base, 9)?;
            write!(f, "[{lo}..{hi}]")
        }
        ExprKind::Call(name, args) => {
            write!(f, "{}(", name.name)?;
            for (i, arg) in args.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                if let Some(n) = &arg.name {
                    write!(f, "{} = ", n.name)?;
                }
                write!(f, "{}", arg.value)?;
            }
            f.write_str(")")
        }
        ExprKind::Unary(UnaryOp::Not, inner) => {
            let paren = parent_prec > 3;
            if paren {
                f.write_str("(")?;
            }
            f.write_str("not ")?;
            write_expr(f, inner, 3)?;
            if paren {
                f.write_str(")")?;
            }
            Ok(())
        }
        ExprKind::Unary(UnaryOp::Neg, inner) => {
            f.write_str("-")?;
            write_expr(f, inner, 8)
        }
        ExprKind::Binary(op, l, r) => {
            let prec = op.precedence();
            let paren = prec < parent_prec;
            if paren {
                f.write_str("(")?;
            }
            write_expr(f, l, prec)?;
            write!(f, " {} ", op.symbol())?;
            // Left-associative: a right operand of equal strength needs parentheses.
            write_expr(f, r, prec + 1)?;
            if paren {
                f.write_str(")")?;
            }
            Ok(())
        }
        ExprKind::Cardinality(inner) => write!(f, "|{inner}|"),
    }
}

fn write_list(f: &mut fmt::Formatter<'_>, items: &[Expr]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}
