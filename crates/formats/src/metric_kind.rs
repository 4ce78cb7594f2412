//! What kind of series a sample is of: a `counter` (a running total that only rises, but for
//! resets, and that rules judge by its `rate`) or a `gauge` (a level, judged as it is). The
//! `kind` of a `metric` event says so when the sender does:
//!
//! | sender | how it says |
//! |---|---|
//! | OTLP | the data type: a monotonic sum, and a histogram's or summary's `_count`, `_sum` and `_bucket`, are counters; a gauge, a non-monotonic sum and a summary's quantiles are gauges |
//! | remote-write | the metadata Prometheus sends (every minute, in requests of their own) for each metric family, remembered per family |
//! | Prometheus' history (warm start, backtest) | its metadata API's types (`/api/v1/metadata`), remembered as remote-write's are |
//! | remote-write, prometheus-kafka-adapter (the fallback) | the name: `_total`, `_count`, `_sum` and `_bucket` are counters, as OpenMetrics reserves them |
//!
//! Otherwise `kind` is left out: unknown. Line protocol says nothing of it, and Telegraf's
//! names follow no convention that would (`net_bytes_recv` counts, `mem_used` does not), so
//! its samples' kind is unknown; so is that of JSON lines without `kind`.
//!
//! The `unit` of a `metric` event is what the sender says the series measures, in the words
//! of Prometheus' naming conventions (`ratio`, `percent`, `bytes`, `seconds`, `celsius`...):
//! OTLP's unit (UCUM: `1` is `ratio`, `%` is `percent`, `By` is `bytes`), remote-write's
//! metadata unit, or a collector's documented unit (Telegraf's `cpu_usage_*` are percentages).
//! Left out, rules read the unit from the name's suffix ([`unit_by_name`]), and a series whose
//! unit is not known is judged by no rule that needs one: a name that merely contains `cpu` is
//! no percentage (`node_memory_Percpu_bytes`).

use std::collections::HashMap;
use std::sync::Mutex;

pub const COUNTER: &str = "counter";
pub const GAUGE: &str = "gauge";

/// The suffixes OpenMetrics gives only to the series of counters, histograms and summaries
/// that count.
const COUNTING_SUFFIXES: [&str; 4] = ["_total", "_count", "_sum", "_bucket"];

/// What a series is, as far as its sender or its name says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct About {
    pub kind: Option<&'static str>,
    pub unit: Option<String>,
}

/// A unit as a sender gives it, in Prometheus' words; `None` when empty. UCUM's codes (OTLP's
/// units) that have a Prometheus name take it; any other is kept lowercased.
pub fn unit(given: &str) -> Option<String> {
    let given = given.trim();
    let known = match given {
        "" => return None,
        "1" => "ratio",
        "%" => "percent",
        "By" => "bytes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "V" => "volts",
        "W" => "watts",
        "J" => "joules",
        other => return Some(other.to_ascii_lowercase()),
    };
    Some(known.to_string())
}

/// The unit a series' name says by Prometheus' conventions: its base unit as the last word,
/// before `_total` for a counter (`node_network_receive_bytes_total`). `None` when the name
/// says none.
pub fn unit_by_name(name: &str) -> Option<&'static str> {
    const UNITS: [&str; 10] =
        ["ratio", "percent", "bytes", "seconds", "celsius", "hertz", "volts", "watts", "joules", "meters"];
    let base = name.strip_suffix("_total").unwrap_or(name);
    UNITS
        .iter()
        .copied()
        .find(|u| base.len() > u.len() && base.ends_with(u) && base[..base.len() - u.len()].ends_with('_'))
}

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
            // A gauge histogram's buckets, count and sum are levels, not totals.
            2 | 4 => Family::Gauge,
            3 | 5 => Family::Distribution,
            _ => Family::Other,
        }
    }

    /// From a type as the exposition formats name it (`# TYPE`), and Prometheus' metadata API.
    pub fn from_type_name(t: &str) -> Family {
        match t {
            "counter" => Family::Counter,
            "gauge" | "gaugehistogram" => Family::Gauge,
            "histogram" | "summary" => Family::Distribution,
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

/// The types and units of the metric families senders described, for the samples that come
/// after.
#[derive(Debug, Default)]
pub struct Families(Mutex<HashMap<String, (Family, Option<String>)>>);

impl Families {
    /// Family `family` is of type `t`, in `unit` (empty when the sender gave none).
    pub fn learn(&self, family: &str, t: Family, unit: &str) {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() < MAX_FAMILIES || known.contains_key(family) {
            known.insert(family.to_string(), (t, self::unit(unit)));
        }
    }

    /// The kind of series `name`: by its family's type if known (the family is the name, or
    /// the name without a counting suffix), else by its name.
    pub fn kind_of(&self, name: &str) -> Option<&'static str> {
        self.about(name).kind
    }

    /// The kind and unit of series `name`, as its family was described; its kind by its name
    /// when the family was not.
    pub fn about(&self, name: &str) -> About {
        let known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let family = std::iter::once(name)
            .chain(COUNTING_SUFFIXES.iter().filter_map(|s| name.strip_suffix(s)))
            .find_map(|f| known.get(f));
        // A histogram's or summary's `_count` and `_bucket` count observations: the family's
        // unit is that of its values and their `_sum`.
        let counts = name.ends_with("_count") || name.ends_with("_bucket");
        match family {
            Some((f, unit)) => About { kind: f.kind_of(name), unit: unit.clone().filter(|_| !counts) },
            None => About { kind: by_name(name), unit: None },
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
        families.learn("node_load1", Family::from_remote_write(2), "");
        families.learn("rpc_duration_seconds", Family::from_remote_write(5), "seconds");
        families.learn("queue_total", Family::from_remote_write(2), "");
        assert_eq!(families.kind_of("node_load1"), Some(GAUGE));
        assert_eq!(families.kind_of("rpc_duration_seconds_count"), Some(COUNTER));
        assert_eq!(families.kind_of("rpc_duration_seconds"), Some(GAUGE), "a quantile");
        assert_eq!(families.kind_of("queue_total"), Some(GAUGE), "a gauge whatever its name");
        assert_eq!(families.about("rpc_duration_seconds_sum").unit.as_deref(), Some("seconds"));
        assert_eq!(families.about("rpc_duration_seconds_count").unit, None, "a count of observations");
        assert_eq!(families.about("node_load1").unit, None);
        // The metadata API's names of types say the same as remote-write's numbers.
        for (name, number) in [("counter", 1), ("gauge", 2), ("histogram", 3), ("gaugehistogram", 4), ("summary", 5)] {
            assert_eq!(Family::from_type_name(name), Family::from_remote_write(number), "{name}");
        }
        assert_eq!(Family::from_type_name("gaugehistogram").kind_of("queue_seconds_bucket"), Some(GAUGE));
        assert_eq!(Family::from_type_name("unknown"), Family::Other);
    }

    #[test]
    fn a_unit_is_a_suffix_of_the_name_not_a_word_inside_it() {
        assert_eq!(unit_by_name("node_memory_Percpu_bytes"), Some("bytes"));
        assert_eq!(unit_by_name("node_cpu_seconds_total"), Some("seconds"));
        assert_eq!(unit_by_name("node_filesystem_avail_bytes"), Some("bytes"));
        assert_eq!(unit_by_name("disk_used_percent"), Some("percent"));
        assert_eq!(unit_by_name("cache_hit_ratio"), Some("ratio"));
        assert_eq!(unit_by_name("node_load1"), None);
        assert_eq!(unit_by_name("avg_cpu"), None);
        assert_eq!(unit_by_name("bytes"), None, "a bare unit names nothing measured");
        assert_eq!(unit_by_name("node_hwmon_temp_celsius"), Some("celsius"));
        assert_eq!(unit("%").as_deref(), Some("percent"));
        assert_eq!(unit("1").as_deref(), Some("ratio"));
        assert_eq!(unit("By").as_deref(), Some("bytes"));
        assert_eq!(unit(" "), None);
    }
}
