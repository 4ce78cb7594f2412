//! Alerts: what a rule raises, as stored, tailed and pushed to webhooks.

use crate::event::{format_time, parse_time, Event, Millis};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::sync::Arc;

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
///
/// Everything but the transition's own fields is shared (`Arc`): the firing record an operator
/// keeps for the resolution, the alert handed out, and its copies in the store's batch, the
/// stream and the webhook point at one key, one set of values and labels, and one evidence list;
/// labels and annotations without template holes are shared by every alert of their rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// Stable across runs: a hash of the rule, the key and the start of the episode.
    pub id: String,
    pub rule: Arc<str>,
    pub severity: Arc<str>,
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
    /// What the alert is about: one alert per key while firing. Names in sorted order.
    pub key: Fields,
    /// The rule's `return` values, in the rule's order.
    pub values: Fields,
    pub labels: Arc<BTreeMap<String, String>>,
    pub annotations: Arc<BTreeMap<String, String>>,
    /// The events or window states that caused it, capped.
    pub evidence: Arc<[Evidence]>,
}

impl Alert {
    /// One of Vigil's own alerts (about itself, not raised by a rule), firing at `now`: labelled
    /// with its name and severity, and `labels` besides, and summarised by `summary`.
    pub fn own(
        rule: &str,
        severity: &str,
        key: Fields,
        values: Fields,
        labels: &[(&str, &str)],
        summary: String,
        now: Millis,
    ) -> Alert {
        let mut all = BTreeMap::from([
            ("alertname".to_string(), rule.to_string()),
            ("severity".to_string(), severity.to_string()),
        ]);
        all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Alert {
            id: alert_id(rule, &key, now),
            rule: Arc::from(rule),
            severity: Arc::from(severity),
            status: Status::Firing,
            time: now,
            starts_at: now,
            ends_at: None,
            detected_at: now,
            key,
            values,
            labels: Arc::new(all),
            annotations: Arc::new(BTreeMap::from([("summary".to_string(), summary)])),
            evidence: Arc::from(Vec::new()),
        }
    }
}

/// Named JSON values of an alert (its key, its `return` values), written as a JSON object in
/// their order. Made once per alert episode and shared by its records; the names are shared by
/// every alert of the rule. A list of pairs rather than a map: an alert has a few of them, and a
/// map costs a hash table (and, for serde_json's ordered map, a random hasher) per alert.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fields(Arc<[(Arc<str>, Json)]>);

impl Fields {
    pub fn new(items: Vec<(Arc<str>, Json)>) -> Fields {
        Fields(items.into())
    }

    pub fn get(&self, name: &str) -> Option<&Json> {
        self.0.iter().find(|(n, _)| &**n == name).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Json)> {
        self.0.iter().map(|(n, v)| (&**n, v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// As text, `name=value` by name, text values unquoted: `s.host=web-1 s.name=cpu`.
    pub fn text(&self) -> String {
        let shown: Vec<String> = self
            .iter()
            .map(|(name, v)| match v {
                Json::String(s) => format!("{name}={s}"),
                v => format!("{name}={v}"),
            })
            .collect();
        shown.join(" ")
    }
}

impl Serialize for Fields {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fields, D::Error> {
        let map = serde_json::Map::<String, Json>::deserialize(d)?;
        Ok(Fields::new(map.into_iter().map(|(k, v)| (Arc::from(k), v)).collect()))
    }
}

/// One item of an alert's evidence: an event as it came in, or a window's state. Events are
/// kept as they are and written as JSON only when the alert is: most alerts of a busy rule are
/// counted, stored in batches or dropped by a filter before anyone reads their evidence.
#[derive(Debug, Clone)]
pub enum Evidence {
    Event(Arc<Event>),
    Json(Json),
}

impl Evidence {
    pub fn to_json(&self) -> Json {
        match self {
            Evidence::Event(e) => e.to_json(),
            Evidence::Json(j) => j.clone(),
        }
    }
}

/// Equal when their JSON is: an event read back from the store is JSON.
impl PartialEq for Evidence {
    fn eq(&self, other: &Evidence) -> bool {
        match (self, other) {
            (Evidence::Event(a), Evidence::Event(b)) => a == b,
            (Evidence::Json(a), Evidence::Json(b)) => a == b,
            _ => self.to_json() == other.to_json(),
        }
    }
}

impl Serialize for Evidence {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Evidence::Event(e) => crate::event::EventJson(e).serialize(s),
            Evidence::Json(j) => j.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Evidence {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Evidence, D::Error> {
        Json::deserialize(d).map(Evidence::Json)
    }
}

/// Most evidence items an alert carries.
pub const MAX_EVIDENCE: usize = 20;

/// The stable id of an alert episode: a hash of the rule, the key as JSON, and the start.
pub fn alert_id(rule: &str, key: &Fields, starts_at: Millis) -> String {
    use std::io::Write;
    let mut text = Vec::with_capacity(128);
    text.extend_from_slice(rule.as_bytes());
    text.push(0x1f);
    // Writing text keys and JSON values to a Vec cannot fail.
    serde_json::to_writer(&mut text, key).ok();
    write!(text, "\u{1f}{starts_at}").ok();
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&text))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_ids_stay_what_stores_and_checkpoints_hold() {
        // An id the first builds wrote (`machine_cpu_spike` over the sample data), and a key
        // whose hash has leading zero digits, which must stay in the 32 digits.
        let key = Fields::new(vec![(Arc::from("m.machine_id"), Json::String("m00".into()))]);
        assert_eq!(alert_id("machine_cpu_spike", &key, 1_767_228_300_000), "5b1914928e026a9613923f37f14b8a72");
        for start in -3..200 {
            let id = alert_id("r", &key, start);
            let text = format!("r\u{1f}{}\u{1f}{start}", serde_json::to_string(&key).expect("json"));
            assert_eq!(id, format!("{:032x}", xxhash_rust::xxh3::xxh3_128(text.as_bytes())));
        }
    }
}
