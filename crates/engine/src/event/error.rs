//! Why an input line is not an event.

use std::fmt;

/// Why an input line is not an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The field at fault, if one is.
    pub field: Option<String>,
    pub reason: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "field `{field}`: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

pub(super) fn bad(field: impl Into<Option<String>>, reason: impl Into<String>) -> DecodeError {
    DecodeError { field: field.into(), reason: reason.into() }
}

pub(super) fn twice(field: &str) -> DecodeError {
    bad(Some(field.to_string()), "given twice; an event names each field once")
}
