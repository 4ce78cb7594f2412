//! Keys: the values that identify a group, a partial match or an alert, and a map by them.

use crate::event::{Event, Value};
use std::hash::{BuildHasher, Hash, Hasher};

/// How many key groups a rule's keys are hashed into: the unit in which state is split between
/// engines ([`Shard`](super::config::Shard)). Fixed, like a topic's partition count: the same
/// key is in the same key group in every process and every version.
pub const KEY_GROUPS: u32 = 256;

/// The key group of the key made of an event's values at `positions` (as [`FieldsKey`] reads
/// them): the same for every event with those key values, whatever its stream.
pub fn key_group(event: &Event, positions: &[usize]) -> u32 {
    key_group_of(&FieldsKey { event, positions })
}

/// The key group of anything hashed as keys are: a seed fixed for all processes, not the
/// per-process one of [`KeyMap`].
pub fn key_group_of(key: &impl Hash) -> u32 {
    const SEED: u64 = 0x7669_6769_6c5f_6b67;
    (foldhash::fast::FixedState::with_seed(SEED).hash_one(key) % u64::from(KEY_GROUPS)) as u32
}

/// The series an event is of, as the aggregates kept per series tell them apart: a hash of its
/// values at `positions` (its pattern's entity keys: a metric's host, name and labels), with a
/// seed fixed for all processes, so that a window restored from a checkpoint finds its series.
pub fn series_hash(event: &Event, positions: &[usize]) -> u64 {
    const SEED: u64 = 0x7669_6769_6c5f_7372;
    foldhash::fast::FixedState::with_seed(SEED).hash_one(FieldsKey { event, positions })
}

/// A hash map by [`Key`], the engine's per-key state. foldhash rather than SipHash: hashing
/// the key is a good part of an event's cost in window and sequence rules, and its per-process
/// random seed still keeps crafted keys from colliding on purpose.
pub type KeyMap<V> = hashbrown::HashMap<Key, V, foldhash::fast::RandomState>;

/// A group or match key: the values that identify what an alert is about.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Key(pub Vec<Value>);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| same_key_value(a, b))
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for v in &self.0 {
            hash_key_value(v, state);
        }
    }
}

/// Equality of key values: numbers by their bits, so that a NaN key finds itself; an empty
/// label set is no label set.
fn same_key_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Num(x), Value::Num(y)) => x.to_bits() == y.to_bits(),
        (Value::Map(m), Value::Null) | (Value::Null, Value::Map(m)) => m.is_empty(),
        _ => a == b,
    }
}

fn hash_key_value<H: Hasher>(v: &Value, state: &mut H) {
    match v {
        Value::Null => 0u8.hash(state),
        Value::Map(m) if m.is_empty() => 0u8.hash(state),
        Value::Map(m) => {
            for (name, value) in m.iter() {
                name.hash(state);
                value.hash(state);
            }
        }
        Value::Num(n) => n.to_bits().hash(state),
        Value::Str(s) => s.hash(state),
        Value::Bool(b) => b.hash(state),
        Value::Dur(d) | Value::Time(d) => d.hash(state),
        other => other.to_text().hash(state),
    }
}

/// The key made of an event's values at `positions` (as [`Event::value`] reads them), read in
/// place: it hashes and compares as that [`Key`] would, so a group or partition is found
/// without building its key (an allocation, and a shared count per string).
pub struct FieldsKey<'a> {
    pub event: &'a Event,
    pub positions: &'a [usize],
}

impl FieldsKey<'_> {
    fn with_value<R>(&self, position: usize, f: impl FnOnce(&Value) -> R) -> R {
        match self.event.fields.get(position) {
            Some(v) => f(v),
            None => f(&self.event.value(position)),
        }
    }
}

impl Hash for FieldsKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for &p in self.positions {
            self.with_value(p, |v| hash_key_value(v, state));
        }
    }
}

impl hashbrown::Equivalent<Key> for FieldsKey<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        key.0.len() == self.positions.len()
            && self.positions.iter().zip(&key.0).all(|(&p, k)| self.with_value(p, |v| same_key_value(v, k)))
    }
}
