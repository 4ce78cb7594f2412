//! `vigil serve` configuration: flags, each with an environment variable, over an optional
//! `vigil.toml`, over defaults.
//!
//! Every plain setting is declared once, in [`settings!`]: its name, type, default, parser and
//! help. From that one line come the flag and its variable, the `vigil.toml` key, the default
//! (parsed by the same parser as the flag, so the help and the code cannot disagree) and the
//! field of [`ServeConfig`]. Settings that are tables or lists (topics, Kafka properties, replay
//! files) are written out below it.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use vigil_engine::settings::{parse_duration, parse_positive, EngineArgs, EngineSettings};
use vigil_formats::{Carrier, Format};
use vigil_lang::schema::{Catalog, Stream};

mod file;
mod history;

pub use vigil_engine::settings::millis;

/// A setting's value as `vigil.toml` may write it: text, a number or a bool. It goes through
/// the setting's own parser, as a flag's text does.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum FileValue {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl FileValue {
    fn text(&self) -> String {
        match self {
            FileValue::Text(s) => s.clone(),
            FileValue::Int(i) => i.to_string(),
            FileValue::Bool(b) => b.to_string(),
        }
    }
}

/// The value of one setting: the flag (or its variable), else the file's, else the default.
/// A bad value in the file is reported even when the flag overrides it.
fn pick<T>(
    flag: Option<T>,
    file: Option<&FileValue>,
    default: Option<&str>,
    parse: fn(&str) -> Result<T, String>,
    name: &'static str,
    problems: &mut Vec<String>,
) -> Option<T> {
    let from_file = file.and_then(|v| {
        parse(&v.text()).map_err(|e| problems.push(format!("vigil.toml {}: {e}", file::place(name)))).ok()
    });
    flag.or(from_file).or_else(|| default.map(|d| parse(d).expect("every default parses (a unit test checks)")))
}

macro_rules! resolved {
    ([] $ty:ty) => { Option<$ty> };
    ([$default:literal] $ty:ty) => { $ty };
}

macro_rules! default_of {
    () => {
        None
    };
    ($default:literal) => {
        Some($default)
    };
}

macro_rules! unwrap_default {
    ([] $value:expr) => {
        $value
    };
    ([$default:literal] $value:expr) => {
        $value.expect("a setting with a default has a value")
    };
}

macro_rules! help_of {
    ($help:literal []) => {
        $help
    };
    ($help:literal [$default:literal]) => {
        concat!($help, " [default: ", $default, "]")
    };
}

/// Declares the plain settings: `name: Type [default] = parser, env "VAR", in SECTION, "help";`
/// (`[]`: no default, the setting is optional; SECTION: its section of `vigil.toml`).
macro_rules! settings {
    ($( $name:ident : $ty:ty [$($default:literal)?] = $parse:path, env $env:literal, in $section:ident, $help:literal; )*) => {
        /// The section of `vigil.toml` each plain setting is written in.
        const PLAIN_SECTIONS: &[(&str, &str)] = &[$((stringify!($name), stringify!($section)),)*];

        /// Flags of `vigil serve`. Each is optional here so that a value from `vigil.toml`
        /// applies when the flag and its variable are absent.
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct ServeArgs {
            $(
                #[arg(long, env = $env, value_parser = $parse, help = help_of!($help [$($default)?]),
                      hide_env_values = $env.ends_with("TOKEN") || $env.ends_with("PASSWORD"))]
                pub $name: Option<$ty>,
            )*
            /// Create missing stream topics at start (for brokers that do not create them)
            #[arg(long, env = "VIGIL_KAFKA_CREATE_TOPICS")]
            pub kafka_create_topics: bool,
            /// Join the consumer group named by --kafka-group and share its partitions, and the
            /// rules' key groups, with the other instances in it (needs PostgreSQL)
            #[arg(long, env = "VIGIL_KAFKA_JOIN_GROUP")]
            pub kafka_join_group: bool,
            /// Topic of a stream, STREAM=TOPIC, repeatable [default: the topic is named as the stream]
            #[arg(long = "topic", value_parser = parse_topic)]
            pub topics: Vec<(String, String)>,
            /// The format of a topic's messages, TOPIC=FORMAT, repeatable: `jsonl` (Vigil's JSON
            /// lines, the default; `vigil` too), `influx` or `telegraf-json` (as Telegraf's Kafka
            /// output writes them), `otlp-proto` or `otlp-json` (as the OpenTelemetry Collector's
            /// Kafka exporter writes them), `prometheus-kafka-adapter`; all but `jsonl` on the metric
            /// stream's topic
            #[arg(long = "kafka-topic-format", value_parser = parse_topic_format)]
            pub kafka_topic_formats: Vec<(String, Format)>,
            /// A librdkafka property for Vigil's Kafka clients, KEY=VALUE, repeatable (security
            /// settings, `fetch.wait.max.ms`, ...); over the same key in `vigil.toml`
            #[arg(long = "kafka-option", value_parser = parse_kafka_option)]
            pub kafka_options: Vec<(String, String)>,
            /// A recorded file fed into the running service, repeatable
            #[arg(long = "replay")]
            pub replay: Vec<PathBuf>,
            /// An Alertmanager that gets every alert (`POST /api/v2/alerts`), repeatable: each
            /// of an HA pair or cluster is given every one, as Prometheus does
            #[arg(long = "alertmanager-url", env = "VIGIL_ALERTMANAGER_URL", value_delimiter = ',', value_parser = parse_http_url)]
            pub alertmanager_url: Vec<String>,
            /// A label every alert sent to Alertmanager carries unless it has it, NAME=VALUE,
            /// repeatable: which Vigil sent it
            #[arg(long = "alertmanager-external-label", value_parser = crate::alertmanager::parse_external_label)]
            pub alertmanager_external_labels: Vec<(String, String)>,
            /// A `vigil.toml` with any of these settings [default: vigil.toml if it exists]
            #[arg(long, env = "VIGIL_CONFIG")]
            pub config: Option<PathBuf>,
            /// Lateness, time bounds, workers and key limits, as `replay` takes them.
            #[command(flatten)]
            pub engine: EngineArgs,
        }

        /// `vigil.toml`'s settings under the flags' names with `_`, as [`file::flatten`] gathers
        /// them from its sections.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct FileConfig {
            $(
                #[doc = $help]
                pub $name: Option<FileValue>,
            )*
            /// Create missing stream topics at start.
            #[serde(default)]
            pub kafka_create_topics: bool,
            /// Share the consumer group's partitions with the other instances in it.
            #[serde(default)]
            pub kafka_join_group: bool,
            /// Topic per stream: `[topics] task_event = "cluster.task-events"`.
            #[serde(default)]
            pub topics: BTreeMap<String, String>,
            /// librdkafka properties: `[kafka_options] "security.protocol" = "ssl"`.
            #[serde(default)]
            pub kafka_options: BTreeMap<String, String>,
            /// The format of a topic's messages: `[kafka_topic_format] telegraf = "influx"`.
            #[serde(default)]
            pub kafka_topic_format: BTreeMap<String, String>,
            /// Recorded files to feed in.
            #[serde(default)]
            pub replay: Vec<PathBuf>,
            /// Alertmanagers that get every alert.
            #[serde(default)]
            pub alertmanager_url: Vec<String>,
            /// Labels of every alert sent to Alertmanager: `[alertmanager_external_labels] site = "eu1"`.
            #[serde(default)]
            pub alertmanager_external_labels: BTreeMap<String, String>,
            /// The engine's settings ([`EngineArgs::NAMES`]).
            #[serde(default)]
            pub engine: BTreeMap<String, FileValue>,
        }

        /// The settings in force.
        #[derive(Debug, Clone)]
        pub struct ServeConfig {
            $(
                #[doc = $help]
                pub $name: resolved!([$($default)?] $ty),
            )*
            pub kafka_create_topics: bool,
            /// Whether the instance shares the consumer group's partitions with others.
            pub kafka_join_group: bool,
            /// librdkafka properties set on every Kafka client, over Vigil's defaults.
            pub kafka_options: BTreeMap<String, String>,
            pub topics: BTreeMap<Stream, String>,
            /// Topics set for streams the rules declare, by stream name: resolved with the
            /// rules' catalogue when the service starts ([`ServeConfig::add_declared_topics`]).
            pub declared_topics: BTreeMap<String, String>,
            /// Topics whose messages are not Vigil's JSON lines.
            pub topic_formats: BTreeMap<String, Format>,
            pub replay: Vec<PathBuf>,
            pub alertmanager_url: Vec<String>,
            pub alertmanager_external_labels: BTreeMap<String, String>,
            /// Lateness, time bounds, workers and key limits.
            pub engine: EngineSettings,
            /// The file's settings written the deprecated way, each with where it goes now.
            pub warnings: Vec<String>,
        }

        impl ServeConfig {
            /// The plain settings, flags over the file over the defaults.
            fn plain(args: &ServeArgs, file: &FileConfig, problems: &mut Vec<String>) -> ServeConfig {
                ServeConfig {
                    $(
                        $name: unwrap_default!([$($default)?] pick(
                            args.$name.clone(),
                            file.$name.as_ref(),
                            default_of!($($default)?),
                            $parse,
                            stringify!($name),
                            problems,
                        )),
                    )*
                    kafka_create_topics: args.kafka_create_topics || file.kafka_create_topics,
                    kafka_join_group: args.kafka_join_group || file.kafka_join_group,
                    kafka_options: BTreeMap::new(),
                    topics: BTreeMap::new(),
                    declared_topics: BTreeMap::new(),
                    topic_formats: BTreeMap::new(),
                    replay: Vec::new(),
                    alertmanager_url: Vec::new(),
                    alertmanager_external_labels: BTreeMap::new(),
                    engine: EngineSettings::serve(),
                    warnings: Vec::new(),
                }
            }

            /// Every default, parsed: for the test that they all parse.
            #[cfg(test)]
            fn defaults() -> Vec<(&'static str, Result<(), String>)> {
                let mut out: Vec<(&'static str, Result<(), String>)> = Vec::new();
                $(
                    if let Some(d) = default_of!($($default)?) {
                        let d: &str = d;
                        out.push((stringify!($name), $parse(d).map(|_| ())));
                    }
                )*
                out
            }
        }
    };
}

settings! {
    rules: PathBuf ["rules"] = parse_path, env "VIGIL_RULES", in engine,
        "Folder of `*.saql` rules, reloaded when it changes or on SIGHUP";
    http_addr: SocketAddr ["127.0.0.1:8080"] = parse_addr, env "VIGIL_HTTP_ADDR", in http,
        "Address of the HTTP API";
    tls_cert_file: PathBuf [] = parse_path, env "VIGIL_TLS_CERT_FILE", in http,
        "Serve HTTPS: the PEM certificate chain (read again when it changes); needs --tls-key-file";
    tls_key_file: PathBuf [] = parse_path, env "VIGIL_TLS_KEY_FILE", in http,
        "The PEM private key of --tls-cert-file (read again when it changes)";
    database_url: String ["sqlite://vigil.db"] = parse_database_url, env "VIGIL_DATABASE_URL", in store,
        "postgres://... or sqlite://...";
    kafka_brokers: String [] = parse_nonempty, env "VIGIL_KAFKA_BROKERS", in kafka,
        "Kafka bootstrap servers; no Kafka when unset";
    kafka_group: String ["vigil"] = parse_nonempty, env "VIGIL_KAFKA_GROUP", in kafka,
        "Kafka consumer group";
    kafka_keyed_partitions: u32 ["12"] = parse_positive::<u32>, env "VIGIL_KAFKA_KEYED_PARTITIONS", in kafka,
        "Partitions of the topic that carries events by key between instances that share a group (--kafka-join-group); set when the topic is created";
    kafka_max_held_alerts: usize ["10000"] = parse_positive::<usize>, env "VIGIL_KAFKA_MAX_HELD_ALERTS", in kafka,
        "Most alerts a group member (--kafka-join-group) holds for one keyed partition while its writer takes none (the store down and the spool full); once it holds that many, the partition's input pauses in Kafka until they are handed on";
    kafka_instance_id: String [] = parse_nonempty, env "VIGIL_KAFKA_INSTANCE_ID", in kafka,
        "This instance's static membership in its group (--kafka-join-group; Kafka's group.instance.id): restarted within the session timeout, it gets its partitions back without a rebalance. Unique per instance and kept across restarts (a pod's name)";
    webhook_url: String [] = parse_http_url, env "VIGIL_WEBHOOK_URL", in webhook,
        "Where alerts are POSTed, in Alertmanager's webhook format";
    api_token: String [] = parse_nonempty, env "VIGIL_API_TOKEN", in http,
        "Bearer token required by mutating endpoints";
    api_read_token: String [] = parse_nonempty, env "VIGIL_API_READ_TOKEN", in http,
        "Bearer token required by reading endpoints (the API token works too); needs --api-token";
    influx_host_tag: String ["host"] = parse_nonempty, env "VIGIL_INFLUX_HOST_TAG", in sources,
        "The tag of InfluxDB line protocol and Telegraf's JSON (POST /api/v2/write, /write, Kafka topics, --replay files) that names a sample's host; the other tags become labels";
    remote_write_host_label: String ["instance"] = parse_nonempty, env "VIGIL_REMOTE_WRITE_HOST_LABEL", in sources,
        "The label of Prometheus remote-write (POST /api/v1/write) and prometheus-kafka-adapter (Kafka topics, --replay files) that names a sample's host, its `:port` dropped; the other labels stay labels";
    remote_write_fallback_label: String ["job"] = parse_any, env "VIGIL_REMOTE_WRITE_FALLBACK_LABEL", in sources,
        "For a remote-write series without the host label (a recording rule's aggregate): the label whose value places it, as the host `LABEL=VALUE` (`job=node`); without that label too, or when this is empty, the host `fleet`. Such a series is kept, never refused: Prometheus drops a whole batch on a refusal";
    remote_write_replica_labels: String ["__replica__,prometheus_replica"] = parse_any, env "VIGIL_REMOTE_WRITE_REPLICA_LABELS", in sources,
        "The labels that tell the replicas of an HA pair of Prometheus apart, comma-separated (add `replica` if yours is named so): one replica per cluster is taken, the others' samples dropped, and the label taken off; empty turns this off";
    remote_write_cluster_label: String ["cluster"] = parse_nonempty, env "VIGIL_REMOTE_WRITE_CLUSTER_LABEL", in sources,
        "The label that names an HA pair's cluster: each cluster has its own elected replica";
    remote_write_ha_failover: Duration ["30s"] = parse_positive_duration, env "VIGIL_REMOTE_WRITE_HA_FAILOVER", in sources,
        "How long the elected replica of an HA pair may send nothing before the next replica heard is taken";
    otlp_host_attribute: String ["host.name"] = parse_nonempty, env "VIGIL_OTLP_HOST_ATTRIBUTE", in sources,
        "The attribute of OTLP metrics (POST /v1/metrics, Kafka topics, --replay files) that names a sample's host, taken from the resource, else from the data point; the point's other attributes become labels";
    max_labels_per_series: usize ["64"] = parse_positive::<usize>, env "VIGIL_MAX_LABELS_PER_SERIES", in sources,
        "Labels a sample may carry; past it the sample is refused with the reason (counted, a dead letter)";
    max_label_name_length: usize ["1024"] = parse_positive::<usize>, env "VIGIL_MAX_LABEL_NAME_LENGTH", in sources,
        "Bytes of a label's name; past it the sample is refused with the reason";
    max_label_value_length: usize ["2048"] = parse_positive::<usize>, env "VIGIL_MAX_LABEL_VALUE_LENGTH", in sources,
        "Bytes of a label's value; past it the sample is refused with the reason";
    max_samples_per_request: usize ["1000000"] = parse_positive::<usize>, env "VIGIL_MAX_SAMPLES_PER_REQUEST", in sources,
        "Samples one request to a collector receiver (remote-write, OTLP, line protocol) may carry; a larger one is refused whole (413)";
    input_stopped_after: Duration ["5min"] = parse_duration, env "VIGIL_INPUT_STOPPED_AFTER", in sources,
        "Quiet input after which the self-alert `vigil_input_stopped` fires (and at least three of the input's longest recent gaps)";
    source_idle_after: Duration ["10s"] = parse_duration, env "VIGIL_SOURCE_IDLE_AFTER", in sources,
        "How long a source (a Kafka partition, or a pushed series) may send nothing before it stops holding event time back for the others (`0s`: time follows the newest event alone)";
    external_url: String [] = parse_http_url, env "VIGIL_EXTERNAL_URL", in http,
        "The URL users reach the API at, for links in webhook calls [default: http://HTTP_ADDR]";
    warm_from_prometheus: String [] = parse_http_url, env "VIGIL_WARM_FROM_PROMETHEUS", in warm,
        "Before the first live sample, feed the rules each series' recent history from this Prometheus (its base URL; the query API's range queries), so that new series are judged from the first minute. Not when a checkpoint restores the rules' state";
    warm_lookback: Duration ["1d"] = parse_positive_duration, env "VIGIL_WARM_LOOKBACK", in warm,
        "How much history a warm start reads, back from the start";
    warm_match: String ["{__name__=~\".+\"}"] = parse_selector, env "VIGIL_WARM_MATCH", in warm,
        "The series a warm start reads: a PromQL series selector";
    warm_step: Duration ["150s"] = parse_positive_duration, env "VIGIL_WARM_STEP", in warm,
        "The step of the history a warm start reads before its raw part (two values in each five-minute window by default, so that a counter's rate has two)";
    warm_raw: Duration ["1h"] = parse_duration, env "VIGIL_WARM_RAW", in warm,
        "The most recent history a warm start reads raw (remote-read, every sample), so that the windows live samples continue are judged at their resolution";
    prometheus_user: String [] = parse_nonempty, env "VIGIL_PROMETHEUS_USER", in warm,
        "Basic auth at --warm-from-prometheus: the user (the password in VIGIL_PROMETHEUS_PASSWORD)";
    prometheus_password: String [] = parse_nonempty, env "VIGIL_PROMETHEUS_PASSWORD", in warm,
        "Basic auth at --warm-from-prometheus: the password";
    prometheus_bearer_token: String [] = parse_nonempty, env "VIGIL_PROMETHEUS_BEARER_TOKEN", in warm,
        "A bearer token for --warm-from-prometheus";
    checkpoint_interval: Duration ["60s"] = parse_positive_duration, env "VIGIL_CHECKPOINT_INTERVAL", in store,
        "How often, at least, the engine's whole state is checkpointed to the store (longer when a checkpoint costs more than a tenth of it); after a crash the input since the last one is read again";
    checkpoint_layout: CheckpointLayout ["record"] = parse_checkpoint_layout, env "VIGIL_CHECKPOINT_LAYOUT", in store,
        "`record`: the checkpoint as this build writes it; `previous`: as the build before the keyed-partition runtime reads it (one snapshot, or one per worker, fleet-wide rules whole), so that a rollback to it keeps the rules' state. Upgrade with `previous`, drop it once no rollback is wanted";
    spool_dir: PathBuf ["vigil-spool"] = parse_path, env "VIGIL_SPOOL_DIR", in store,
        "Folder of the on-disk alert buffer used while the store is down";
    spool_max_mb: u64 ["256"] = parse_positive::<u64>, env "VIGIL_SPOOL_MAX_MB", in store,
        "Most the spool may hold, in MiB; when full the engine waits";
    ingest_log_dir: PathBuf ["vigil-ingest"] = parse_path, env "VIGIL_INGEST_LOG_DIR", in sources,
        "Folder of the log HTTP ingest writes events to before it answers; replayed after a crash";
    ingest_fsync: bool ["true"] = parse_bool, env "VIGIL_INGEST_FSYNC", in sources,
        "Whether the ingest log is flushed to disk before ingest answers (`false` loses acknowledged events on a power cut)";
    webhook_timeout: Duration ["10s"] = parse_positive_duration, env "VIGIL_WEBHOOK_TIMEOUT", in webhook,
        "How long one webhook call may take, e.g. `5s`";
    alertmanager_resend_delay: Duration ["1min"] = parse_positive_duration, env "VIGIL_ALERTMANAGER_RESEND_DELAY", in alertmanager,
        "How often firing alerts are sent to Alertmanager again; each is sent ending four of these ahead, so that Alertmanager resolves it if Vigil goes away";
    alertmanager_timeout: Duration ["10s"] = parse_positive_duration, env "VIGIL_ALERTMANAGER_TIMEOUT", in alertmanager,
        "How long one request to Alertmanager may take";
    webhook_max_attempts: u32 ["12"] = parse_positive::<u32>, env "VIGIL_WEBHOOK_MAX_ATTEMPTS", in webhook,
        "Attempts before a webhook delivery is dead";
    webhook_backoff: Duration ["1s"] = parse_duration, env "VIGIL_WEBHOOK_BACKOFF", in webhook,
        "Wait before the first webhook retry, doubled after each failure up to 5 min";
    max_state_mb: u64 ["1024"] = parse_positive::<u64>, env "VIGIL_MAX_STATE_MB", in engine,
        "Most memory the engine's state may take, in MiB (estimated); past it keys are evicted as past the key cap";
    overload: Overload ["backpressure"] = parse_overload, env "VIGIL_OVERLOAD", in engine,
        "When the engine cannot keep up: `backpressure` (sources wait) or `shed` (events are dropped and counted)";
    http_header_timeout: Duration ["10s"] = parse_positive_duration, env "VIGIL_HTTP_HEADER_TIMEOUT", in http,
        "A connection that sends no complete request head for this long (new, or idle between requests) is closed";
    http_body_timeout: Duration ["30s"] = parse_positive_duration, env "VIGIL_HTTP_BODY_TIMEOUT", in http,
        "Longest time a request body may take to arrive; slower ones get 408";
    max_connections: usize ["4096"] = parse_positive::<usize>, env "VIGIL_MAX_CONNECTIONS", in http,
        "Most HTTP connections open at once; more are answered 503 and closed";
    max_stream_clients: usize ["256"] = parse_positive::<usize>, env "VIGIL_MAX_STREAM_CLIENTS", in http,
        "Most alert stream (SSE) clients at once; more are answered 503";
    max_dead_letters: u64 ["100000"] = parse_positive::<u64>, env "VIGIL_MAX_DEAD_LETTERS", in store,
        "Most dead letters kept; the oldest go first";
    stall_timeout: Duration ["10s"] = parse_positive_duration, env "VIGIL_STALL_TIMEOUT", in engine,
        "An engine busy this long with one input is stalled: /readyz answers 503 and says why";
}

/// What the sources do when the engine's input queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overload {
    /// Sources wait: Kafka is read later, HTTP ingest answers later. Nothing is lost.
    #[default]
    Backpressure,
    /// Events that do not fit are dropped and counted (`vigil_events_shed_total`).
    Shed,
}

/// How the engine's state is laid out in a checkpoint ([`vigil_engine::runtime::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointLayout {
    /// The versioned record of every keyed partition.
    #[default]
    Record,
    /// What the build before the record reads: one engine's snapshot, or `VGW1` and one
    /// snapshot per worker.
    Previous,
}

fn parse_checkpoint_layout(s: &str) -> Result<CheckpointLayout, String> {
    match s.trim() {
        "record" => Ok(CheckpointLayout::Record),
        "previous" => Ok(CheckpointLayout::Previous),
        other => Err(format!("`{other}`: use `record` or `previous`")),
    }
}

fn parse_overload(s: &str) -> Result<Overload, String> {
    match s.trim() {
        "backpressure" => Ok(Overload::Backpressure),
        "shed" => Ok(Overload::Shed),
        other => Err(format!("`{other}`: use `backpressure` or `shed`")),
    }
}

fn parse_path(s: &str) -> Result<PathBuf, String> {
    match s.trim() {
        "" => Err("the path is empty".into()),
        p => Ok(PathBuf::from(p)),
    }
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.trim().parse().map_err(|e| format!("`{s}` is not an address (e.g. 127.0.0.1:8080): {e}"))
}

/// Any text, empty included.
fn parse_any(s: &str) -> Result<String, String> {
    Ok(s.trim().to_string())
}

fn parse_nonempty(s: &str) -> Result<String, String> {
    match s.trim() {
        "" => Err("the value is empty".into()),
        v => Ok(v.to_string()),
    }
}

fn parse_database_url(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.starts_with("postgres://") || s.starts_with("postgresql://") || s.starts_with("sqlite:") {
        Ok(s.to_string())
    } else {
        Err(format!("database URL `{}`: use postgres://... or sqlite://...", crate::redact::redact(s)))
    }
}

fn parse_http_url(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.starts_with("http://") || s.starts_with("https://") {
        Ok(s.trim_end_matches('/').to_string())
    } else {
        Err(format!("URL `{}`: use http://... or https://...", crate::redact::redact(s)))
    }
}

/// A PromQL series selector ([`crate::history::selector`]).
fn parse_selector(s: &str) -> Result<String, String> {
    crate::history::selector::parse(s).map(|_| s.trim().to_string()).map_err(|e| format!("`{s}`: {e}"))
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        other => Err(format!("`{other}` is not true or false")),
    }
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be longer than zero".into()),
        d => Ok(d),
    }
}

/// A `KEY=VALUE` librdkafka property of `--kafka-option`; those Vigil sets itself are refused.
/// The `KEY = VALUE` pairs of a table of `vigil.toml`, each parsed as `KEY=VALUE` by `parse`;
/// one that does not parse is a problem named by its table (`kafka_options`: `[kafka] options`).
fn table_pairs<T>(
    table_name: &'static str,
    table: &BTreeMap<String, String>,
    parse: impl Fn(&str) -> Result<T, String>,
    problems: &mut Vec<String>,
) -> Vec<T> {
    table
        .iter()
        .filter_map(|(k, v)| {
            parse(&format!("{k}={v}"))
                .map_err(|e| problems.push(format!("vigil.toml {}: {e}", file::place(table_name))))
                .ok()
        })
        .collect()
}

/// `TOPIC=FORMAT`: a topic and the format of its messages.
pub fn parse_topic_format(s: &str) -> Result<(String, Format), String> {
    let (topic, format) = s.split_once('=').ok_or_else(|| format!("`{s}` is not TOPIC=FORMAT"))?;
    let topic = topic.trim();
    if topic.is_empty() {
        return Err(format!("`{s}` names no topic"));
    }
    Ok((topic.to_string(), Format::parse_for(format, Carrier::Message)?))
}

pub fn parse_kafka_option(s: &str) -> Result<(String, String), String> {
    let (key, value) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected KEY=VALUE"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("`{s}`: the property name is empty"));
    }
    if let Some((_, instead)) = crate::kafka::OWN_OPTIONS.iter().find(|(own, _)| *own == key) {
        return Err(format!("`{key}` is set by Vigil; {instead}"));
    }
    Ok((key.to_string(), value.to_string()))
}

/// A stream's topic. The stream may be one the rules declare, which only they can tell: it is
/// checked when the rules are loaded ([`ServeConfig::add_declared_topics`]).
fn parse_topic(s: &str) -> Result<(String, String), String> {
    let (stream, topic) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected STREAM=TOPIC"))?;
    if stream.is_empty() || !stream.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("`{stream}` is not a stream name (letters, digits and _)"));
    }
    if topic.is_empty() {
        return Err(format!("`{s}`: the topic name is empty"));
    }
    Ok((stream.to_string(), topic.to_string()))
}

impl ServeConfig {
    /// Adds the topics of the streams `catalog` declares beyond Vigil's own, read as Vigil's
    /// are: the one set for each, or else its name. An error for a topic set for a stream the
    /// catalogue does not have.
    pub fn add_declared_topics(&mut self, catalog: &Catalog) -> Result<(), String> {
        if let Some(name) = self.declared_topics.keys().find(|n| catalog.stream(n).is_none()) {
            return Err(format!(
                "a topic is set for stream `{name}`, which the rules do not declare; the streams are {}",
                catalog.stream_names().join(", ")
            ));
        }
        for stream in catalog.declared() {
            let topic = self.declared_topics.get(stream.name()).cloned().unwrap_or_else(|| stream.name().to_string());
            self.topics.insert(stream, topic);
        }
        Ok(())
    }
}

/// Every problem of a configuration, found together.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// How webhook calls are made and retried.
#[derive(Debug, Clone, Copy)]
pub struct WebhookSettings {
    pub timeout: Duration,
    pub max_attempts: u32,
    pub backoff: Duration,
}

impl ServeConfig {
    /// Merges flags over the file over defaults, and reports every problem at once.
    pub fn resolve(args: ServeArgs) -> Result<ServeConfig, ConfigError> {
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let path = args.config.clone().or_else(|| Some(PathBuf::from("vigil.toml")).filter(|p| p.exists()));
        let file = match &path {
            Some(path) => file::read(path, &mut warnings).unwrap_or_else(|e| {
                problems.extend(e);
                FileConfig::default()
            }),
            None => FileConfig::default(),
        };
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let mut config = ServeConfig::plain(&args, &file, &mut problems);
        config.warnings = warnings;
        let mut from_file = EngineArgs::default();
        for (name, value) in &file.engine {
            if let Err(e) = from_file.set(name, &value.text()) {
                problems.push(format!("vigil.toml [engine] {name}: {e}"));
            }
        }
        config.engine = args.engine.clone().or(from_file).over(EngineSettings::serve());
        config.topics = Stream::BUILT_IN.iter().map(|s| (*s, s.name().to_string())).collect();
        let set = table_pairs("topics", &file.topics, parse_topic, &mut problems).into_iter().chain(args.topics);
        for (name, topic) in set {
            match Catalog::prelude().stream(&name) {
                Some(stream) => config.topics.insert(stream, topic),
                None => config.declared_topics.insert(name, topic),
            };
        }
        config.kafka_options.extend(table_pairs(
            "kafka_options",
            &file.kafka_options,
            parse_kafka_option,
            &mut problems,
        ));
        config.kafka_options.extend(args.kafka_options);
        let formats = table_pairs("kafka_topic_format", &file.kafka_topic_format, parse_topic_format, &mut problems);
        config.topic_formats.extend(formats);
        config.topic_formats.extend(args.kafka_topic_formats);
        config.topic_formats.retain(|_, f| *f != Format::Jsonl);
        config.replay = if args.replay.is_empty() { file.replay } else { args.replay };
        config.alertmanager_url = if args.alertmanager_url.is_empty() {
            file.alertmanager_url.iter().filter_map(|u| parse_http_url(u).map_err(|e| problems.push(e)).ok()).collect()
        } else {
            args.alertmanager_url
        };
        let labels = table_pairs(
            "alertmanager_external_labels",
            &file.alertmanager_external_labels,
            super::alertmanager::parse_external_label,
            &mut problems,
        );
        config.alertmanager_external_labels.extend(labels);
        config.alertmanager_external_labels.extend(args.alertmanager_external_labels);
        problems.extend(config.validate());
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError { problems })
        }
    }

    /// Problems of the settings together, beyond each value's own.
    fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => problems.push("--tls-cert-file needs --tls-key-file".to_string()),
            (None, Some(_)) => problems.push("--tls-key-file needs --tls-cert-file".to_string()),
            _ => {}
        }
        for r in &self.replay {
            if !r.exists() {
                problems.push(format!("replay file {} does not exist", r.display()));
            }
        }
        if self.rules.is_file() {
            problems.push(format!(
                "--rules {} is a file: the service watches a folder of rule files (`vigil replay` takes a file)",
                self.rules.display()
            ));
        } else if !self.rules.is_dir() {
            problems.push(format!("rules folder {} does not exist", self.rules.display()));
        }
        if self.kafka_join_group {
            problems.extend(self.join_group_problems());
        }
        for (topic, format) in &self.topic_formats {
            let stream = self.topics.iter().find(|(_, t)| *t == topic).map(|(s, _)| *s);
            match stream {
                None => problems.push(format!(
                    "--kafka-topic-format {topic}={}: `{topic}` is not a stream's topic (set one with --topic STREAM={topic})",
                    format.name()
                )),
                Some(s) if s != Stream::Metric => problems.push(format!(
                    "--kafka-topic-format {topic}={}: the format carries metric samples, and `{topic}` is the {} stream's topic",
                    format.name(),
                    s.name()
                )),
                Some(_) => {}
            }
        }
        if self.api_read_token.is_some() && self.api_token.is_none() {
            problems.push(
                "--api-read-token is set without --api-token: reads would need a token while anyone could \
                 ingest events and change rules; set --api-token (VIGIL_API_TOKEN) too"
                    .into(),
            );
        }
        problems
    }

    /// What `--kafka-join-group` cannot work with.
    fn join_group_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.database_url.starts_with("postgres") {
            problems.push(
                "--kafka-join-group needs PostgreSQL (--database-url postgres://...): the instances of a group \
                 share their alerts, checkpoints and partition ownership in one store, and SQLite is one \
                 machine's file"
                    .into(),
            );
        }
        if self.kafka_brokers.is_none() {
            problems.push("--kafka-join-group needs --kafka-brokers: the group is a Kafka consumer group".into());
        }
        if !self.replay.is_empty() {
            problems.push(
                "--kafka-join-group takes its events from Kafka only: replay a file with `vigil produce` into \
                 the group's topics, or with `vigil replay`"
                    .into(),
            );
        }
        problems
    }

    pub fn webhook(&self) -> WebhookSettings {
        WebhookSettings {
            timeout: self.webhook_timeout,
            max_attempts: self.webhook_max_attempts,
            backoff: self.webhook_backoff,
        }
    }

    /// The state budget in bytes.
    pub fn max_state_bytes(&self) -> usize {
        usize::try_from(self.max_state_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }

    /// How the replicas of HA pairs are told apart.
    pub fn remote_write_ha(&self) -> crate::ha::HaLabels {
        crate::ha::HaLabels {
            replica: self
                .remote_write_replica_labels
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            cluster: self.remote_write_cluster_label.clone(),
            failover: self.remote_write_ha_failover,
        }
    }

    /// How the collectors' samples are placed under hosts, from every source alike.
    pub fn host_mapping(&self) -> vigil_formats::HostMapping {
        vigil_formats::HostMapping {
            influx: vigil_formats::influx::Mapping { host_tag: self.influx_host_tag.clone(), ..Default::default() },
            otlp_attribute: self.otlp_host_attribute.clone(),
            remote_write: vigil_formats::remote_write::HostLabels {
                label: self.remote_write_host_label.clone(),
                fallback: self.remote_write_fallback_label.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests;
