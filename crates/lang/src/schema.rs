//! The catalogue of built-in streams, entity kinds and operations the rule language knows.
//!
//! Field names here are the JSON field names of events (see `docs/language.md#streams`); the
//! checker resolves every `e.field` and `t.field` against this table.

use std::fmt;

/// The type of a value in the rule language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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

/// Declares the built-in streams, each once: its name and its fields in the order events keep
/// them. Everything else about streams (the list of them, the field names of all of them, where
/// each stream keeps each field, where its `type` is) is derived from this table; a new stream is
/// a new line here.
macro_rules! streams {
    ($( $(#[doc = $doc:literal])* $variant:ident $name:literal { $( $field:literal : $ty:ident ),* $(,)? } )*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        pub enum Stream {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Stream {
            pub const ALL: [Stream; [$($name),*].len()] = [$(Stream::$variant),*];
            pub const COUNT: usize = Stream::ALL.len();

            pub const fn name(self) -> &'static str {
                match self {
                    $( Stream::$variant => $name, )*
                }
            }

            /// The fields an event of this stream carries, besides `ts`.
            pub const fn fields(self) -> &'static [(&'static str, Type)] {
                match self {
                    $( Stream::$variant => &[$( ($field, Type::$ty) ),*], )*
                }
            }
        }
    };
}

streams! {
    /// A task lifecycle step: SUBMIT, SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST, UPDATE_*.
    TaskEvent "task_event" {
        "job_id": Str, "task_index": Number, "machine_id": Str, "type": Str, "user": Str,
        "priority": Number, "sched_class": Number, "cpu_request": Number, "mem_request": Number,
    }
    /// A task's resource use over a measurement interval.
    TaskUsage "task_usage" {
        "job_id": Str, "task_index": Number, "machine_id": Str, "cpu": Number, "mem": Number,
        "max_cpu": Number, "max_mem": Number, "disk_io": Number, "cpi": Number, "cluster": Str,
    }
    /// A machine lifecycle step (ADD, REMOVE, UPDATE) or incident (SOFTERROR, HARDERROR).
    MachineEvent "machine_event" { "machine_id": Str, "type": Str, "cpus": Number, "memory": Number, "detail": Str }
    /// One sample of a named metric series. `kind` is what the sender says the series is:
    /// `counter` (only ever rises, but for resets), `gauge`, or absent when it does not say.
    Metric "metric" { "host": Str, "name": Str, "value": Number, "labels": Map, "kind": Str }
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// How many distinct field names the streams have, all together.
pub const FIELD_COUNT: usize = {
    let mut n = 0;
    let mut s = 0;
    while s < Stream::COUNT {
        let fields = Stream::ALL[s].fields();
        let mut f = 0;
        while f < fields.len() {
            if first_of(s, f) {
                n += 1;
            }
            f += 1;
        }
        s += 1;
    }
    n
};

/// Whether field `f` of stream `s` is the first stream field of its name.
const fn first_of(s: usize, f: usize) -> bool {
    let name = Stream::ALL[s].fields()[f].0;
    let mut t = 0;
    while t <= s {
        let fields = Stream::ALL[t].fields();
        let mut g = 0;
        while g < fields.len() && (t < s || g < f) {
            if same(fields[g].0, name) {
                return false;
            }
            g += 1;
        }
        t += 1;
    }
    true
}

/// Every field name of every stream, numbered in order of first appearance: the decoder matches
/// keys against these, once, without allocating.
pub const FIELD_NAMES: [&str; FIELD_COUNT] = {
    let mut out = [""; FIELD_COUNT];
    let mut n = 0;
    let mut s = 0;
    while s < Stream::COUNT {
        let fields = Stream::ALL[s].fields();
        let mut f = 0;
        while f < fields.len() {
            if first_of(s, f) {
                out[n] = fields[f].0;
                n += 1;
            }
            f += 1;
        }
        s += 1;
    }
    out
};

/// Most fields one stream has.
pub const MAX_FIELDS: usize = {
    let mut most = 0;
    let mut s = 0;
    while s < Stream::COUNT {
        if Stream::ALL[s].fields().len() > most {
            most = Stream::ALL[s].fields().len();
        }
        s += 1;
    }
    most
};

/// Position of a name in `fields`, in a constant.
const fn position_of(fields: &[(&str, Type)], name: &str) -> Option<usize> {
    let mut i = 0;
    while i < fields.len() {
        if same(fields[i].0, name) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// By stream: the position of its `type` field, if it has one.
const TYPE_INDEX: [Option<usize>; Stream::COUNT] = {
    let mut out = [None; Stream::COUNT];
    let mut s = 0;
    while s < Stream::COUNT {
        out[s] = position_of(Stream::ALL[s].fields(), "type");
        s += 1;
    }
    out
};

/// By stream and global field number ([`FIELD_NAMES`]): where the stream keeps that field.
const POSITIONS: [[Option<u8>; FIELD_COUNT]; Stream::COUNT] = {
    let mut out = [[None; FIELD_COUNT]; Stream::COUNT];
    let mut s = 0;
    while s < Stream::COUNT {
        let mut g = 0;
        while g < FIELD_COUNT {
            out[s][g] = match position_of(Stream::ALL[s].fields(), FIELD_NAMES[g]) {
                Some(p) => Some(p as u8),
                None => None,
            };
            g += 1;
        }
        s += 1;
    }
    out
};

impl Stream {
    pub fn from_name(name: &str) -> Option<Stream> {
        Stream::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Where this stream keeps global field `g` ([`FIELD_NAMES`]), if it has it.
    pub fn position_of_global(self, g: usize) -> Option<usize> {
        POSITIONS[self as usize].get(g).copied().flatten().map(usize::from)
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

    /// Position of the `type` field, which routes every event to the rules of its type: known
    /// without a search of the names.
    pub fn type_index(self) -> Option<usize> {
        TYPE_INDEX[self as usize]
    }

    pub fn field_names(self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.fields().iter().map(|(n, _)| *n).collect();
        names.push("ts");
        names
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum EntityKind {
    Task,
    Machine,
    Host,
    Metric,
}

impl EntityKind {
    pub const ALL: [EntityKind; 4] = [EntityKind::Task, EntityKind::Machine, EntityKind::Host, EntityKind::Metric];

    pub fn name(self) -> &'static str {
        match self {
            EntityKind::Task => "task",
            EntityKind::Machine => "machine",
            EntityKind::Host => "host",
            EntityKind::Metric => "metric",
        }
    }

    pub fn from_name(name: &str) -> Option<EntityKind> {
        EntityKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The fields that identify one entity: two variables of this kind are the same entity when
    /// these are equal, and grouping by the entity groups by these. A metric series is its host,
    /// its name and its whole label set (`cpu_busy{cpu="0"}` and `{cpu="1"}` are two series);
    /// a series without labels has none (`labels` absent, or empty).
    pub fn key_fields(self) -> &'static [&'static str] {
        match self {
            EntityKind::Task => &["job_id", "task_index"],
            EntityKind::Machine => &["machine_id"],
            EntityKind::Host => &["host"],
            EntityKind::Metric => &["host", "name", "labels"],
        }
    }

    /// The version of [`key_fields`](Self::key_fields): raised whenever a kind's key changes,
    /// so that state a checkpoint kept under the old keys is not restored under the new ones
    /// (it is part of a rule's state identity, [`crate::plan::RulePlan::state_id`]). Version 1
    /// of `metric` added `labels`.
    pub fn key_version(self) -> u32 {
        match self {
            EntityKind::Metric => 1,
            EntityKind::Task | EntityKind::Machine | EntityKind::Host => 0,
        }
    }
}

/// Whether an entity takes the subject or the object place of a pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Subject,
    Object,
}

/// One way to write a pattern: `<subject> <op> [<object>]` read from `stream`.
pub struct Operation {
    pub subject: EntityKind,
    pub name: &'static str,
    pub stream: Stream,
    /// The value of the event's `type` field this operation selects; `None` selects all.
    pub event_type: Option<&'static str>,
    pub object: Option<EntityKind>,
    /// Whether the object may be left out (`task t submit as e` has no machine yet).
    pub object_optional: bool,
}

const fn op(
    subject: EntityKind,
    name: &'static str,
    stream: Stream,
    event_type: Option<&'static str>,
    object: Option<EntityKind>,
    object_optional: bool,
) -> Operation {
    Operation { subject, name, stream, event_type, object, object_optional }
}

use EntityKind as K;
use Stream as S;

pub const OPERATIONS: &[Operation] = &[
    op(K::Task, "submit", S::TaskEvent, Some("SUBMIT"), Some(K::Machine), true),
    op(K::Task, "schedule", S::TaskEvent, Some("SCHEDULE"), Some(K::Machine), true),
    op(K::Task, "evict", S::TaskEvent, Some("EVICT"), Some(K::Machine), true),
    op(K::Task, "fail", S::TaskEvent, Some("FAIL"), Some(K::Machine), true),
    op(K::Task, "finish", S::TaskEvent, Some("FINISH"), Some(K::Machine), true),
    op(K::Task, "kill", S::TaskEvent, Some("KILL"), Some(K::Machine), true),
    op(K::Task, "lost", S::TaskEvent, Some("LOST"), Some(K::Machine), true),
    op(K::Task, "update_pending", S::TaskEvent, Some("UPDATE_PENDING"), Some(K::Machine), true),
    op(K::Task, "update_running", S::TaskEvent, Some("UPDATE_RUNNING"), Some(K::Machine), true),
    op(K::Task, "event", S::TaskEvent, None, Some(K::Machine), true),
    op(K::Task, "use", S::TaskUsage, None, Some(K::Machine), true),
    op(K::Machine, "add", S::MachineEvent, Some("ADD"), None, true),
    op(K::Machine, "remove", S::MachineEvent, Some("REMOVE"), None, true),
    op(K::Machine, "update", S::MachineEvent, Some("UPDATE"), None, true),
    op(K::Machine, "softerror", S::MachineEvent, Some("SOFTERROR"), None, true),
    op(K::Machine, "harderror", S::MachineEvent, Some("HARDERROR"), None, true),
    op(K::Machine, "event", S::MachineEvent, None, None, true),
    op(K::Host, "report", S::Metric, None, Some(K::Metric), true),
    op(K::Metric, "sample", S::Metric, None, None, true),
];

/// The operations a subject kind can perform, by name.
pub fn operations_of(kind: EntityKind) -> impl Iterator<Item = &'static Operation> {
    OPERATIONS.iter().filter(move |o| o.subject == kind)
}

/// The fields of an entity in a given place of a stream's events. The task in a `task_event` is
/// described by the user and its requests; the machine a task runs on is known only by its id.
pub fn entity_fields(kind: EntityKind, stream: Stream, role: Role) -> &'static [&'static str] {
    match (kind, stream, role) {
        (K::Task, S::TaskEvent, Role::Subject) => {
            &["job_id", "task_index", "user", "priority", "sched_class", "cpu_request", "mem_request"]
        }
        (K::Task, _, _) => &["job_id", "task_index"],
        (K::Machine, S::MachineEvent, Role::Subject) => &["machine_id", "cpus", "memory"],
        (K::Machine, _, _) => &["machine_id"],
        (K::Host, _, _) => &["host"],
        (K::Metric, _, _) => &["host", "name", "labels"],
    }
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

    #[test]
    fn the_type_index_is_where_the_type_field_is() {
        for stream in Stream::ALL {
            assert_eq!(stream.type_index(), stream.field_index("type"), "{}", stream.name());
        }
    }
}
