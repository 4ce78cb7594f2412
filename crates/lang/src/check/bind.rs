//! Binding: each pattern's operation resolved, and its event and entity variables registered.

use super::*;

impl RuleChecker<'_> {
    /// Resolves a pattern's operation and registers its variables.
    pub(super) fn bind_pattern(&mut self, p: &Pattern) {
        let index = self.sources.len();
        let Some(subject_kind) = self.catalog.kind(&p.subject_kind.name) else {
            self.error(
                Diagnostic::new(
                    codes::UNKNOWN_ENTITY,
                    format!("unknown entity kind `{}`", p.subject_kind.name),
                    p.subject_kind.span,
                    "not declared",
                )
                .with_help(suggestion(&p.subject_kind.name, &self.catalog.kind_names()))
                .with_note("kinds are declared with `entity NAME (key, ...)`; docs/language.md#declaring-streams"),
            );
            // The event variable still names an event, so that its uses are not reported too.
            self.register_event(&p.event, Stream::TaskEvent, index);
            self.sources.push(placeholder_source(&p.event.name, Stream::TaskEvent, EntityKind::Task, &p.subject.name));
            return;
        };
        let ops: Vec<schema::Operation> = self.catalog.operations_of(subject_kind);
        let op = ops.iter().find(|o| o.name == p.operation.name).copied();
        let Some(op) = op else {
            let names: Vec<&str> = ops.iter().map(|o| o.name).collect();
            self.error(
                Diagnostic::new(
                    codes::UNKNOWN_OPERATION,
                    format!("unknown operation `{}` for a {}", p.operation.name, subject_kind.name()),
                    p.operation.span,
                    "no such operation",
                )
                .with_help(suggestion(&p.operation.name, &names)),
            );
            // Register the variables anyway so later uses do not report them as unknown.
            self.register_event(&p.event, Stream::TaskEvent, index);
            self.register_entity(&p.subject, subject_kind, index, Role::Subject);
            if let Some((kind, var)) = &p.object {
                if let Some(k) = self.catalog.kind(&kind.name) {
                    self.register_entity(var, k, index, Role::Object);
                }
            }
            self.sources.push(placeholder_source(&p.event.name, Stream::TaskEvent, subject_kind, &p.subject.name));
            return;
        };
        let mut object = None;
        match (&p.object, op.object) {
            (Some((kind, var)), Some(expected)) => {
                if kind.name == expected.name() {
                    object = Some((expected, var.name.clone()));
                } else {
                    self.error(Diagnostic::new(
                        codes::UNKNOWN_ENTITY,
                        format!(
                            "`{} {}` takes a {} as its object, not a {}",
                            subject_kind.name(),
                            op.name,
                            expected.name(),
                            kind.name
                        ),
                        kind.span,
                        format!("expected `{}`", expected.name()),
                    ));
                }
            }
            (Some((kind, _)), None) => self.error(
                Diagnostic::new(
                    codes::UNKNOWN_ENTITY,
                    format!("`{} {}` takes no object", subject_kind.name(), op.name),
                    kind.span,
                    "unexpected object",
                )
                .with_note(format!(
                    "{} events describe the {} alone",
                    op.stream.name(),
                    subject_kind.name()
                )),
            ),
            (None, Some(expected)) if !op.object_optional => self.error(Diagnostic::new(
                codes::UNKNOWN_ENTITY,
                format!("`{} {}` needs a {} as its object", subject_kind.name(), op.name, expected.name()),
                p.operation.span,
                "object missing after this",
            )),
            _ => {}
        }
        self.register_event(&p.event, op.stream, index);
        self.register_entity(&p.subject, subject_kind, index, Role::Subject);
        if let (Some((kind, var)), Some((_, _))) = (&p.object, &object) {
            if let Some(k) = self.catalog.kind(&kind.name) {
                self.register_entity(var, k, index, Role::Object);
            }
        }
        self.sources.push(SourcePlan {
            event_var: p.event.name.clone(),
            stream: op.stream,
            event_type: op.event_type,
            subject: (subject_kind, p.subject.name.clone()),
            object,
            filter: None,
        });
    }

    pub(super) fn register_event(&mut self, var: &Ident, stream: Stream, source: usize) {
        if self.events.contains_key(&var.name) || self.entities.contains_key(&var.name) {
            self.error(Diagnostic::new(
                codes::DUPLICATE_NAME,
                format!("`{}` is already bound", var.name),
                var.span,
                "each event needs a name of its own",
            ));
            return;
        }
        self.events.insert(var.name.clone(), EventInfo { source, stream });
    }

    pub(super) fn register_entity(&mut self, var: &Ident, kind: EntityKind, source: usize, role: Role) {
        if self.events.contains_key(&var.name) {
            self.error(Diagnostic::new(
                codes::DUPLICATE_NAME,
                format!("`{}` already names an event", var.name),
                var.span,
                "an entity needs a different name",
            ));
            return;
        }
        match self.entities.get_mut(&var.name) {
            Some(info) if info.kind != kind => {
                let (first_kind, first_span) = (info.kind, info.span);
                self.error(
                    Diagnostic::new(
                        codes::ENTITY_CONFLICT,
                        format!("`{}` is a {} here but a {} before", var.name, kind.name(), first_kind.name()),
                        var.span,
                        format!("used as a {}", kind.name()),
                    )
                    .with_secondary(first_span, format!("bound as a {} here", first_kind.name()))
                    .with_note("reusing a variable means \"the same entity\", so both places need the same kind"),
                );
            }
            Some(info) => info.bindings.push((source, role)),
            None => {
                self.entities
                    .insert(var.name.clone(), EntityInfo { kind, span: var.span, bindings: vec![(source, role)] });
                self.entity_order.push(var.name.clone());
            }
        }
    }
}

fn placeholder_source(event: &str, stream: Stream, kind: EntityKind, subject: &str) -> SourcePlan {
    SourcePlan {
        event_var: event.to_string(),
        stream,
        event_type: None,
        subject: (kind, subject.to_string()),
        object: None,
        filter: None,
    }
}
