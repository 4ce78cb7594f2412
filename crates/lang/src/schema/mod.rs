//! Streams, entity kinds and operations: what rules are written over.
//!
//! All of them are declared in rule files (`stream` and `entity`, docs/language.md), Vigil's own
//! in [`prelude.saql`](../../prelude.saql). A declaration, once checked, is registered for the
//! life of the process ([`registry`]) and named by a small id, [`Stream`] or [`EntityKind`],
//! that events and plans carry and that tables are indexed by. Which name means which
//! declaration is a rule set's [`Catalog`]: two rule sets may declare a stream of the same name
//! differently. Field names are the JSON field names of events; the checker resolves every
//! `e.field` and `t.field` against the catalogue.

use std::fmt;

mod catalog;
mod registry;

pub use catalog::{Catalog, EntityInfo, FieldInfo, OperationInfo, StreamInfo};
pub use registry::{Binding, KindDef, OpDef, Place, StreamDef, MAX_FIELDS};

/// The type of a value in the rule language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Type {
    Number,
    Str,
    Bool,
    Duration,
    /// An event's timestamp.
    Time,
    /// A set of strings or numbers.
    Set,
    /// Values of one state field over a range of windows, `ss[1..3].cpu`.
    List,
    /// A list literal `[a, b]`, the right side of `in`.
    Literals,
    /// `labels` of a metric: string keys to string values.
    Map,
    Entity(EntityKind),
    Event(Stream),
    /// A state name (`ss`), which must be indexed or have a field taken.
    State,
    /// `cluster`, which must have a field taken.
    Cluster,
    /// The type of an expression that already has a reported error; it matches everything so
    /// one mistake does not cascade into more.
    Error,
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Number => f.write_str("number"),
            Type::Str => f.write_str("string"),
            Type::Bool => f.write_str("bool"),
            Type::Duration => f.write_str("duration"),
            Type::Time => f.write_str("time"),
            Type::Set => f.write_str("set"),
            Type::List => f.write_str("list of numbers"),
            Type::Literals => f.write_str("list"),
            Type::Map => f.write_str("map"),
            Type::Entity(k) => write!(f, "{} entity", k.name()),
            Type::Event(s) => write!(f, "{} event", s.name()),
            Type::State => f.write_str("state"),
            Type::Cluster => f.write_str("cluster result"),
            Type::Error => f.write_str("unknown"),
        }
    }
}

/// A declared stream: an id into the process's table of stream declarations. Vigil's own four
/// have fixed ids, the first four, in the order of the prelude.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stream(u16);

#[allow(non_upper_case_globals)]
impl Stream {
    pub const TaskEvent: Stream = Stream(0);
    pub const TaskUsage: Stream = Stream(1);
    pub const MachineEvent: Stream = Stream(2);
    pub const Metric: Stream = Stream(3);
    /// Vigil's own streams, in the prelude's order.
    pub const BUILT_IN: [Stream; 4] = [Stream::TaskEvent, Stream::TaskUsage, Stream::MachineEvent, Stream::Metric];

    /// The declaration this id names.
    #[inline]
    pub fn def(self) -> &'static StreamDef {
        match registry::stream(self) {
            Some(def) => def,
            None => registered_late(|| registry::stream(self)),
        }
    }

    /// The id as an index into tables by stream.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// The fields an event of this stream carries, besides `ts`, in the order events keep them.
    pub fn fields(self) -> &'static [(&'static str, Type)] {
        &self.def().fields
    }

    /// The positions of the fields an event must have, as bits.
    pub fn required(self) -> u64 {
        self.def().required
    }

    /// Where this stream keeps the field interned as `g` ([`registry::field_id`]), if it has it.
    #[inline]
    pub fn position_of_global(self, g: usize) -> Option<usize> {
        self.def().positions.get(g).copied().flatten().map(usize::from)
    }

    /// The type of `field` on an event of this stream; `ts` is on every stream.
    pub fn field(self, field: &str) -> Option<Type> {
        if field == "ts" {
            return Some(Type::Time);
        }
        self.fields().iter().find(|(n, _)| *n == field).map(|(_, t)| *t)
    }

    /// Position of a field in `fields()`, which is where events keep its value.
    pub fn field_index(self, field: &str) -> Option<usize> {
        self.fields().iter().position(|(n, _)| *n == field)
    }

    /// Position of the field that names the operation (`type` of Vigil's own streams), which
    /// routes every event to the rules of its operation.
    #[inline]
    pub fn type_index(self) -> Option<usize> {
        self.def().operation
    }

    pub fn field_names(self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.fields().iter().map(|(n, _)| *n).collect();
        names.push("ts");
        names
    }

    /// The attributes of a `kind` entity in `role` on this stream's events, each with the
    /// position of the field it is read from.
    pub fn attributes(self, kind: EntityKind, role: Role) -> &'static [(&'static str, usize)] {
        self.def().binding(kind, role).map_or(&[], |b| &b.attrs[..])
    }

    /// Where the key attributes of a `kind` entity in `role` are read from, in the kind's order.
    pub fn key_positions(self, kind: EntityKind, role: Role) -> Vec<usize> {
        let attrs = self.attributes(kind, role);
        kind.key_fields().iter().map(|k| attrs.iter().find(|(a, _)| a == k).map_or(TS_INDEX - 1, |(_, p)| *p)).collect()
    }

    /// What identifies this declaration across processes: for Vigil's own streams their id, for
    /// a declared one a hash of what it declares.
    pub fn fingerprint(self) -> u64 {
        self.def().fingerprint
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An entity kind: an id into the process's table of kinds, Vigil's own four first.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityKind(u16);

#[allow(non_upper_case_globals)]
impl EntityKind {
    pub const Task: EntityKind = EntityKind(0);
    pub const Machine: EntityKind = EntityKind(1);
    pub const Host: EntityKind = EntityKind(2);
    pub const Metric: EntityKind = EntityKind(3);

    pub fn def(self) -> &'static KindDef {
        registry::kind(self).unwrap_or_else(|| registered_late(|| registry::kind(self)))
    }

    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// The attributes that identify one entity: two variables of this kind are the same entity
    /// when these are equal, and grouping by the entity groups by these.
    pub fn key_fields(self) -> &'static [&'static str] {
        &self.def().keys
    }

    /// The version of [`key_fields`](Self::key_fields) for Vigil's own kinds: raised whenever a
    /// kind's key changes, so that state a checkpoint kept under the old keys is not restored
    /// under the new ones (it is part of a rule's state identity,
    /// [`crate::plan::RulePlan::state_id`]). Version 1 of `metric` added `labels`. A declared
    /// kind's keys are in its fingerprint, which plans carry.
    pub fn key_version(self) -> u32 {
        u32::from(self == EntityKind::Metric)
    }

    pub fn fingerprint(self) -> u64 {
        self.def().fingerprint
    }
}

impl fmt::Debug for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An id read before the prelude was registered: one of Vigil's own, which registering it
/// sets. Ids are made only by registering, so any other is a bug.
#[cold]
fn registered_late<T>(lookup: impl Fn() -> Option<T>) -> T {
    Catalog::prelude();
    lookup().expect("stream and kind ids come from the registry")
}

/// The number every declaration's field named `name` is matched by, if any declares one.
pub fn field_id(name: &str) -> Option<usize> {
    Catalog::prelude();
    registry::field_id(name)
}

/// Serde for an id of the registry. Ids are this process's; what is written down (checkpoints,
/// plans' identities) names a declaration by its fingerprint, which for Vigil's own streams and
/// kinds is their id, as before they were declared. Text formats name it, among Vigil's own.
macro_rules! serde_by_fingerprint {
    ($id:ty, $what:literal, $by_name:ident, $by_fingerprint:path) => {
        impl serde::Serialize for $id {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str(self.name())
                } else {
                    s.serialize_u64(self.fingerprint())
                }
            }
        }

        impl<'de> serde::Deserialize<'de> for $id {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                use serde::de::Error;
                // Vigil's own are registered first, whatever is read before any rule is.
                let prelude = Catalog::prelude();
                if d.is_human_readable() {
                    let name = String::deserialize(d)?;
                    prelude.$by_name(&name).ok_or_else(|| D::Error::custom(format!("unknown {} `{name}`", $what)))
                } else {
                    let fingerprint = u64::deserialize(d)?;
                    $by_fingerprint(fingerprint).ok_or_else(|| {
                        D::Error::custom(format!("a {} ({fingerprint:016x}) that no loaded rule file declares", $what))
                    })
                }
            }
        }
    };
}

serde_by_fingerprint!(Stream, "stream", stream, registry::stream_by_fingerprint);
serde_by_fingerprint!(EntityKind, "entity kind", kind, registry::kind_by_fingerprint);

/// Whether an entity takes the subject or the object place of a pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Subject,
    Object,
}

/// One way to write a pattern: `<subject> <op> [<object>]` read from `stream`.
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    pub subject: EntityKind,
    pub name: &'static str,
    pub stream: Stream,
    /// The value of the operation field this operation selects; `None` selects all.
    pub event_type: Option<&'static str>,
    pub object: Option<EntityKind>,
    /// Whether the object may be left out (`task t submit as e` has no machine yet).
    pub object_optional: bool,
}

/// Severities an alert may carry, mildest first.
pub const SEVERITIES: &[&str] = &["info", "warning", "critical"];

/// The position that stands for `ts` in field lookups by index.
pub const TS_INDEX: usize = usize::MAX;

/// Position of `field` in `stream`'s events, [`TS_INDEX`] for `ts`.
pub fn field_position(stream: Stream, field: &str) -> usize {
    if field == "ts" {
        TS_INDEX
    } else {
        stream.field_index(field).unwrap_or(TS_INDEX - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = "entity pod (namespace, pod)\nentity node (name)\n\
        stream k8s_event { fields { namespace: string, pod: string, node?: string, reason: string }\n\
        entity pod (namespace, pod) entity node (name = node) operation reason\n\
        op pod evict node? = \"Evicted\" op pod event node? }";

    fn declare(text: &str) -> Catalog {
        let (file, syntax) = crate::parser::parse(text);
        assert!(syntax.is_empty(), "{syntax:?}");
        let (catalog, problems) = Catalog::declare(&[&file]);
        assert!(problems.is_empty(), "{problems:?}");
        catalog
    }

    #[test]
    fn vigil_s_own_streams_and_kinds_keep_their_ids_and_serialize_as_before() {
        let prelude = Catalog::prelude();
        assert_eq!(prelude.streams(), Stream::BUILT_IN);
        assert_eq!(prelude.kind("metric"), Some(EntityKind::Metric));
        // Checkpoints and state ids written when these were an enum hold their variant index.
        for (i, stream) in Stream::BUILT_IN.into_iter().enumerate() {
            assert_eq!(postcard::to_stdvec(&stream).expect("serializes"), vec![i as u8]);
        }
        assert_eq!(postcard::to_stdvec(&EntityKind::Host).expect("serializes"), vec![2]);
    }

    #[test]
    fn a_declaration_is_one_stream_wherever_it_is_declared_and_a_changed_one_another() {
        let a = declare(PODS);
        let b = declare(PODS);
        let stream = a.stream("k8s_event").expect("declared");
        assert_eq!(b.stream("k8s_event"), Some(stream));
        assert!(Catalog::prelude().stream("k8s_event").is_none(), "the prelude is not changed");
        assert_eq!(stream.required(), 0b1011);
        assert_eq!(stream.type_index(), Some(3));
        let node = a.kind("node").expect("kind");
        // An attribute read from a field of another name.
        assert_eq!(stream.attributes(node, Role::Object), &[("name", 2)]);
        assert_eq!(stream.key_positions(node, Role::Object), vec![2]);
        let changed = declare(&PODS.replace("node?: string", "node?: number"));
        let other = changed.stream("k8s_event").expect("declared");
        assert_ne!(other, stream);
        assert_ne!(other.fingerprint(), stream.fingerprint());
        // Written down by fingerprint, read back as the same declaration.
        let bytes = postcard::to_stdvec(&stream).expect("serializes");
        assert_eq!(postcard::from_bytes::<Stream>(&bytes).expect("registered"), stream);
        let unknown = postcard::to_stdvec(&(1u64 << 63 | 12345)).expect("serializes");
        let err = postcard::from_bytes::<Stream>(&unknown).expect_err("no such declaration");
        assert!(!err.to_string().is_empty());
        let ops: Vec<&str> = a.operations_of(a.kind("pod").expect("pod")).iter().map(|o| o.name).collect();
        assert_eq!(ops, ["evict", "event"]);
    }

    #[test]
    fn the_type_index_is_where_the_type_field_is() {
        for stream in Stream::BUILT_IN {
            assert_eq!(stream.type_index(), stream.field_index("type"), "{}", stream.name());
            assert_eq!(stream.required(), 0, "every field of Vigil's own streams may be left out");
        }
    }
}
