//! Values: what events, states and expressions hold.

use super::time::{format_time, Millis};
use serde_json::Value as Json;
use smol_str::SmolStr;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

/// A value in an event, a state or an expression.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Value {
    /// A missing field, or the result of an operation that has no answer (avg of nothing).
    Null,
    Num(f64),
    /// Text: up to 23 bytes (ids, names) held in the value itself, with nothing to allocate,
    /// copy or free; longer text shared.
    Str(SmolStr),
    Bool(bool),
    /// A duration in milliseconds.
    Dur(i64),
    Time(Millis),
    /// Members of sets are kept as text; numbers in their shortest form.
    Set(Arc<BTreeSet<String>>),
    /// Values of a state field over a range of windows, newest first.
    List(Arc<Vec<f64>>),
    Map(Arc<BTreeMap<String, String>>),
}

impl Value {
    pub fn str(s: &str) -> Value {
        // Up to 23 bytes, what a `SmolStr` holds inline: ids are a few bytes, and copied byte by
        // byte they cost less than `SmolStr::new`'s call to copy and its check for text of only
        // spaces.
        if s.len() <= 23 {
            return Value::Str(SmolStr::new_inline(s));
        }
        Value::Str(SmolStr::new(s))
    }

    /// Lets a value go, without a call to its drop when it owns nothing (numbers, times, text
    /// held inline), which the compiler does not leave out by itself.
    #[inline(always)]
    pub fn discard(self) {
        match self {
            Value::Null | Value::Num(_) | Value::Bool(_) | Value::Dur(_) | Value::Time(_) => std::mem::forget(self),
            Value::Str(ref s) if !s.is_heap_allocated() => std::mem::forget(self),
            owner => drop(owner),
        }
    }

    /// Whether the value is missing: a look at its kind, where `== Value::Null` would call the
    /// comparison of any two values.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Num(n) => Some(*n),
            _ => None,
        }
    }

    /// The text a set member or a template hole shows for this value.
    pub fn to_text(&self) -> String {
        match self {
            Value::Null => "null".into(),
            Value::Num(n) => format_number(*n),
            Value::Str(s) => s.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Dur(ms) => vigil_lang::ast::format_duration(ms.unsigned_abs()),
            Value::Time(t) => format_time(*t),
            Value::Set(s) => format!("{{{}}}", s.iter().cloned().collect::<Vec<_>>().join(", ")),
            Value::List(l) => format!("[{}]", l.iter().map(|n| format_number(*n)).collect::<Vec<_>>().join(", ")),
            Value::Map(m) => {
                format!("{{{}}}", m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "))
            }
        }
    }

    pub fn to_json(&self) -> Json {
        match self {
            Value::Null => Json::Null,
            // Whole numbers print as integers (`3`, not `3.0`), as they usually arrived.
            Value::Num(n) if n.fract() == 0.0 && n.abs() < 9e15 => Json::from(*n as i64),
            Value::Num(n) => serde_json::Number::from_f64(*n).map_or(Json::Null, Json::Number),
            Value::Str(s) => Json::String(s.to_string()),
            Value::Bool(b) => Json::Bool(*b),
            Value::Dur(ms) => Json::from(*ms),
            Value::Time(t) => Json::String(format_time(*t)),
            Value::Set(s) => Json::Array(s.iter().map(|m| Json::String(m.clone())).collect()),
            Value::List(l) => Json::Array(l.iter().map(|n| Value::Num(*n).to_json()).collect()),
            Value::Map(m) => Json::Object(m.iter().map(|(k, v)| (k.clone(), Json::String(v.clone()))).collect()),
        }
    }

    /// A total order used only to break ties between events with the same timestamp, so that
    /// any arrival order of simultaneous events gives the same processing order.
    pub fn tie_order(&self, other: &Value) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        fn rank(v: &Value) -> u8 {
            match v {
                Value::Null => 0,
                Value::Num(_) => 1,
                Value::Str(_) => 2,
                Value::Bool(_) => 3,
                Value::Dur(_) => 4,
                Value::Time(_) => 5,
                Value::Set(_) => 6,
                Value::List(_) => 7,
                Value::Map(_) => 8,
            }
        }
        match (self, other) {
            (Value::Num(a), Value::Num(b)) => a.total_cmp(b),
            (Value::Str(a), Value::Str(b)) => a.cmp(b),
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (Value::Map(a), Value::Map(b)) => a.cmp(b),
            (a, b) if rank(a) != rank(b) => rank(a).cmp(&rank(b)),
            _ => Ordering::Equal,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// Numbers print without a trailing `.0` when whole, as JSON would.
pub fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}
