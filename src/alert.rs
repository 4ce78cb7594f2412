//! Alerts: what a rule raises, as stored, tailed and pushed to webhooks.

use crate::event::{format_time, parse_time, Millis};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value as Json;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Firing,
    Resolved,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Firing => "firing",
            Status::Resolved => "resolved",
        }
    }
}

/// One alert transition. An alert fires once per key and episode, and resolves once; both
/// records carry the same `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// Stable across runs: a hash of the rule, the key and the start of the episode.
    pub id: String,
    pub rule: String,
    pub severity: String,
    pub status: Status,
    /// Event time of this transition: when it fired, or when it resolved.
    #[serde(with = "rfc3339")]
    pub time: Millis,
    /// Event time at which the condition first held (the start of `for`).
    #[serde(with = "rfc3339")]
    pub starts_at: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub ends_at: Option<Millis>,
    /// When the engine raised it: stream time in replay (deterministic), wall clock in a service.
    #[serde(with = "rfc3339")]
    pub detected_at: Millis,
    /// What the alert is about: one alert per key while firing.
    pub key: BTreeMap<String, Json>,
    /// The rule's `return` values.
    pub values: serde_json::Map<String, Json>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The events or window states that caused it, capped. Shared: the firing record an
    /// operator keeps for the resolution, and every copy of the alert, point at one list.
    pub evidence: std::sync::Arc<[Json]>,
}

/// Most evidence items an alert carries.
pub const MAX_EVIDENCE: usize = 20;

/// The stable id of an alert episode.
pub fn alert_id(rule: &str, key: &BTreeMap<String, Json>, starts_at: Millis) -> String {
    let mut text = String::with_capacity(64);
    text.push_str(rule);
    text.push('\u{1f}');
    text.push_str(&serde_json::to_string(key).unwrap_or_default());
    text.push('\u{1f}');
    text.push_str(&starts_at.to_string());
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(text.as_bytes()))
}

mod rfc3339 {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Millis, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_time(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Millis, D::Error> {
        let text = String::deserialize(d)?;
        parse_time(&text).ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not an RFC 3339 time")))
    }
}

mod rfc3339_opt {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Option<Millis>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&format_time(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Millis>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| parse_time(&t).ok_or_else(|| serde::de::Error::custom(format!("`{t}` is not an RFC 3339 time"))))
            .transpose()
    }
}
