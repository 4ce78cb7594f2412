//! Scopes: which names an expression may use where it stands, and what a name or a member
//! (`e.cpu`, `t.user`, `ss[1].n`) refers to.

use super::*;

impl RuleChecker<'_> {
    /// The scope of `alert`, labels, annotations and `return`.
    pub(super) fn output_scope<'s>(&self, positive: &'s [usize]) -> Scope<'s> {
        if self.state.is_some() {
            Scope {
                place: "the alert",
                vars: Vars::GroupKeys,
                state: true,
                baselines: self.rule.invariant.is_some(),
                cluster: self.has_cluster,
                scores: self.rule.score.is_some(),
                special: Special::None,
            }
        } else {
            Scope {
                place: "the alert",
                vars: Vars::Sources(positive),
                state: false,
                baselines: false,
                cluster: false,
                // A score block without a state is an error of its own; its names are known.
                scores: self.rule.score.is_some(),
                special: Special::None,
            }
        }
    }

    pub(super) fn name(&mut self, n: &str, span: Span, scope: &Scope) -> TExpr {
        if let Some(info) = self.events.get(n) {
            let source = info.source;
            self.check_access(n, source_set(&[source]), span, scope);
            self.error(
                Diagnostic::new(codes::TYPE_MISMATCH, format!("`{n}` is an event, not a value"), span, "an event")
                    .with_help(format!(
                        "take one of its fields, e.g. `{n}.{}`",
                        info_first_field(self.events[n].stream)
                    )),
            );
            return error_expr();
        }
        if let Some(info) = self.entities.get(n) {
            let kind = info.kind;
            let sources: Vec<usize> = info.bindings.iter().map(|(s, _)| *s).collect();
            if !self.check_access(n, source_set(&sources), span, scope) {
                return error_expr();
            }
            if let Vars::GroupKeys = scope.vars {
                if !self.state.as_ref().is_some_and(|s| s.entity_keys.iter().any(|k| k == n)) {
                    self.not_a_key(n, span);
                    return error_expr();
                }
            }
            return typed(Type::Entity(kind), TExprKind::Entity { var: n.to_string(), kind });
        }
        if let Some(state) = &self.state {
            if state.name == n && scope.state {
                let example = state.field_order.first().cloned().unwrap_or_else(|| "field".into());
                self.error(
                    Diagnostic::new(codes::TYPE_MISMATCH, format!("`{n}` is a state, not a value"), span, "a state")
                        .with_help(format!("take a field, e.g. `{n}.{example}` or `{n}[1].{example}`")),
                );
                return error_expr();
            }
        }
        if scope.baselines {
            if let Some(ty) = self.baselines.get(n) {
                return typed(*ty, TExprKind::Baseline(n.to_string()));
            }
        }
        if scope.scores {
            if let Some(&slot) = self.score_names.get(n) {
                return typed(Type::Number, TExprKind::Score { slot, name: n.to_string() });
            }
        }
        let mut candidates: Vec<&str> = self.events.keys().chain(self.entities.keys()).map(String::as_str).collect();
        if scope.state {
            candidates.extend(self.state.iter().map(|s| s.name.as_str()));
        }
        if scope.baselines {
            candidates.extend(self.baselines.keys().map(String::as_str));
        }
        if scope.scores {
            candidates.extend(self.score_names.keys().map(String::as_str));
        }
        candidates.sort();
        let mut d =
            Diagnostic::new(codes::UNKNOWN_NAME, format!("unknown name `{n}`"), span, "not defined in this rule");
        if let Some(c) = crate::diagnostic::nearest(n, candidates.iter().copied()) {
            d = d.with_help(format!("did you mean `{c}`?"));
        } else if n.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            d = d.with_help(format!("strings are quoted: \"{n}\""));
        }
        self.error(d);
        error_expr()
    }

    /// Whether a variable bound by `sources` may be used in `scope`; reports why not.
    pub(super) fn check_access(&mut self, var: &str, sources: HashSet<usize>, span: Span, scope: &Scope) -> bool {
        match scope.vars {
            Vars::Sources(allowed) => {
                if sources.iter().any(|s| allowed.contains(s)) {
                    return true;
                }
                let absent = self.rule.with.as_ref().is_some_and(|w| {
                    w.steps.iter().any(|st| {
                        st.kind.is_absence()
                            && self.events.get(&st.event.name).is_some_and(|i| sources.contains(&i.source))
                    })
                });
                let d = if absent {
                    Diagnostic::new(codes::FOREIGN_VARIABLE, format!("`{var}` belongs to an event that must not happen"), span, "never bound when the alert fires")
                        .with_note("an absent event has no values; relate it to earlier events in its pattern's `where` or in `with`")
                } else {
                    Diagnostic::new(codes::FOREIGN_VARIABLE, format!("`{var}` is not bound by this pattern"), span, format!("bound by another pattern, not usable in {}", scope.place))
                        .with_help("a pattern's `where` sees only its own variables; relate two events in the `with` clause, e.g. `with e1 -> e2 within 1 h, e2.cpu > e1.cpu_request`")
                };
                self.error(d);
                false
            }
            Vars::GroupKeys => true,
        }
    }

    pub(super) fn not_a_key(&mut self, text: &str, span: Span) {
        let (state, keys) = match &self.state {
            Some(s) => (s.name.clone(), s.key_texts.join(", ")),
            None => (String::new(), String::new()),
        };
        self.error(
            Diagnostic::new(
                codes::FOREIGN_VARIABLE,
                format!("`{text}` is not a group key of state `{state}`"),
                span,
                "has many values in a window",
            )
            .with_note(if keys.is_empty() {
                format!("state `{state}` has one global group")
            } else {
                format!("the group keys are: {keys}")
            })
            .with_help("aggregate it in the state block, or add it to `group by`"),
        );
    }

    pub(super) fn is_state(&self, e: &Expr) -> bool {
        matches!(&e.kind, ExprKind::Name(n) if self.state.as_ref().is_some_and(|s| &s.name == n))
    }

    /// Whether an expression is, as written, one of the state's group-by values.
    pub(super) fn is_value_key(&self, e: &Expr) -> bool {
        let text = e.to_string();
        self.state.as_ref().is_some_and(|s| s.key_texts.contains(&text))
    }

    pub(super) fn member(&mut self, e: &Expr, base: &Expr, field: &Ident, scope: &Scope) -> TExpr {
        match &base.kind {
            ExprKind::Name(n) if self.events.contains_key(n) => self.event_field(e, base, n, field, scope),
            ExprKind::Name(n) if self.entities.contains_key(n) => self.entity_field(e, n, field, scope),
            ExprKind::Name(n) if scope.state && self.state.as_ref().is_some_and(|s| &s.name == n) => {
                self.state_field(n, 0, field, false, None)
            }
            ExprKind::Index(inner, idx) if scope.state && self.is_state(inner) => {
                let ExprKind::Name(n) = &inner.kind else { unreachable!("is_state checked a name") };
                self.indexed_state_field(n, idx, field)
            }
            ExprKind::Range(inner, from, to) if scope.state && self.is_state(inner) => {
                let ExprKind::Name(n) = &inner.kind else { unreachable!("is_state checked a name") };
                self.state_range(n, (*from, *to), base.span, field)
            }
            ExprKind::ClusterRef if scope.cluster => self.cluster_field(field),
            _ => {
                let t = self.expr(base, scope);
                if t.ty != Type::Error {
                    self.error(Diagnostic::new(
                        codes::UNKNOWN_FIELD,
                        format!("a {} has no fields", t.ty),
                        field.span,
                        "no such field",
                    ));
                }
                error_expr()
            }
        }
    }

    /// `e.cpu`: a field of the event a pattern binds.
    fn event_field(&mut self, e: &Expr, base: &Expr, n: &str, field: &Ident, scope: &Scope) -> TExpr {
        let (source, stream) = (self.events[n].source, self.events[n].stream);
        if !self.check_access(n, source_set(&[source]), base.span, scope) {
            return error_expr();
        }
        let Some(ty) = stream.field(&field.name) else {
            self.unknown_field(
                &field.name,
                field.span,
                &format!("event `{n}` ({})", stream.name()),
                &stream.field_names(),
            );
            return error_expr();
        };
        if let Vars::GroupKeys = scope.vars {
            if !self.is_value_key(e) {
                self.not_a_key(&e.to_string(), e.span);
                return error_expr();
            }
        }
        let field = static_field(stream, &field.name);
        typed(
            ty,
            TExprKind::EventField {
                var: n.to_string(),
                source,
                field,
                index: crate::schema::field_position(stream, field),
            },
        )
    }

    /// `ss[k].field`: a field of the state `k` windows back.
    fn indexed_state_field(&mut self, n: &str, idx: &Expr, field: &Ident) -> TExpr {
        let (message, label) = match idx.kind {
            ExprKind::Number(i) if i.fract() == 0.0 && (0.0..MAX_HISTORY as f64).contains(&i) => {
                return self.state_field(n, i as usize, field, false, Some(idx.span));
            }
            ExprKind::Number(i) if i.fract() == 0.0 && i > 0.0 => (
                format!("a state keeps at most {MAX_HISTORY} windows, so this index is out of range"),
                "past any history",
            ),
            _ => ("a window index is a whole number".to_string(), "not a window index"),
        };
        self.error(
            Diagnostic::new(codes::HISTORY_RANGE, message, idx.span, label)
                .with_help(format!("`{n}[0]` is the current window, `{n}[1]` the one before")),
        );
        error_expr()
    }

    /// `ss[from..to].field`: a field over a range of windows, as a list.
    fn state_range(&mut self, n: &str, (from, to): (u64, u64), span: Span, field: &Ident) -> TExpr {
        if from > to {
            self.error(
                Diagnostic::new(
                    codes::HISTORY_RANGE,
                    format!("range {from}..{to} runs backwards"),
                    span,
                    "start is after end",
                )
                .with_help(format!("write `{n}[{to}..{from}]`")),
            );
            return error_expr();
        }
        let (from, to) = (from as usize, to as usize);
        let t = self.state_field(n, to, field, true, Some(span));
        let TExprKind::StateField { index, .. } = t.kind else { return t };
        typed(Type::List, TExprKind::StateRange { state: n.to_string(), from, to, field: field.name.clone(), index })
    }

    /// `cluster.outlier` and the other results of the cluster step.
    fn cluster_field(&mut self, field: &Ident) -> TExpr {
        const FIELDS: [(&str, Type); 6] = [
            ("outlier", Type::Bool),
            ("score", Type::Number),
            ("median", Type::Number),
            ("mean", Type::Number),
            ("mad", Type::Number),
            ("size", Type::Number),
        ];
        match FIELDS.iter().find(|(f, _)| *f == field.name) {
            Some((f, ty)) => typed(*ty, TExprKind::ClusterField(f)),
            None => {
                let names: Vec<&str> = FIELDS.iter().map(|(f, _)| *f).collect();
                self.unknown_field(&field.name, field.span, "`cluster`", &names);
                error_expr()
            }
        }
    }

    pub(super) fn state_field(
        &mut self,
        state: &str,
        ago: usize,
        field: &Ident,
        range: bool,
        idx_span: Option<Span>,
    ) -> TExpr {
        let info = self.state.as_ref().expect("state is in scope");
        let history = info.history;
        let ty = info.fields.get(&field.name).copied();
        let names: Vec<String> = info.field_order.clone();
        if ago >= history {
            let span = idx_span.unwrap_or(field.span);
            let d = Diagnostic::new(
                codes::HISTORY_RANGE,
                format!(
                    "state `{state}` keeps {history} window{}, so index {ago} is out of range",
                    if history == 1 { "" } else { "s" }
                ),
                span,
                format!("valid indexes are 0..{}", history - 1),
            )
            .with_help(format!("declare more history: `state[{}] {state} {{ ... }}`", ago.saturating_add(1)));
            self.error(d);
            return error_expr();
        }
        let Some(ty) = ty else {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            self.unknown_field(&field.name, field.span, &format!("state `{state}`"), &names);
            return error_expr();
        };
        if range && ty != Type::Number && ty != Type::Error {
            self.error(Diagnostic::new(
                codes::TYPE_MISMATCH,
                format!("a range of windows needs a number field; `{}` is a {ty}", field.name),
                field.span,
                "not a number",
            ));
            return error_expr();
        }
        let index = names.iter().position(|n| *n == field.name).unwrap_or(0);
        typed(ty, TExprKind::StateField { state: state.to_string(), ago, field: field.name.clone(), index })
    }

    pub(super) fn entity_field(&mut self, e: &Expr, var: &str, field: &Ident, scope: &Scope) -> TExpr {
        let info = &self.entities[var];
        let kind = info.kind;
        let bindings = info.bindings.clone();
        let sources: Vec<usize> = bindings.iter().map(|(s, _)| *s).collect();
        if !self.check_access(var, source_set(&sources), e.span, scope) {
            return error_expr();
        }
        if let Vars::GroupKeys = scope.vars {
            let grouped_entity = self.state.as_ref().is_some_and(|s| s.entity_keys.iter().any(|k| k == var));
            let ok = (grouped_entity && kind.key_fields().contains(&field.name.as_str())) || self.is_value_key(e);
            if !ok {
                self.not_a_key(&e.to_string(), e.span);
                return error_expr();
            }
        }
        let visible: Vec<(usize, Role)> = match scope.vars {
            Vars::Sources(allowed) => bindings.iter().copied().filter(|(s, _)| allowed.contains(s)).collect(),
            Vars::GroupKeys => bindings.clone(),
        };
        for (source, role) in &visible {
            let stream = self.sources[*source].stream;
            if let Some(&(attr, index)) = stream.attributes(kind, *role).iter().find(|(a, _)| *a == field.name) {
                let ty = stream.fields()[index].1;
                return typed(ty, TExprKind::EntityField { var: var.to_string(), source: *source, field: attr, index });
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for (source, role) in &visible {
            for (attr, _) in self.sources[*source].stream.attributes(kind, *role) {
                if !names.contains(attr) {
                    names.push(attr);
                }
            }
        }
        let mut d = Diagnostic::new(
            codes::UNKNOWN_FIELD,
            format!("unknown field `{}` on {} `{var}`", field.name, kind.name()),
            field.span,
            "no such field",
        )
        .with_help(suggestion(&field.name, &names));
        // The field may exist on the event rather than on the entity.
        if let Some((source, _)) = visible.first() {
            let src = &self.sources[*source];
            if src.stream.field(&field.name).is_some() {
                d = d.with_help(format!(
                    "`{}` is a field of the event: write `{}.{}`",
                    field.name, src.event_var, field.name
                ));
            }
        }
        self.error(d);
        error_expr()
    }

    pub(super) fn unknown_field(&mut self, field: &str, span: Span, owner: &str, names: &[&str]) {
        self.error(
            Diagnostic::new(codes::UNKNOWN_FIELD, format!("unknown field `{field}` on {owner}"), span, "no such field")
                .with_help(suggestion(field, names)),
        );
    }
}

fn info_first_field(stream: Stream) -> &'static str {
    stream.fields().iter().find(|(_, t)| *t == Type::Number).map_or("ts", |(n, _)| n)
}

/// The catalogue's own `&'static str` for a field name known to exist.
fn static_field(stream: Stream, field: &str) -> &'static str {
    if field == "ts" {
        return "ts";
    }
    stream.fields().iter().find(|(n, _)| *n == field).map_or("ts", |(n, _)| n)
}
