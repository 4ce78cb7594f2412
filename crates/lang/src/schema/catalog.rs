//! A rule set's catalogue: which declaration each stream and kind name means, built from the
//! `entity` and `stream` declarations of its files on top of Vigil's own.

use super::registry::{self, BindingSpec, OpSpec, Place, Registry, StreamSpec, MAX_FIELDS};
use super::{EntityKind, Operation, Stream, Type};
use crate::ast::{self, BindingDecl, Ident, OpDecl, PlaceDecl, StreamDecl};
use crate::diagnostic::{codes, suggestion, Diagnostic};
use std::sync::LazyLock;

/// Vigil's own streams and kinds, as text.
const PRELUDE: &str = include_str!("../../prelude.saql");

/// Vigil's own streams and kinds, registered before anything else is, so that their ids are
/// the constants of [`Stream`] and [`EntityKind`].
static PRELUDE_CATALOG: LazyLock<Catalog> = LazyLock::new(|| {
    let (file, syntax) = crate::parser::parse(PRELUDE);
    assert!(syntax.is_empty(), "the prelude parses: {syntax:?}");
    let (catalog, problems) = registry::with_registry(|registrar| declare(&[&file], None, registrar));
    assert!(problems.is_empty(), "the prelude checks: {problems:?}");
    assert_eq!(catalog.streams, Stream::BUILT_IN, "the prelude's streams take the first ids");
    catalog
});

/// Names to declarations, for one rule set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    streams: Vec<Stream>,
    kinds: Vec<EntityKind>,
}

impl Catalog {
    /// Vigil's own streams and kinds, which every catalogue starts from.
    pub fn prelude() -> &'static Catalog {
        &PRELUDE_CATALOG
    }

    /// The declarations of `files`, checked and registered on top of the prelude's; the
    /// problems, each with the index of its file. A declaration with a problem is left out, and
    /// the rules over it then report what they cannot find.
    pub fn declare(files: &[&ast::File]) -> (Catalog, Vec<(usize, Diagnostic)>) {
        Catalog::prelude().declare_over(files)
    }

    /// [`Catalog::declare`] on top of this catalogue (a running rule set's) instead of the
    /// prelude: a stream or kind of this one that the files declare again is replaced by theirs,
    /// as when the file that declared it is changed. Vigil's own cannot be (E0401).
    pub fn declare_over(&self, files: &[&ast::File]) -> (Catalog, Vec<(usize, Diagnostic)>) {
        let declared = |name: &str| files.iter().any(|f| f.streams.iter().any(|s| s.name.name == name));
        let kind_declared = |name: &str| files.iter().any(|f| f.entities.iter().any(|k| k.name.name == name));
        let prelude = Catalog::prelude();
        let mut base = self.clone();
        base.streams.retain(|s| prelude.streams.contains(s) || !declared(s.name()));
        base.kinds.retain(|k| prelude.kinds.contains(k) || !kind_declared(k.name()));
        registry::with_registry(|registrar| declare(files, Some(&base), registrar))
    }

    pub fn stream(&self, name: &str) -> Option<Stream> {
        self.streams.iter().copied().find(|s| s.name() == name)
    }

    pub fn kind(&self, name: &str) -> Option<EntityKind> {
        self.kinds.iter().copied().find(|k| k.name() == name)
    }

    /// Every stream, Vigil's own first, then in order of declaration.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    pub fn stream_names(&self) -> Vec<&'static str> {
        self.streams.iter().map(|s| s.name()).collect()
    }

    pub fn kind_names(&self) -> Vec<&'static str> {
        self.kinds.iter().map(|k| k.name()).collect()
    }

    /// Every operation a `kind` subject can perform, over every stream.
    pub fn operations_of(&self, kind: EntityKind) -> Vec<Operation> {
        self.operations().filter(|o| o.subject == kind).collect()
    }

    pub fn operations(&self) -> impl Iterator<Item = Operation> + '_ {
        self.streams.iter().flat_map(|&stream| {
            stream.def().ops.iter().map(move |op| Operation {
                subject: op.subject,
                name: op.name,
                stream,
                event_type: op.value,
                object: op.object,
                object_optional: op.object_optional,
            })
        })
    }

    /// The streams the prelude does not have.
    pub fn declared(&self) -> impl Iterator<Item = Stream> + '_ {
        self.streams.iter().copied().filter(|s| !Stream::BUILT_IN.contains(s))
    }
}

/// What `GET /api/v1/streams` and `vigil explain` show of a stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StreamInfo {
    pub name: &'static str,
    /// Whether it is one of Vigil's own, from the prelude.
    pub built_in: bool,
    pub fields: Vec<FieldInfo>,
    /// The field whose value names the operation.
    pub operation: Option<&'static str>,
    pub entities: Vec<EntityInfo>,
    pub operations: Vec<OperationInfo>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FieldInfo {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub ty: String,
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EntityInfo {
    pub kind: &'static str,
    /// `subject`, `object`, or `both`.
    pub place: &'static str,
    pub key: Vec<&'static str>,
    /// Each attribute with the field it is read from.
    pub attributes: Vec<(&'static str, &'static str)>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OperationInfo {
    /// As a pattern writes it: `pod evict [node]`.
    pub pattern: String,
    /// The operation field's value it selects; every event when `None`.
    pub value: Option<&'static str>,
}

impl Catalog {
    /// Every stream, described.
    pub fn describe(&self) -> Vec<StreamInfo> {
        self.streams.iter().map(|&s| describe(s)).collect()
    }
}

fn describe(stream: Stream) -> StreamInfo {
    let def = stream.def();
    let fields = def
        .fields
        .iter()
        .enumerate()
        .map(|(p, (name, ty))| FieldInfo { name, ty: ty.to_string(), required: def.required & (1 << p) != 0 })
        .collect();
    let entities = def
        .bindings
        .iter()
        .map(|b| EntityInfo {
            kind: b.kind.name(),
            place: match b.place {
                Place::Subject => "subject",
                Place::Object => "object",
                Place::Both => "both",
            },
            key: b.kind.key_fields().to_vec(),
            attributes: b.attrs.iter().map(|(a, p)| (*a, def.fields[*p].0)).collect(),
        })
        .collect();
    let operations = def
        .ops
        .iter()
        .map(|op| {
            let object = match op.object {
                Some(k) if op.object_optional => format!(" [{}]", k.name()),
                Some(k) => format!(" {}", k.name()),
                None => String::new(),
            };
            OperationInfo { pattern: format!("{} {}{object}", op.subject.name(), op.name), value: op.value }
        })
        .collect();
    StreamInfo {
        name: def.name,
        built_in: Stream::BUILT_IN.contains(&stream),
        fields,
        operation: def.operation.map(|p| def.fields[p].0),
        entities,
        operations,
    }
}

/// Checks and registers declarations: kinds first, from every file, so that a stream may bind a
/// kind declared in another file.
pub(super) fn declare(
    files: &[&ast::File],
    base: Option<&Catalog>,
    registrar: &mut Registry,
) -> (Catalog, Vec<(usize, Diagnostic)>) {
    let mut catalog = base.cloned().unwrap_or(Catalog { streams: Vec::new(), kinds: Vec::new() });
    let mut problems = Vec::new();
    for (i, file) in files.iter().enumerate() {
        for decl in &file.entities {
            match entity(&catalog, decl) {
                Ok(keys) => match registrar.kind(&decl.name.name, &keys) {
                    Some(kind) => catalog.kinds.push(kind),
                    None => problems.push((i, too_many(decl.name.span))),
                },
                Err(d) => problems.push((i, d)),
            }
        }
    }
    for (i, file) in files.iter().enumerate() {
        for decl in &file.streams {
            let mut diags = Vec::new();
            let spec = StreamChecker { catalog: &catalog, decl, diags: &mut diags }.spec();
            match spec {
                Some(spec) if diags.is_empty() => match registrar.stream(spec) {
                    Some(stream) => catalog.streams.push(stream),
                    None => problems.push((i, too_many(decl.name.span))),
                },
                _ => problems.extend(diags.into_iter().map(|d| (i, d))),
            }
        }
    }
    (catalog, problems)
}

fn too_many(span: ast::Span) -> Diagnostic {
    Diagnostic::new(codes::DECLARED_TWICE, "this process has registered as many declarations as it can", span, "here")
        .with_help("restart Vigil: every changed declaration a reload takes is kept until then")
}

fn entity(catalog: &Catalog, decl: &ast::EntityDecl) -> Result<Vec<String>, Diagnostic> {
    if let Some(kind) = catalog.kind(&decl.name.name) {
        return Err(twice("entity kind", &decl.name, Catalog::prelude().kinds.contains(&kind)));
    }
    let mut keys: Vec<String> = Vec::new();
    for key in &decl.keys {
        if keys.contains(&key.name) {
            return Err(Diagnostic::new(
                codes::DECLARED_TWICE,
                format!("`{}` is named twice in the key of `{}`", key.name, decl.name.name),
                key.span,
                "again here",
            ));
        }
        keys.push(key.name.clone());
    }
    Ok(keys)
}

fn twice(what: &str, name: &Ident, built_in: bool) -> Diagnostic {
    let d = Diagnostic::new(
        codes::DECLARED_TWICE,
        format!("{what} `{}` is already declared", name.name),
        name.span,
        "declared again here",
    );
    if built_in {
        d.with_note(format!("`{}` is one of Vigil's own (docs/language.md#streams)", name.name))
            .with_help("give yours another name")
    } else {
        d.with_note("names are unique across the rule set's files")
    }
}

/// The types a field can be declared with.
const FIELD_TYPES: &[(&str, Type)] =
    &[("string", Type::Str), ("number", Type::Number), ("bool", Type::Bool), ("map", Type::Map)];

/// Checks one stream declaration, and resolves it into what the registry keeps.
struct StreamChecker<'a> {
    catalog: &'a Catalog,
    decl: &'a StreamDecl,
    diags: &'a mut Vec<Diagnostic>,
}

impl StreamChecker<'_> {
    fn spec(&mut self) -> Option<StreamSpec> {
        let decl = self.decl;
        if let Some(stream) = self.catalog.stream(&decl.name.name) {
            self.diags.push(twice("stream", &decl.name, Stream::BUILT_IN.contains(&stream)));
            return None;
        }
        let fields = self.fields();
        let operation = decl.operation.as_ref().and_then(|field| self.operation_field(&fields, field));
        let bindings: Vec<_> = decl.bindings.iter().filter_map(|b| self.binding(&fields, b)).collect();
        // A kind whose binding has a problem counts as bound: that problem is reported already.
        let attempted: Vec<(Place, EntityKind)> =
            decl.bindings.iter().filter_map(|b| Some((place_of(b.place), self.catalog.kind(&b.kind.name)?))).collect();
        let mut ops: Vec<OpSpec> = Vec::new();
        for op in &decl.ops {
            if let Some(spec) = self.op(&attempted, operation.is_some(), op) {
                if ops.iter().any(|o| o.0 == spec.0 && o.1 == spec.1) {
                    self.diags.push(Diagnostic::new(
                        codes::OPERATION_DECL,
                        format!("operation `{} {}` is declared twice", spec.0.name(), spec.1),
                        op.name.span,
                        "declared again here",
                    ));
                    continue;
                }
                ops.push(spec);
            }
        }
        if ops.is_empty() && self.diags.is_empty() {
            self.diags.push(
                Diagnostic::new(
                    codes::OPERATION_DECL,
                    format!("stream `{}` declares no operation", decl.name.name),
                    decl.name.span,
                    "no `op` line",
                )
                .with_help("patterns select events by operation: add e.g. `op pod event` for every event"),
            );
        }
        Some(StreamSpec { name: decl.name.name.clone(), fields, operation, bindings, ops })
    }

    fn fields(&mut self) -> Vec<(String, Type, bool)> {
        let mut fields: Vec<(String, Type, bool)> = Vec::new();
        let mut names: Vec<&str> = Vec::new();
        for f in &self.decl.fields {
            if names.contains(&f.name.name.as_str()) {
                self.diags.push(Diagnostic::new(
                    codes::DECLARED_TWICE,
                    format!("field `{}` is declared twice", f.name.name),
                    f.name.span,
                    "again here",
                ));
                continue;
            }
            names.push(&f.name.name);
            if matches!(f.name.name.as_str(), "ts" | "stream") {
                self.diags.push(
                    Diagnostic::new(
                        codes::FIELD_DECL,
                        format!("`{}` cannot be declared", f.name.name),
                        f.name.span,
                        "every event has it",
                    )
                    .with_note("`stream` names an event's stream and `ts` its time, on every stream"),
                );
                continue;
            }
            let Some((_, ty)) = FIELD_TYPES.iter().find(|(n, _)| *n == f.ty.name) else {
                let names: Vec<&str> = FIELD_TYPES.iter().map(|(n, _)| *n).collect();
                self.diags.push(
                    Diagnostic::new(
                        codes::FIELD_DECL,
                        format!("unknown field type `{}`", f.ty.name),
                        f.ty.span,
                        "no such type",
                    )
                    .with_help(suggestion(&f.ty.name, &names)),
                );
                // Kept, of no type, so that bindings of it do not report it missing too.
                fields.push((f.name.name.clone(), Type::Error, f.optional));
                continue;
            };
            fields.push((f.name.name.clone(), *ty, f.optional));
        }
        if fields.len() > MAX_FIELDS {
            self.diags.push(Diagnostic::new(
                codes::FIELD_DECL,
                format!(
                    "stream `{}` declares {} fields; at most {MAX_FIELDS} are allowed",
                    self.decl.name.name,
                    fields.len()
                ),
                self.decl.name.span,
                "too many fields",
            ));
        }
        fields
    }

    fn position(&mut self, fields: &[(String, Type, bool)], field: &Ident) -> Option<usize> {
        let position = fields.iter().position(|(n, _, _)| *n == field.name);
        if position.is_none() {
            let names: Vec<&str> = fields.iter().map(|(n, _, _)| n.as_str()).collect();
            self.diags.push(
                Diagnostic::new(
                    codes::UNKNOWN_FIELD,
                    format!("stream `{}` has no field `{}`", self.decl.name.name, field.name),
                    field.span,
                    "no such field",
                )
                .with_help(suggestion(&field.name, &names)),
            );
        }
        position
    }

    fn operation_field(&mut self, fields: &[(String, Type, bool)], field: &Ident) -> Option<usize> {
        let p = self.position(fields, field)?;
        if fields[p].1 != Type::Str {
            self.diags.push(Diagnostic::new(
                codes::OPERATION_DECL,
                format!("the operation field `{}` must be a string", field.name),
                field.span,
                format!("declared as a {}", fields[p].1),
            ));
            return None;
        }
        Some(p)
    }

    fn kind(&mut self, name: &Ident) -> Option<EntityKind> {
        let kind = self.catalog.kind(&name.name);
        if kind.is_none() {
            self.diags.push(
                Diagnostic::new(
                    codes::UNKNOWN_ENTITY,
                    format!("unknown entity kind `{}`", name.name),
                    name.span,
                    "not declared",
                )
                .with_help(suggestion(&name.name, &self.catalog.kind_names()))
                .with_note("declare it with `entity NAME (key, ...)`"),
            );
        }
        kind
    }

    fn binding(&mut self, fields: &[(String, Type, bool)], b: &BindingDecl) -> Option<BindingSpec> {
        let kind = self.kind(&b.kind)?;
        let place = place_of(b.place);
        let mut attrs: Vec<(String, usize)> = Vec::new();
        for (attr, field) in &b.attrs {
            if attrs.iter().any(|(a, _)| *a == attr.name) {
                self.diags.push(Diagnostic::new(
                    codes::DECLARED_TWICE,
                    format!("attribute `{}` is bound twice", attr.name),
                    attr.span,
                    "again here",
                ));
                continue;
            }
            attrs.push((attr.name.clone(), self.position(fields, field)?));
        }
        let missing: Vec<&str> =
            kind.key_fields().iter().copied().filter(|k| !attrs.iter().any(|(a, _)| a == k)).collect();
        if !missing.is_empty() {
            self.diags.push(
                Diagnostic::new(
                    codes::BINDING,
                    format!(
                        "`{}` entities are identified by {}, but this binding leaves out {}",
                        kind.name(),
                        quoted(kind.key_fields()),
                        quoted(&missing)
                    ),
                    b.span,
                    "key attributes missing",
                )
                .with_help(format!("bind each to a field, e.g. `{} = FIELD`", missing[0])),
            );
            return None;
        }
        Some((place, kind, attrs))
    }

    fn op(&mut self, bound: &[(Place, EntityKind)], has_field: bool, op: &OpDecl) -> Option<OpSpec> {
        let subject = self.kind(&op.subject)?;
        let bound = |kind: EntityKind, place: Place| {
            bound.iter().any(|(p, k)| *k == kind && (*p == place || *p == Place::Both))
        };
        if !bound(subject, Place::Subject) {
            self.unbound(&op.subject, "subject");
            return None;
        }
        let object = match &op.object {
            Some((name, optional)) => {
                let kind = self.kind(name)?;
                if !bound(kind, Place::Object) {
                    self.unbound(name, "object");
                    return None;
                }
                Some((kind, *optional))
            }
            None => None,
        };
        if let (Some((_, span)), false) = (&op.value, has_field) {
            self.diags.push(
                Diagnostic::new(
                    codes::OPERATION_DECL,
                    "an operation with a value needs an operation field",
                    *span,
                    "selects by a field the stream does not name",
                )
                .with_help("add `operation FIELD`, the field whose value names the operation"),
            );
            return None;
        }
        let other = self.catalog.operations().find(|o| o.subject == subject && o.name == op.name.name);
        if let Some(other) = other {
            self.diags.push(
                Diagnostic::new(
                    codes::OPERATION_DECL,
                    format!(
                        "operation `{} {}` is already declared by stream `{}`",
                        subject.name(),
                        op.name.name,
                        other.stream.name()
                    ),
                    op.name.span,
                    "declared again here",
                )
                .with_note("a pattern names its stream by its operation, so each is declared once"),
            );
            return None;
        }
        Some((subject, op.name.name.clone(), object, op.value.as_ref().map(|(v, _)| v.clone())))
    }

    fn unbound(&mut self, kind: &Ident, place: &str) {
        self.diags.push(
            Diagnostic::new(
                codes::BINDING,
                format!("stream `{}` binds no `{}` entity for the {place}", self.decl.name.name, kind.name),
                kind.span,
                "not bound",
            )
            .with_help(format!("say which fields it is read from: `entity {} (...)`", kind.name)),
        );
    }
}

fn place_of(place: PlaceDecl) -> Place {
    match place {
        PlaceDecl::Subject => Place::Subject,
        PlaceDecl::Object => Place::Object,
        PlaceDecl::Both => Place::Both,
    }
}

fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}
