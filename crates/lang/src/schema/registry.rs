//! The process's table of checked declarations, which [`Stream`] and [`EntityKind`] ids index.
//!
//! A declaration is registered once per distinct text: two rule sets that declare the same
//! stream get the same id, a changed declaration gets a new one, and nothing is removed (a
//! reload that changes a stream leaves the old declaration for the events and state still under
//! it). Lookups by id are a load from a fixed table, without a lock: the decoder and the engine
//! make them per event. Vigil's own declarations ([`super::Catalog::prelude`]) are registered
//! first, so their ids are the constants of [`Stream`] and [`EntityKind`].

use super::{EntityKind, Role, Stream, Type};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, OnceLock, RwLock};

/// Most stream declarations one process registers; a reload that changes a stream adds one.
const MAX_STREAMS: usize = 4096;
const MAX_KINDS: usize = 4096;

/// Most fields one stream may declare: the engine keeps which fields a rule reads as the bits
/// of a `u64`.
pub const MAX_FIELDS: usize = 64;

/// A checked stream declaration.
#[derive(Debug)]
pub struct StreamDef {
    pub name: &'static str,
    /// Name and type of each field, in the order events keep them.
    pub fields: Vec<(&'static str, Type)>,
    /// The positions of the fields an event must have, as bits.
    pub required: u64,
    /// Position of the field that names the operation.
    pub operation: Option<usize>,
    pub bindings: Vec<Binding>,
    pub ops: Vec<OpDef>,
    /// By interned field name ([`field_id`]): where this stream keeps it.
    pub(super) positions: Vec<Option<u8>>,
    pub fingerprint: u64,
}

/// Which places of a pattern a binding is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    Subject,
    Object,
    Both,
}

/// The attributes of one kind of entity on a stream's events, each with the position of the
/// field it is read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Binding {
    pub place: Place,
    pub kind: EntityKind,
    pub attrs: Vec<(&'static str, usize)>,
}

/// An operation a stream's events can be selected by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OpDef {
    pub subject: EntityKind,
    pub name: &'static str,
    pub object: Option<EntityKind>,
    pub object_optional: bool,
    /// The value of the operation field it selects; every event when `None`.
    pub value: Option<&'static str>,
}

/// A checked entity kind.
#[derive(Debug)]
pub struct KindDef {
    pub name: &'static str,
    pub keys: Vec<&'static str>,
    pub fingerprint: u64,
}

impl StreamDef {
    /// The binding of `kind` for `role`: one for that place if there is one, else one for both.
    pub fn binding(&self, kind: EntityKind, role: Role) -> Option<&Binding> {
        let place = match role {
            Role::Subject => Place::Subject,
            Role::Object => Place::Object,
        };
        let of = |p: Place| self.bindings.iter().find(|b| b.kind == kind && b.place == p);
        of(place).or_else(|| of(Place::Both))
    }
}

/// A stream declaration with its names resolved, before it is registered: what it is interned
/// by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct StreamSpec {
    pub name: String,
    /// Name, type and whether events may leave it out.
    pub fields: Vec<(String, Type, bool)>,
    pub operation: Option<usize>,
    pub bindings: Vec<BindingSpec>,
    pub ops: Vec<OpSpec>,
}

/// A binding's place, kind, and attributes with the positions of their fields.
pub(super) type BindingSpec = (Place, EntityKind, Vec<(String, usize)>);

/// An operation's subject, name, object (and whether it may be left out) and value.
pub(super) type OpSpec = (EntityKind, String, Option<(EntityKind, bool)>, Option<String>);

/// Every declaration registered, by what it says, and by its fingerprint.
pub(super) struct Registry {
    streams: HashMap<StreamSpec, Stream>,
    streams_by_fingerprint: HashMap<u64, Stream>,
    kinds: HashMap<(String, Vec<String>), EntityKind>,
    kinds_by_fingerprint: HashMap<u64, EntityKind>,
}

static STREAMS: [OnceLock<&'static StreamDef>; MAX_STREAMS] = [const { OnceLock::new() }; MAX_STREAMS];
static KINDS: [OnceLock<&'static KindDef>; MAX_KINDS] = [const { OnceLock::new() }; MAX_KINDS];
/// Every field name any declaration has, numbered: the decoder matches a key once, against this.
static FIELD_IDS: LazyLock<RwLock<HashMap<&'static str, usize>>> = LazyLock::new(Default::default);
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        streams: HashMap::new(),
        streams_by_fingerprint: HashMap::new(),
        kinds: HashMap::new(),
        kinds_by_fingerprint: HashMap::new(),
    })
});

/// Registers declarations with the registry locked; `declare` is handed the registry.
pub(super) fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut registry = REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    f(&mut registry)
}

impl Registry {
    /// The kind `name` with `keys`, registered if it is new; `None` when the table is full.
    pub(super) fn kind(&mut self, name: &str, keys: &[String]) -> Option<EntityKind> {
        let key = (name.to_string(), keys.to_vec());
        if let Some(kind) = self.kinds.get(&key) {
            return Some(*kind);
        }
        let id = self.kinds.len();
        let fingerprint = if id < 4 { id as u64 } else { declared_fingerprint(&("entity", &key)) };
        let def: &'static KindDef = Box::leak(Box::new(KindDef {
            name: leak(name),
            keys: keys.iter().map(|k| leak(k)).collect(),
            fingerprint,
        }));
        KINDS.get(id)?.set(def).ok()?;
        let kind = EntityKind(u16::try_from(id).ok()?);
        self.kinds.insert(key, kind);
        self.kinds_by_fingerprint.insert(fingerprint, kind);
        Some(kind)
    }

    /// The stream `spec` declares, registered if it is new; `None` when the table is full.
    pub(super) fn stream(&mut self, spec: StreamSpec) -> Option<Stream> {
        if let Some(stream) = self.streams.get(&spec) {
            return Some(*stream);
        }
        let id = self.streams.len();
        let fingerprint = if id < 4 { id as u64 } else { declared_fingerprint(&spec_text(&spec)) };
        let fields: Vec<(&'static str, Type)> = spec.fields.iter().map(|(n, t, _)| (leak(n), *t)).collect();
        let mut positions = Vec::new();
        {
            let mut ids = FIELD_IDS.write().unwrap_or_else(|poisoned| poisoned.into_inner());
            for (p, (name, _)) in fields.iter().enumerate() {
                let next = ids.len();
                let g = *ids.entry(name).or_insert(next);
                if positions.len() <= g {
                    positions.resize(g + 1, None);
                }
                positions[g] = Some(u8::try_from(p).ok()?);
            }
        }
        let required = spec.fields.iter().enumerate().filter(|(_, f)| !f.2).fold(0u64, |bits, (p, _)| bits | 1 << p);
        let def: &'static StreamDef = Box::leak(Box::new(StreamDef {
            name: leak(&spec.name),
            fields,
            required,
            operation: spec.operation,
            bindings: spec
                .bindings
                .iter()
                .map(|(place, kind, attrs)| Binding {
                    place: *place,
                    kind: *kind,
                    attrs: attrs.iter().map(|(a, p)| (leak(a), *p)).collect(),
                })
                .collect(),
            ops: spec
                .ops
                .iter()
                .map(|(subject, name, object, value)| OpDef {
                    subject: *subject,
                    name: leak(name),
                    object: object.map(|(k, _)| k),
                    object_optional: object.is_some_and(|(_, optional)| optional),
                    value: value.as_deref().map(leak),
                })
                .collect(),
            positions,
            fingerprint,
        }));
        STREAMS.get(id)?.set(def).ok()?;
        let stream = Stream(u16::try_from(id).ok()?);
        self.streams.insert(spec, stream);
        self.streams_by_fingerprint.insert(fingerprint, stream);
        Some(stream)
    }
}

/// A declared stream's text for its fingerprint, with kinds named by their own fingerprints
/// (ids differ from process to process).
fn spec_text(spec: &StreamSpec) -> String {
    let kind = |k: &EntityKind| k.fingerprint();
    let bindings: Vec<_> = spec.bindings.iter().map(|(p, k, a)| (format!("{p:?}"), kind(k), a)).collect();
    let ops: Vec<_> = spec.ops.iter().map(|(s, n, o, v)| (kind(s), n, o.map(|(k, opt)| (kind(&k), opt)), v)).collect();
    let fields: Vec<_> = spec.fields.iter().map(|(n, t, o)| (n, t.to_string(), o)).collect();
    format!("{:?}", (&spec.name, fields, spec.operation, bindings, ops))
}

/// A declaration's fingerprint: never one of the small numbers Vigil's own ids serialize as.
fn declared_fingerprint(value: &impl std::fmt::Debug) -> u64 {
    xxhash_rust::xxh3::xxh3_64(format!("{value:?}").as_bytes()) | 1 << 63
}

fn leak(text: &str) -> &'static str {
    Box::leak(text.to_string().into_boxed_str())
}

/// The declaration of a registered stream; `None` only before the prelude is.
#[inline]
pub(super) fn stream(id: Stream) -> Option<&'static StreamDef> {
    STREAMS[id.index()].get().copied()
}

pub(super) fn kind(id: EntityKind) -> Option<&'static KindDef> {
    KINDS[usize::from(id.0)].get().copied()
}

/// The number every declaration's field named `name` is matched by, if any declares one.
pub(super) fn field_id(name: &str) -> Option<usize> {
    FIELD_IDS.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name).copied()
}

/// The stream a checkpoint or plan names by fingerprint, if its declaration is registered.
pub(super) fn stream_by_fingerprint(fingerprint: u64) -> Option<Stream> {
    REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).streams_by_fingerprint.get(&fingerprint).copied()
}

pub(super) fn kind_by_fingerprint(fingerprint: u64) -> Option<EntityKind> {
    REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).kinds_by_fingerprint.get(&fingerprint).copied()
}
