//! The `score` block: named scores computed per group at each window with events, and the calls
//! that only some places take (scorers in a score block, `interval` in an absence's bound).

use super::*;

/// A scorer's parameters: name, default, smallest and largest value.
type Params = &'static [(&'static str, u32, u32, u32)];

/// The scorers, with their parameters (`docs/language.md`, "Scores"). Windows are capped so that
/// one series' scorers stay within a few tens of kilobytes.
const SCORERS: [(&str, Params); 10] = [
    ("robust_z", &[("window", 288, 3, 4096), ("warmup", 32, 2, 4096)]),
    ("knn", &[("dim", 6, 1, 64), ("k", 3, 1, 64), ("window", 256, 2, 4096), ("calibration", 256, 20, 4096)]),
    ("shift", &[("window", 48, 4, 1024), ("bins", 6, 2, 64), ("warmup", 288, 4, 4096)]),
    ("likelihood", &[("short", 12, 1, 1024), ("long", 2016, 2, 1_000_000), ("warmup", 288, 2, 1_000_000)]),
    ("novelty", &[("window", 2016, 32, 10_000_000), ("warmup", 288, 2, 1_000_000)]),
    ("unchanged", &[]),
    ("change_rate", &[("window", 72, 2, 4096)]),
    ("streak", &[]),
    ("spot", &[("level", 98, 50, 99), ("warmup", 288, 16, 4096), ("peaks", 64, 8, 1024), ("risk", 4, 1, 15)]),
    ("changepoint", &[("expected", 288, 2, 1_000_000), ("runs", 32, 2, 256), ("warmup", 32, 2, 4096)]),
];

impl RuleChecker<'_> {
    /// The rule's `score` block as a plan: each field a named slot, each scorer call a slot of
    /// its own before the slot that reads it.
    pub(super) fn score_clause(&mut self) -> Option<ScorePlan> {
        let clause = self.rule.score.as_ref()?;
        let scope = Scope {
            place: "the score block",
            vars: Vars::GroupKeys,
            state: true,
            baselines: false,
            cluster: false,
            scores: true,
            special: Special::Scorers,
        };
        if self.rule.state.is_none() {
            // Reported by `score_mixing`; the names are still known, so nothing cascades.
            for field in &clause.fields {
                self.score_slots
                    .push(ScoreSlot { name: Some(field.name.name.clone()), step: ScoreStep::Expr(error_expr()) });
                self.score_names.insert(field.name.name.clone(), self.score_slots.len() - 1);
            }
            return None;
        }
        let mut seen: HashMap<&str, Span> = HashMap::new();
        for field in &clause.fields {
            if let Some(first) = seen.insert(&field.name.name, field.name.span) {
                self.error(twice(format!("score `{}` is defined twice", field.name.name), field.name.span, first));
                continue;
            }
            let value = self.expr(&field.value, &scope);
            self.require(value.ty, &[Type::Number, Type::Bool], field.value.span, "a score is a number or a condition");
            self.score_slots.push(ScoreSlot { name: Some(field.name.name.clone()), step: ScoreStep::Expr(value) });
            self.score_names.insert(field.name.name.clone(), self.score_slots.len() - 1);
        }
        if clause.fields.is_empty() {
            self.error(
                Diagnostic::new(codes::SCORE, "a score block needs at least one score", clause.span, "empty")
                    .with_help("e.g. `score { z := robust_z(ss.v) }`"),
            );
        }
        Some(ScorePlan { slots: self.score_slots.clone() })
    }

    /// Reports a score block without a state to score, or beside an invariant or cluster step.
    pub(super) fn score_mixing(&mut self) {
        let r = self.rule;
        if let Some(score) = &r.score {
            if r.state.is_none() {
                self.error(
                    Diagnostic::new(
                        codes::SCORE,
                        "scores are computed from a `state` block, and this rule has none",
                        score.span,
                        "no state to score",
                    )
                    .with_help(
                        "add a window and a state, e.g. `#time(5 min)` and `state ss { v := avg(e.value) } group by s`",
                    ),
                );
            }
            let other = r
                .invariant
                .as_ref()
                .map(|i| (i.span, "invariant"))
                .or(r.cluster.as_ref().map(|c| (c.span, "cluster step")));
            if let Some((span, what)) = other {
                self.error(
                    Diagnostic::new(
                        codes::MODEL_MIX,
                        format!("a rule has a score block or an {what}, not both"),
                        score.span,
                        "score block",
                    )
                    .with_secondary(span, what),
                );
            }
        }
    }

    /// A call to a scorer or to `interval`: checked here, or `None` for other functions.
    pub(super) fn special_call(&mut self, e: &Expr, name: &Ident, args: &[CallArg], scope: &Scope) -> Option<TExpr> {
        if name.name == "interval" {
            return Some(self.interval_call(e, args, scope));
        }
        let (scorer, params) = SCORERS.iter().find(|(n, _)| *n == name.name)?;
        if scope.special != Special::Scorers {
            self.error(
                Diagnostic::new(
                    codes::SCORE,
                    format!("scorer `{scorer}` used outside a score block"),
                    name.span,
                    "keeps state per series",
                )
                .with_help(format!(
                    "compute it in the rule's score block, e.g. `score {{ s := {scorer}(ss.v) }}`, then use `s`"
                )),
            );
            return Some(error_expr());
        }
        let mut values: Vec<u32> = params.iter().map(|p| p.1).collect();
        let mut input = None;
        for arg in args {
            match &arg.name {
                None if input.is_none() => input = Some(self.expr(&arg.value, scope)),
                None => self.error(
                    Diagnostic::new(
                        codes::ARGUMENTS,
                        format!("`{scorer}` takes one value and named parameters"),
                        arg.value.span,
                        "a second value",
                    )
                    .with_note(scorer_signature(scorer, params)),
                ),
                Some(p) => match params.iter().position(|(n, ..)| *n == p.name) {
                    Some(i) => {
                        if let Some(v) = self.parameter(&arg.value, params[i]) {
                            values[i] = v;
                        }
                    }
                    None => {
                        let names: Vec<&str> = params.iter().map(|p| p.0).collect();
                        self.error(
                            Diagnostic::new(
                                codes::ARGUMENTS,
                                format!("`{scorer}` has no parameter `{}`", p.name),
                                p.span,
                                "unknown parameter",
                            )
                            .with_help(if names.is_empty() {
                                format!("`{scorer}` takes no parameters")
                            } else {
                                suggestion(&p.name, &names)
                            }),
                        )
                    }
                },
            }
        }
        let Some(input) = input else {
            self.error(
                Diagnostic::new(codes::ARGUMENTS, format!("`{scorer}` needs the value it scores"), e.span, "no value")
                    .with_note(scorer_signature(scorer, params)),
            );
            return Some(error_expr());
        };
        if input.ty == Type::Error {
            return Some(error_expr());
        }
        if *scorer == "streak" {
            self.require(input.ty, &[Type::Bool], e.span, "`streak` counts how long a condition has held");
        } else {
            self.require(input.ty, &[Type::Number], e.span, "scorers read numbers");
        }
        let spec = scorer_spec(scorer, &values);
        let slot = self.score_slots.len();
        let shown = format!("{}({input})", spec.name());
        self.score_slots.push(ScoreSlot { name: None, step: ScoreStep::Scorer(spec, input) });
        Some(typed(Type::Number, TExprKind::Score { slot, name: shown }))
    }

    /// A scorer's parameter: an integer literal within its bounds.
    fn parameter(&mut self, value: &Expr, (name, _, min, max): (&str, u32, u32, u32)) -> Option<u32> {
        let n = match value.kind {
            ExprKind::Number(n) if n.fract() == 0.0 => n,
            _ => {
                self.error(Diagnostic::new(
                    codes::ARGUMENTS,
                    format!("`{name}` is a whole number"),
                    value.span,
                    "not a whole number",
                ));
                return None;
            }
        };
        if n < f64::from(min) || n > f64::from(max) {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                format!("`{name}` must be between {min} and {max}"),
                value.span,
                "out of range",
            ));
            return None;
        }
        Some(n as u32)
    }

    /// `interval(e)` or `interval(e, q = 0.9)`: the usual gap between the first step's events.
    fn interval_call(&mut self, e: &Expr, args: &[CallArg], scope: &Scope) -> TExpr {
        let Special::Interval(first) = scope.special else {
            self.error(
                Diagnostic::new(
                    codes::SCORE,
                    "`interval` is read in an absence's bound",
                    e.span,
                    "not in `not ... for`",
                )
                .with_help("e.g. `with e1 -> not e2 for max(10 min, 3 * interval(e1))`"),
            );
            return error_expr();
        };
        let first_name = self.sources.get(first).map(|s| s.event_var.clone()).unwrap_or_default();
        let mut quantile = 0.5;
        let mut named_event = false;
        for arg in args {
            match (&arg.name, &arg.value.kind) {
                (None, ExprKind::Name(n)) if *n == first_name && !named_event => named_event = true,
                (Some(p), ExprKind::Number(q)) if p.name == "q" && (0.0..=1.0).contains(q) => quantile = *q,
                _ => {
                    self.error(
                        Diagnostic::new(codes::ARGUMENTS, "`interval` takes the first step's event and optionally `q`", arg.value.span, "not that")
                            .with_note(format!("`interval({first_name})` is the median gap between `{first_name}` events; `interval({first_name}, q = 0.9)` their 90th percentile")),
                    );
                    return error_expr();
                }
            }
        }
        if !named_event {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                format!("`interval` needs the event it measures: `interval({first_name})`"),
                e.span,
                "no event",
            ));
            return error_expr();
        }
        typed(Type::Duration, TExprKind::Interval { source: first, quantile })
    }
}

fn scorer_signature(name: &str, params: Params) -> String {
    let p: Vec<String> = params.iter().map(|(n, d, ..)| format!(", {n} = {d}")).collect();
    format!("`{name}(value{})`", p.join(""))
}

fn scorer_spec(name: &str, v: &[u32]) -> ScorerSpec {
    match name {
        "robust_z" => ScorerSpec::RobustZ { window: v[0], warmup: v[1] },
        "knn" => ScorerSpec::Knn { dim: v[0], k: v[1], window: v[2], calibration: v[3] },
        "shift" => ScorerSpec::Shift { window: v[0], bins: v[1], warmup: v[2] },
        "likelihood" => ScorerSpec::Likelihood { short: v[0], long: v[1], warmup: v[2] },
        "novelty" => ScorerSpec::Novelty { window: v[0], warmup: v[1] },
        "unchanged" => ScorerSpec::Unchanged,
        "streak" => ScorerSpec::Streak,
        "spot" => ScorerSpec::Spot { level: v[0], warmup: v[1], peaks: v[2], risk: v[3] },
        "changepoint" => ScorerSpec::Changepoint { expected: v[0], runs: v[1], warmup: v[2] },
        _ => ScorerSpec::ChangeRate { window: v[0] },
    }
}
