//! A rule's `alert` and `rollup` clauses as the engine runs them.

use super::TExpr;

#[derive(Debug, Clone, PartialEq)]
pub struct AlertPlan {
    pub condition: TExpr,
    pub severity: &'static str,
    pub for_ms: u64,
    pub keep_firing_for_ms: u64,
    /// After an alert fires for a key, no new alert for that key until this long after.
    pub refractory_ms: u64,
    pub rollup: Option<RollupPlan>,
}

/// One alert for all the keys that share a value of one key field (a host, for the series of
/// a host), when unusually many of them alert together (`engine::rollup`).
#[derive(Debug, Clone, PartialEq)]
pub struct RollupPlan {
    /// The key field, as alerts name it (`s.host`).
    pub by: String,
    pub severity: &'static str,
}
