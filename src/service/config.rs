//! `vigil serve` configuration: flags, each with an environment variable, over an optional
//! `vigil.toml`, over defaults.

use crate::schema::Stream;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Flags of `vigil serve`. Each is optional here so that a value from `vigil.toml` applies when
/// the flag and its variable are absent.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Folder of `*.saql` rules, reloaded when it changes or on SIGHUP [default: rules]
    #[arg(long, env = "VIGIL_RULES")]
    pub rules: Option<PathBuf>,
    /// Address of the HTTP API [default: 127.0.0.1:8080]
    #[arg(long, env = "VIGIL_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// postgres://... or sqlite://... [default: sqlite://vigil.db]
    #[arg(long, env = "VIGIL_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Kafka bootstrap servers; no Kafka when unset
    #[arg(long, env = "VIGIL_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,
    /// Kafka consumer group [default: vigil]
    #[arg(long, env = "VIGIL_KAFKA_GROUP")]
    pub kafka_group: Option<String>,
    /// Create missing stream topics at start (for brokers that do not create them)
    #[arg(long, env = "VIGIL_KAFKA_CREATE_TOPICS")]
    pub kafka_create_topics: bool,
    /// Topic of a stream, STREAM=TOPIC, repeatable [default: the topic is named as the stream]
    #[arg(long = "topic", value_parser = parse_topic)]
    pub topics: Vec<(Stream, String)>,
    /// A librdkafka property for Vigil's Kafka clients, KEY=VALUE, repeatable (security settings,
    /// `fetch.wait.max.ms`, ...); over the same key in `vigil.toml`
    #[arg(long = "kafka-option", value_parser = parse_kafka_option)]
    pub kafka_options: Vec<(String, String)>,
    /// Where alerts are POSTed, in Alertmanager's webhook format
    #[arg(long, env = "VIGIL_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
    /// Bearer token required by mutating endpoints
    #[arg(long, env = "VIGIL_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Bearer token required by reading endpoints (the API token works too) [default: none, reads are open]
    #[arg(long, env = "VIGIL_API_READ_TOKEN", hide_env_values = true)]
    pub api_read_token: Option<String>,
    /// A recorded file fed into the running service, repeatable
    #[arg(long = "replay")]
    pub replay: Vec<PathBuf>,
    /// How late an event may arrive and still count, e.g. `30s` [default: 5s]
    #[arg(long, env = "VIGIL_LATENESS", value_parser = crate::parser::parse_duration)]
    pub lateness: Option<u64>,
    /// The URL users reach the API at, for links in webhook calls [default: http://HTTP_ADDR]
    #[arg(long, env = "VIGIL_EXTERNAL_URL")]
    pub external_url: Option<String>,
    /// How often the engine's state is checkpointed to the store, e.g. `10s` [default: 10s]
    #[arg(long, env = "VIGIL_CHECKPOINT_INTERVAL", value_parser = crate::parser::parse_duration)]
    pub checkpoint_interval: Option<u64>,
    /// Folder of the on-disk alert buffer used while the store is down [default: vigil-spool]
    #[arg(long, env = "VIGIL_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Most the spool may hold, in MiB; when full the engine waits [default: 256]
    #[arg(long, env = "VIGIL_SPOOL_MAX_MB")]
    pub spool_max_mb: Option<u64>,
    /// How long one webhook call may take, e.g. `5s` [default: 10s]
    #[arg(long, env = "VIGIL_WEBHOOK_TIMEOUT", value_parser = crate::parser::parse_duration)]
    pub webhook_timeout: Option<u64>,
    /// Attempts before a webhook delivery is dead [default: 12]
    #[arg(long, env = "VIGIL_WEBHOOK_MAX_ATTEMPTS")]
    pub webhook_max_attempts: Option<u32>,
    /// Wait before the first webhook retry, doubled after each failure up to 5 min [default: 1s]
    #[arg(long, env = "VIGIL_WEBHOOK_BACKOFF", value_parser = crate::parser::parse_duration)]
    pub webhook_backoff: Option<u64>,
    /// Most live keys (window groups, partial matches, alerts) a rule holds; past it the least
    /// recently active are evicted [default: 1000000]
    #[arg(long, env = "VIGIL_MAX_KEYS_PER_RULE")]
    pub max_keys_per_rule: Option<usize>,
    /// A partial match or window group with no progress for this long (event time) is dropped
    /// before its `within` or history ends, e.g. `6h`; `0s` never [default: 0s]
    #[arg(long, env = "VIGIL_IDLE_TIMEOUT", value_parser = crate::parser::parse_duration)]
    pub idle_timeout: Option<u64>,
    /// When the engine cannot keep up: `backpressure` (sources wait) or `shed` (events are
    /// dropped and counted) [default: backpressure]
    #[arg(long, env = "VIGIL_OVERLOAD")]
    pub overload: Option<Overload>,
    /// A `vigil.toml` with any of these settings [default: vigil.toml if it exists]
    #[arg(long, env = "VIGIL_CONFIG")]
    pub config: Option<PathBuf>,
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

/// A `KEY=VALUE` librdkafka property of `--kafka-option`; those Vigil sets itself are refused.
pub fn parse_kafka_option(s: &str) -> Result<(String, String), String> {
    let (key, value) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected KEY=VALUE"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("`{s}`: the property name is empty"));
    }
    if let Some((_, instead)) = crate::service::kafka::OWN_OPTIONS.iter().find(|(own, _)| *own == key) {
        return Err(format!("`{key}` is set by Vigil; {instead}"));
    }
    Ok((key.to_string(), value.to_string()))
}

fn parse_topic(s: &str) -> Result<(Stream, String), String> {
    let (stream, topic) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected STREAM=TOPIC"))?;
    let stream = Stream::from_name(stream).ok_or_else(|| {
        let names: Vec<&str> = Stream::ALL.iter().map(|s| s.name()).collect();
        format!("unknown stream `{stream}`; expected one of {}", names.join(", "))
    })?;
    if topic.is_empty() {
        return Err(format!("`{s}`: the topic name is empty"));
    }
    Ok((stream, topic.to_string()))
}

/// `vigil.toml`: the same settings as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Folder of rules.
    pub rules: Option<PathBuf>,
    /// Address of the HTTP API.
    pub http_addr: Option<SocketAddr>,
    /// postgres://... or sqlite://...
    pub database_url: Option<String>,
    /// Kafka bootstrap servers.
    pub kafka_brokers: Option<String>,
    /// Kafka consumer group.
    pub kafka_group: Option<String>,
    /// Create missing stream topics at start.
    #[serde(default)]
    pub kafka_create_topics: bool,
    /// Topic per stream: `[topics] task_event = "cluster.task-events"`.
    #[serde(default)]
    pub topics: BTreeMap<String, String>,
    /// librdkafka properties: `[kafka_options] "security.protocol" = "ssl"`.
    #[serde(default)]
    pub kafka_options: BTreeMap<String, String>,
    /// Webhook receiver.
    pub webhook_url: Option<String>,
    /// Bearer token for mutating endpoints.
    pub api_token: Option<String>,
    /// Bearer token for reading endpoints.
    pub api_read_token: Option<String>,
    /// Recorded files to feed in.
    #[serde(default)]
    pub replay: Vec<PathBuf>,
    /// Allowed lateness, e.g. "30 s".
    pub lateness: Option<String>,
    /// URL of the API as users reach it.
    pub external_url: Option<String>,
    /// How often to checkpoint, e.g. "10 s".
    pub checkpoint_interval: Option<String>,
    /// Folder of the on-disk alert buffer.
    pub spool_dir: Option<PathBuf>,
    /// Most the spool may hold, in MiB.
    pub spool_max_mb: Option<u64>,
    /// How long one webhook call may take, e.g. "5 s".
    pub webhook_timeout: Option<String>,
    /// Attempts before a webhook delivery is dead.
    pub webhook_max_attempts: Option<u32>,
    /// Wait before the first webhook retry, e.g. "1 s".
    pub webhook_backoff: Option<String>,
    /// Most live keys per rule.
    pub max_keys_per_rule: Option<usize>,
    /// Idle time after which a key is dropped, e.g. "6 h"; "0 s" never.
    pub idle_timeout: Option<String>,
    /// `backpressure` or `shed`.
    pub overload: Option<Overload>,
}

/// The settings in force.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub rules: PathBuf,
    pub http_addr: SocketAddr,
    pub database_url: String,
    pub kafka_brokers: Option<String>,
    pub kafka_group: String,
    pub kafka_create_topics: bool,
    /// librdkafka properties set on every Kafka client, over Vigil's defaults.
    pub kafka_options: BTreeMap<String, String>,
    pub topics: BTreeMap<Stream, String>,
    pub webhook_url: Option<String>,
    pub api_token: Option<String>,
    pub api_read_token: Option<String>,
    pub replay: Vec<PathBuf>,
    pub lateness_ms: i64,
    /// When unset, the address the API is bound to.
    pub external_url: Option<String>,
    pub checkpoint_ms: u64,
    pub spool_dir: PathBuf,
    pub spool_max_bytes: u64,
    pub webhook: WebhookSettings,
    pub max_keys_per_rule: usize,
    /// 0: keys never expire.
    pub idle_timeout_ms: i64,
    pub overload: Overload,
}

/// How webhook calls are made and retried.
#[derive(Debug, Clone, Copy)]
pub struct WebhookSettings {
    pub timeout_ms: u64,
    pub max_attempts: u32,
    pub backoff_ms: u64,
}

impl ServeConfig {
    /// Merges flags over the file over defaults, and reports every problem at once.
    pub fn resolve(args: ServeArgs) -> Result<ServeConfig, String> {
        let mut problems = Vec::new();
        let file = match &args.config {
            Some(path) => read_file(path).unwrap_or_else(|e| {
                problems.push(e);
                FileConfig::default()
            }),
            None if Path::new("vigil.toml").exists() => read_file(Path::new("vigil.toml")).unwrap_or_else(|e| {
                problems.push(e);
                FileConfig::default()
            }),
            None => FileConfig::default(),
        };
        let mut topics: BTreeMap<Stream, String> = Stream::ALL.iter().map(|s| (*s, s.name().to_string())).collect();
        for (stream, topic) in &file.topics {
            match parse_topic(&format!("{stream}={topic}")) {
                Ok((s, t)) => {
                    topics.insert(s, t);
                }
                Err(e) => problems.push(format!("vigil.toml [topics]: {e}")),
            }
        }
        for (s, t) in args.topics {
            topics.insert(s, t);
        }
        let mut kafka_options = BTreeMap::new();
        for (key, value) in &file.kafka_options {
            match parse_kafka_option(&format!("{key}={value}")) {
                Ok((k, v)) => {
                    kafka_options.insert(k, v);
                }
                Err(e) => problems.push(format!("vigil.toml [kafka_options]: {e}")),
            }
        }
        kafka_options.extend(args.kafka_options);
        // A duration from the flag, else from the file; a bad value in the file is reported
        // even when the flag overrides it.
        let mut duration = |flag: Option<u64>, text: &Option<String>, name: &str| {
            let from_file = text.as_deref().map(crate::parser::parse_duration).transpose().unwrap_or_else(|e| {
                problems.push(format!("vigil.toml {name}: {e}"));
                None
            });
            flag.or(from_file)
        };
        let lateness = duration(args.lateness, &file.lateness, "lateness");
        let checkpoint = duration(args.checkpoint_interval, &file.checkpoint_interval, "checkpoint_interval");
        let webhook_timeout = duration(args.webhook_timeout, &file.webhook_timeout, "webhook_timeout");
        let webhook_backoff = duration(args.webhook_backoff, &file.webhook_backoff, "webhook_backoff");
        let idle_timeout = duration(args.idle_timeout, &file.idle_timeout, "idle_timeout");
        let webhook = WebhookSettings {
            timeout_ms: webhook_timeout.unwrap_or(10_000),
            max_attempts: args.webhook_max_attempts.or(file.webhook_max_attempts).unwrap_or(12),
            backoff_ms: webhook_backoff.unwrap_or(1_000),
        };
        if webhook.timeout_ms == 0 || webhook.max_attempts == 0 {
            problems.push("the webhook timeout and attempts must be more than zero".into());
        }
        let max_keys_per_rule = args.max_keys_per_rule.or(file.max_keys_per_rule).unwrap_or(1_000_000);
        if max_keys_per_rule == 0 {
            problems.push("max keys per rule must be more than zero".into());
        }
        let checkpoint_ms = checkpoint.unwrap_or(10_000);
        if checkpoint_ms == 0 {
            problems.push("the checkpoint interval must be longer than zero".into());
        }
        let http_addr = args.http_addr.or(file.http_addr).unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
        let database_url = args.database_url.or(file.database_url).unwrap_or_else(|| "sqlite://vigil.db".to_string());
        if !(database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://")
            || database_url.starts_with("sqlite:"))
        {
            problems.push(format!("database URL `{database_url}`: use postgres://... or sqlite://..."));
        }
        let webhook_url = args.webhook_url.or(file.webhook_url);
        if let Some(url) = &webhook_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(format!("webhook URL `{url}`: use http://... or https://..."));
            }
        }
        let api_token = args.api_token.or(file.api_token).filter(|t| !t.is_empty());
        let replay = if args.replay.is_empty() { file.replay } else { args.replay };
        for r in &replay {
            if !r.exists() {
                problems.push(format!("replay file {} does not exist", r.display()));
            }
        }
        let rules = args.rules.or(file.rules).unwrap_or_else(|| PathBuf::from("rules"));
        if !rules.is_dir() {
            problems.push(format!("rules folder {} does not exist", rules.display()));
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        Ok(ServeConfig {
            rules,
            external_url: args.external_url.or(file.external_url),
            http_addr,
            database_url,
            kafka_brokers: args.kafka_brokers.or(file.kafka_brokers).filter(|b| !b.is_empty()),
            kafka_group: args.kafka_group.or(file.kafka_group).unwrap_or_else(|| "vigil".to_string()),
            kafka_create_topics: args.kafka_create_topics || file.kafka_create_topics,
            kafka_options,
            topics,
            webhook_url,
            api_token,
            api_read_token: args.api_read_token.or(file.api_read_token).filter(|t| !t.is_empty()),
            replay,
            lateness_ms: lateness.unwrap_or(5_000) as i64,
            checkpoint_ms,
            spool_dir: args.spool_dir.or(file.spool_dir).unwrap_or_else(|| PathBuf::from("vigil-spool")),
            spool_max_bytes: args.spool_max_mb.or(file.spool_max_mb).unwrap_or(256).saturating_mul(1 << 20),
            webhook,
            max_keys_per_rule,
            idle_timeout_ms: idle_timeout.unwrap_or(0) as i64,
            overload: args.overload.or(file.overload).unwrap_or_default(),
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_problems_come_together() {
        let dir = std::env::temp_dir().join(format!("vigil-config-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("rules")).expect("temp dir");
        let file = dir.join("vigil.toml");
        std::fs::write(
            &file,
            format!(
                "rules = {:?}\nlateness = \"1 min\"\nkafka_group = \"from-file\"\n[topics]\nmetric = \"m.topic\"\n\
                 [kafka_options]\n\"fetch.wait.max.ms\" = \"50\"\n\"client.id\" = \"from-file\"\n",
                dir.join("rules")
            ),
        )
        .expect("write");
        let args = ServeArgs {
            config: Some(file.clone()),
            kafka_group: Some("from-flag".into()),
            kafka_options: vec![parse_kafka_option("fetch.wait.max.ms=1").expect("valid")],
            ..ServeArgs::default()
        };
        let c = ServeConfig::resolve(args).expect("valid");
        assert_eq!(c.kafka_group, "from-flag");
        assert_eq!(c.kafka_options["fetch.wait.max.ms"], "1");
        assert_eq!(c.kafka_options["client.id"], "from-file");
        assert_eq!(c.lateness_ms, 60_000);
        assert_eq!(c.topics[&Stream::Metric], "m.topic");
        assert_eq!(c.topics[&Stream::TaskEvent], "task_event");
        let bad = ServeArgs {
            config: Some(file),
            database_url: Some("mysql://x".into()),
            webhook_url: Some("ftp://x".into()),
            ..ServeArgs::default()
        };
        let err = ServeConfig::resolve(bad).expect_err("two problems");
        assert_eq!(err.lines().count(), 2, "{err}");
        std::fs::write(dir.join("own.toml"), "[kafka_options]\n\"group.id\" = \"x\"\n").expect("write");
        let own = ServeArgs { config: Some(dir.join("own.toml")), ..ServeArgs::default() };
        let err = ServeConfig::resolve(own).expect_err("a property Vigil sets");
        assert!(err.contains("[kafka_options]: `group.id` is set by Vigil; use --kafka-group"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn kafka_options_are_key_value_and_leave_vigils_own_alone() {
        assert_eq!(parse_kafka_option("sasl.password=a=b"), Ok(("sasl.password".into(), "a=b".into())));
        assert_eq!(parse_kafka_option("linger.ms"), Err("`linger.ms`: expected KEY=VALUE".into()));
        assert_eq!(parse_kafka_option("=1"), Err("`=1`: the property name is empty".into()));
        let err = parse_kafka_option("enable.auto.commit=true").expect_err("Vigil commits after checkpoints");
        assert!(err.starts_with("`enable.auto.commit` is set by Vigil"), "{err}");
    }
}
