//! A rule's `score` block as the engine runs it.

use super::TExpr;
use serde::Serialize;

/// A rule's `score` block, flattened: every scorer call is a slot of its own, computed before
/// the slots that read it, and every named score is a slot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScorePlan {
    pub slots: Vec<ScoreSlot>,
}

impl ScorePlan {
    /// The versions of what a group's scores keep: the whole block's (`scores`), then each
    /// scorer whose state has a version above 0, once ([`ScorerSpec::state_version`]).
    pub fn state_versions(&self) -> Vec<(&'static str, u32)> {
        // 1: the recent values the scorers read, kept once per input beside them.
        let mut out: Vec<(&'static str, u32)> = vec![("scores", 1)];
        for slot in &self.slots {
            if let ScoreStep::Scorer(spec, _) = &slot.step {
                let version = (spec.name(), spec.state_version());
                if version.1 > 0 && !out.contains(&version) {
                    out.push(version);
                }
            }
        }
        out
    }
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
    Spot { level: u32, warmup: u32, peaks: u32, risk: u32 },
    Changepoint { expected: u32, runs: u32, warmup: u32 },
}

impl ScorerSpec {
    /// The version of the scorer's state: raised when what it keeps or means changes, so that
    /// a checkpoint's older state is not read as the new (the rule starts that state afresh).
    pub fn state_version(&self) -> u32 {
        match self {
            // 1: the share of changes before the current run of one value.
            ScorerSpec::ChangeRate { .. } => 1,
            // 1: values and non-conformities kept as `f32`; 2: values read from a shared history.
            ScorerSpec::Knn { .. } => 2,
            // 1: values read from a shared history, their order kept as positions in it.
            ScorerSpec::RobustZ { .. } => 1,
            _ => 0,
        }
    }

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
            ScorerSpec::Spot { .. } => "spot",
            ScorerSpec::Changepoint { .. } => "changepoint",
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
            ScorerSpec::Spot { level, warmup, peaks, risk } => {
                vec![("level", level), ("warmup", warmup), ("peaks", peaks), ("risk", risk)]
            }
            ScorerSpec::Changepoint { expected, runs, warmup } => {
                vec![("expected", expected), ("runs", runs), ("warmup", warmup)]
            }
        }
    }
}
