//! What kind of series a sample is of: a `counter` (a running total that only rises, but for
//! resets, and that rules judge by its `rate`) or a `gauge` (a level, judged as it is). The
//! `kind` of a `metric` event says so when the sender does:
//!
//! | sender | how it says |
//! |---|---|
//! | OTLP | the data type: a monotonic sum, and a histogram's or summary's `_count`, `_sum` and `_bucket`, are counters; a gauge, a non-monotonic sum and a summary's quantiles are gauges |
//! | remote-write | the metadata Prometheus sends (every minute, in requests of their own) for each metric family, remembered per family |
//! | remote-write, prometheus-kafka-adapter (the fallback) | the name: `_total`, `_count`, `_sum` and `_bucket` are counters, as OpenMetrics reserves them |
//!
//! Otherwise `kind` is left out: unknown. Line protocol says nothing of it, and Telegraf's
//! names follow no convention that would (`net_bytes_recv` counts, `mem_used` does not), so
//! its samples' kind is unknown; so is that of JSON lines without `kind`.

use std::collections::HashMap;
use std::sync::Mutex;

pub const COUNTER: &str = "counter";
pub const GAUGE: &str = "gauge";

/// The suffixes OpenMetrics gives only to the series of counters, histograms and summaries
/// that count.
const COUNTING_SUFFIXES: [&str; 4] = ["_total", "_count", "_sum", "_bucket"];

/// The kind a series' name alone says; `None` when it says nothing.
pub fn by_name(name: &str) -> Option<&'static str> {
    COUNTING_SUFFIXES.iter().any(|s| name.ends_with(s)).then_some(COUNTER)
}

/// A metric family's type, as remote-write metadata gives it (`prometheus.MetricMetadata`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Counter,
    Gauge,
    /// A histogram or a summary: its `_count`, `_sum` and `_bucket` series count, its
    /// quantiles are levels.
    Distribution,
    Other,
}

impl Family {
    /// From `prometheus.MetricMetadata.MetricType`.
    pub fn from_remote_write(t: i32) -> Family {
        match t {
            1 => Family::Counter,
            2 => Family::Gauge,
            3..=5 => Family::Distribution,
            _ => Family::Other,
        }
    }

    /// The kind of the series `name` of this family.
    pub fn kind_of(self, name: &str) -> Option<&'static str> {
        match self {
            Family::Counter => Some(COUNTER),
            Family::Gauge => Some(GAUGE),
            Family::Distribution => Some(by_name(name).unwrap_or(GAUGE)),
            Family::Other => None,
        }
    }
}

/// How many families [`Families`] remembers: beyond it, families new to it are not
/// remembered, and their series fall back to [`by_name`].
const MAX_FAMILIES: usize = 100_000;

/// The types of the metric families senders described, for the samples that come after.
#[derive(Debug, Default)]
pub struct Families(Mutex<HashMap<String, Family>>);

impl Families {
    pub fn learn(&self, family: &str, t: Family) {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() < MAX_FAMILIES || known.contains_key(family) {
            known.insert(family.to_string(), t);
        }
    }

    /// The kind of series `name`: by its family's type if known (the family is the name, or
    /// the name without a counting suffix), else by its name.
    pub fn kind_of(&self, name: &str) -> Option<&'static str> {
        let known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let family = std::iter::once(name)
            .chain(COUNTING_SUFFIXES.iter().filter_map(|s| name.strip_suffix(s)))
            .find_map(|f| known.get(f).copied());
        match family {
            Some(f) => f.kind_of(name),
            None => by_name(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_wins_over_the_name_and_the_name_is_the_fallback() {
        let families = Families::default();
        assert_eq!(families.kind_of("http_requests_total"), Some(COUNTER));
        assert_eq!(families.kind_of("node_load1"), None);
        families.learn("node_load1", Family::from_remote_write(2));
        families.learn("rpc_duration_seconds", Family::from_remote_write(5));
        families.learn("queue_total", Family::from_remote_write(2));
        assert_eq!(families.kind_of("node_load1"), Some(GAUGE));
        assert_eq!(families.kind_of("rpc_duration_seconds_count"), Some(COUNTER));
        assert_eq!(families.kind_of("rpc_duration_seconds"), Some(GAUGE), "a quantile");
        assert_eq!(families.kind_of("queue_total"), Some(GAUGE), "a gauge whatever its name");
    }
}
