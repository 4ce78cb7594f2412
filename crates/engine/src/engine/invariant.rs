//! Invariants: a baseline per group, learned over the first windows of the group.

use super::eval::{eval, Env};
use crate::event::Value;
use std::collections::BTreeMap;
use vigil_lang::ast::InvariantMode;
use vigil_lang::plan::InvariantPlan;

/// One group's learning progress and baseline.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    /// Windows with events learned from so far.
    pub trained: u64,
    pub values: BTreeMap<String, Value>,
}

impl Baseline {
    pub fn training(&self, plan: &InvariantPlan) -> bool {
        self.trained < plan.training_windows
    }

    /// Learns from one window: `:=` statements on the first, `=` statements on every one.
    /// `env` must see the group's state; its baselines are replaced here.
    pub fn learn(&mut self, plan: &InvariantPlan, env: &Env) {
        if self.trained == 0 {
            for (name, e) in &plan.init {
                let v = eval(e, &env_with(env, &self.values));
                self.values.insert(name.clone(), v);
            }
        }
        self.update(plan, env);
        self.trained += 1;
    }

    /// After training: online invariants keep applying their updates; offline ones are frozen.
    pub fn after_alert(&mut self, plan: &InvariantPlan, env: &Env) {
        if plan.mode == InvariantMode::Online {
            self.update(plan, env);
        }
    }

    fn update(&mut self, plan: &InvariantPlan, env: &Env) {
        for (name, e) in &plan.update {
            let v = eval(e, &env_with(env, &self.values));
            self.values.insert(name.clone(), v);
        }
    }
}

fn env_with<'a>(env: &Env<'a>, baselines: &'a BTreeMap<String, Value>) -> Env<'a> {
    Env { baselines: Some(baselines), ..*env }
}
