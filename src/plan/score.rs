//! A rule's `score` block as the engine runs it.

use super::TExpr;
use serde::Serialize;

/// A rule's `score` block, flattened: every scorer call is a slot of its own, computed before
/// the slots that read it, and every named score is a slot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScorePlan {
    pub slots: Vec<ScoreSlot>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoreSlot {
    /// The name the rule gives it, or `None` for a scorer call inside an expression.
    pub name: Option<String>,
    pub step: ScoreStep,
}

impl ScoreSlot {
    pub fn input(&self) -> &TExpr {
        match &self.step {
            ScoreStep::Expr(e) | ScoreStep::Scorer(_, e) => e,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum ScoreStep {
    /// An expression over the state, earlier slots and constants.
    Expr(TExpr),
    /// A scorer, fed the expression's value at each window in which the group had events.
    Scorer(ScorerSpec, TExpr),
}

/// A streaming anomaly scorer and its parameters (`docs/language.md`, "Scores").
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum ScorerSpec {
    RobustZ { window: u32, warmup: u32 },
    Knn { dim: u32, k: u32, window: u32, calibration: u32 },
    Shift { window: u32, bins: u32, warmup: u32 },
    Likelihood { short: u32, long: u32, warmup: u32 },
    Novelty { window: u32, warmup: u32 },
    Unchanged,
    ChangeRate { window: u32 },
    Streak,
}

impl ScorerSpec {
    pub fn name(&self) -> &'static str {
        match self {
            ScorerSpec::RobustZ { .. } => "robust_z",
            ScorerSpec::Knn { .. } => "knn",
            ScorerSpec::Shift { .. } => "shift",
            ScorerSpec::Likelihood { .. } => "likelihood",
            ScorerSpec::Novelty { .. } => "novelty",
            ScorerSpec::Unchanged => "unchanged",
            ScorerSpec::ChangeRate { .. } => "change_rate",
            ScorerSpec::Streak => "streak",
        }
    }

    /// The parameters as `name=value`, in their order.
    pub fn params(&self) -> Vec<(&'static str, u32)> {
        match *self {
            ScorerSpec::RobustZ { window, warmup } => vec![("window", window), ("warmup", warmup)],
            ScorerSpec::Knn { dim, k, window, calibration } => {
                vec![("dim", dim), ("k", k), ("window", window), ("calibration", calibration)]
            }
            ScorerSpec::Shift { window, bins, warmup } => vec![("window", window), ("bins", bins), ("warmup", warmup)],
            ScorerSpec::Likelihood { short, long, warmup } => {
                vec![("short", short), ("long", long), ("warmup", warmup)]
            }
            ScorerSpec::Novelty { window, warmup } => vec![("window", window), ("warmup", warmup)],
            ScorerSpec::Unchanged | ScorerSpec::Streak => vec![],
            ScorerSpec::ChangeRate { window } => vec![("window", window)],
        }
    }
}
