//! A window rule's state as the engine keeps it: its fields, each one aggregate, and its group
//! key.

use super::TExpr;
use crate::ast::format_duration;
use crate::schema::{EntityKind, Type};
use serde::Serialize;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatePlan {
    pub name: String,
    /// Windows kept per group, the current one included.
    pub history: usize,
    pub fields: Vec<StateFieldPlan>,
    pub group_by: Vec<GroupKey>,
}

impl StatePlan {
    /// The names of the group key's values, as alerts show them (`s.host`, `s.name`, ...).
    pub fn key_names(&self) -> Vec<String> {
        self.group_by
            .iter()
            .flat_map(|k| match k {
                GroupKey::Entity { var, kind } => kind.key_fields().iter().map(|f| format!("{var}.{f}")).collect(),
                GroupKey::Value(e) => vec![e.to_string()],
            })
            .chain(self.group_by.is_empty().then(|| "group".to_string()))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StateFieldPlan {
    pub name: String,
    pub agg: AggFunc,
    pub arg: Option<TExpr>,
    pub ty: Type,
    /// `where`: the condition an event meets to be aggregated by this field. Left out of the
    /// state's identity when absent, so that a field without one keeps the same identity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<TExpr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
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
    /// A counter's per-second rate of increase, resets survived: per series, summed over the
    /// group's series.
    Rate,
    /// A counter's increase over the window, resets survived: per series, summed.
    Increase,
    /// A gauge's slope per second by least squares: per series, summed.
    Deriv,
    /// A gauge's value this many seconds after its last sample, by least squares: per series,
    /// summed.
    PredictLinear(f64),
}

impl AggFunc {
    pub const NAMES: [&'static str; 15] = [
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "stddev",
        "percentile",
        "distinct_count",
        "set",
        "first",
        "last",
        "rate",
        "increase",
        "deriv",
        "predict_linear",
    ];

    /// Whether the aggregate reads each series of a group apart (its state keyed by series).
    pub fn per_series(self) -> bool {
        matches!(self, AggFunc::Rate | AggFunc::Increase | AggFunc::Deriv | AggFunc::PredictLinear(_))
    }
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
            AggFunc::Rate => "rate",
            AggFunc::Increase => "increase",
            AggFunc::Deriv => "deriv",
            AggFunc::PredictLinear(_) => "predict_linear",
        };
        f.write_str(name)
    }
}

/// What a group is keyed by: a whole entity (its key fields) or one value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum GroupKey {
    Entity { var: String, kind: EntityKind },
    Value(TExpr),
}

/// The state as `vigil explain` prints it: its name, history and key, then a field a line.
impl fmt::Display for StatePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = self
            .group_by
            .iter()
            .map(|k| match k {
                GroupKey::Entity { var, kind } => format!("{var} ({})", kind.key_fields().join(", ")),
                GroupKey::Value(e) => e.to_string(),
            })
            .collect();
        write!(f, "  state {}[{}]", self.name, self.history)?;
        if keys.is_empty() {
            writeln!(f, " (one global group)")?;
        } else {
            writeln!(f, " group by {}", keys.join(", "))?;
        }
        for field in &self.fields {
            let arg = field.arg.as_ref().map(|a| a.to_string()).unwrap_or_default();
            let filter = field.filter.as_ref().map(|c| format!(" where {c}")).unwrap_or_default();
            match field.agg {
                AggFunc::Percentile(p) => {
                    writeln!(f, "    {} := percentile({arg}, {p}){filter} : {}", field.name, field.ty)?
                }
                AggFunc::PredictLinear(seconds) => {
                    let ahead = format_duration((seconds * 1000.0) as u64);
                    writeln!(f, "    {} := predict_linear({arg}, {ahead}){filter} : {}", field.name, field.ty)?
                }
                agg => writeln!(f, "    {} := {agg}({arg}){filter} : {}", field.name, field.ty)?,
            }
        }
        Ok(())
    }
}
