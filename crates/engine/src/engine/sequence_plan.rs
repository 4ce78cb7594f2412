//! How a sequence rule's plan is laid out for its operator: where each `with` condition is
//! judged, and expressions read from the pattern that binds their entities.

use super::eval::visit;
use vigil_lang::plan::{RulePlan, SequencePlan, TExpr, TExprKind};

/// The `with` conditions by the step at which they can be judged: a condition is checked when
/// the last step it reads binds; one that reads an absent event says which events count as
/// that event. Returns (conditions to bind, conditions of absent events), by step.
pub(super) fn place_conditions(
    plan: &RulePlan,
    seq: &SequencePlan,
    step_of: &[usize],
    names: &[String],
    binds: &[Vec<usize>],
) -> (Vec<Vec<TExpr>>, Vec<Vec<TExpr>>) {
    let absent_sources: Vec<usize> = seq.steps.iter().filter(|s| s.kind.is_absence()).map(|s| s.source).collect();
    let mut bind_conditions = vec![Vec::new(); seq.steps.len()];
    let mut absent_conditions = vec![Vec::new(); seq.steps.len()];
    for cond in &seq.conditions {
        let refs = referenced_sources(cond, plan, names, binds);
        let last_step = refs.iter().map(|&s| step_of[s]).max().unwrap_or(0);
        match refs.iter().find(|s| absent_sources.contains(s)) {
            // A condition on an absent event says which events count as that event.
            Some(&absent) => {
                let j = step_of[absent];
                if refs.iter().all(|&s| step_of[s] <= j) {
                    absent_conditions[j].push(cond.clone());
                }
            }
            None => bind_conditions[last_step].push(cond.clone()),
        }
    }
    (bind_conditions, absent_conditions)
}

/// Rewrites an expression so that entity fields read from `source` when it binds the entity.
pub(super) fn retarget(
    e: &TExpr,
    source: usize,
    stream: vigil_lang::schema::Stream,
    bound_by: &dyn Fn(&str, usize) -> bool,
) -> TExpr {
    let re = |x: &TExpr| retarget(x, source, stream, bound_by);
    let kind = match &e.kind {
        TExprKind::EntityField { var, field, .. } if bound_by(var, source) => TExprKind::EntityField {
            var: var.clone(),
            source,
            field,
            index: crate::event::field_position(stream, field),
        },
        TExprKind::List(items) => TExprKind::List(items.iter().map(re).collect()),
        TExprKind::Call(f, items) => TExprKind::Call(*f, items.iter().map(re).collect()),
        TExprKind::Unary(op, a) => TExprKind::Unary(*op, Box::new(re(a))),
        TExprKind::Cardinality(a) => TExprKind::Cardinality(Box::new(re(a))),
        TExprKind::Binary(op, a, b) => TExprKind::Binary(*op, Box::new(re(a)), Box::new(re(b))),
        TExprKind::Lookup(a, b) => TExprKind::Lookup(Box::new(re(a)), Box::new(re(b))),
        other => other.clone(),
    };
    TExpr { ty: e.ty, kind }
}

/// The sources whose events an expression reads. A whole entity (`m1 != m2`) is read from the
/// first source that binds it.
fn referenced_sources(e: &TExpr, plan: &RulePlan, names: &[String], binds: &[Vec<usize>]) -> Vec<usize> {
    let mut out = Vec::new();
    visit(e, &mut |e| match &e.kind {
        TExprKind::EventField { source, .. } | TExprKind::EntityField { source, .. } => out.push(*source),
        TExprKind::Entity { var, .. } => {
            if let Some(id) = names.iter().position(|n| n == var) {
                if let Some(s) = (0..plan.sources.len()).find(|&s| binds[s].contains(&id)) {
                    out.push(s);
                }
            }
        }
        _ => {}
    });
    out.sort_unstable();
    out.dedup();
    out
}
