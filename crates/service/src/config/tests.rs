use super::*;
use std::path::Path;

#[test]
fn every_default_parses_with_its_settings_parser() {
    for (name, parsed) in ServeConfig::defaults() {
        assert_eq!(parsed, Ok(()), "{name}");
    }
}

/// The file of the flags test, in sections.
const SECTIONED: &str = "[engine]\nlateness = \"1 min\"\nworkers = 3\n[kafka]\ngroup = \"from-file\"\n\
    [kafka.topics]\nmetric = \"m.topic\"\n[kafka.options]\n\"fetch.wait.max.ms\" = \"50\"\n\
    \"client.id\" = \"from-file\"\n[store]\nspool_max_mb = 3\n";

/// The same settings written the deprecated way, flat.
const FLAT: &str = "lateness = \"1 min\"\nworkers = 3\nkafka_group = \"from-file\"\nspool_max_mb = 3\n\
    [topics]\nmetric = \"m.topic\"\n[kafka_options]\n\"fetch.wait.max.ms\" = \"50\"\n\"client.id\" = \"from-file\"\n";

fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let file = dir.join(name);
    std::fs::write(&file, format!("{text}\n")).expect("write");
    file
}

#[test]
fn flags_override_the_file_and_problems_come_together() {
    let dir = std::env::temp_dir().join(format!("vigil-config-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("rules")).expect("temp dir");
    let rules = format!("[engine]\nrules = {:?}\n", dir.join("rules"));
    let file = write_config(&dir, "vigil.toml", &SECTIONED.replace("[engine]\n", &rules));
    let args = ServeArgs {
        config: Some(file.clone()),
        kafka_group: Some("from-flag".into()),
        kafka_options: vec![parse_kafka_option("fetch.wait.max.ms=1").expect("valid")],
        engine: EngineArgs { workers: Some(2), ..EngineArgs::default() },
        ..ServeArgs::default()
    };
    let c = ServeConfig::resolve(args).expect("valid");
    assert_eq!(c.kafka_group, "from-flag");
    assert_eq!(c.kafka_options["fetch.wait.max.ms"], "1");
    assert_eq!(c.kafka_options["client.id"], "from-file");
    assert_eq!(c.engine.lateness_ms(), 60_000, "the engine's section");
    assert_eq!(c.engine.workers, 2, "an engine flag over the file");
    assert_eq!(c.engine.max_event_future, Duration::from_secs(300), "an engine default");
    assert_eq!(c.spool_max_mb, 3, "a number in the file");
    assert_eq!(c.checkpoint_interval, Duration::from_secs(60), "the default");
    assert_eq!(c.topics[&Stream::Metric], "m.topic");
    assert_eq!(c.topics[&Stream::TaskEvent], "task_event");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let bad = ServeArgs {
        config: Some(file.clone()),
        database_url: Some("mysql://x".into()),
        webhook_url: Some("ftp://x".into()),
        ..ServeArgs::default()
    };
    // Flags are parsed by clap with the same parsers; here they come in as given.
    let c = ServeConfig::resolve(bad).expect("resolve takes parsed flags");
    assert_eq!(c.database_url, "mysql://x");
    let bad = "[engine]\nlateness = \"soon\"\n[webhook]\nurl = \"ftp://x\"\n[http]\nmax_connections = 0\n";
    let bad = ServeArgs { config: Some(write_config(&dir, "bad.toml", bad)), ..ServeArgs::default() };
    let err = ServeConfig::resolve(bad).expect_err("three problems").to_string();
    assert_eq!(err.lines().filter(|l| l.starts_with("vigil.toml")).count(), 3, "{err}");
    assert!(err.contains("vigil.toml [webhook] url: URL `ftp://x`"), "{err}");
    assert!(err.contains("vigil.toml [engine] lateness:"), "{err}");
    let own = write_config(&dir, "own.toml", "[kafka.options]\n\"group.id\" = \"x\"\n");
    let err = ServeConfig::resolve(ServeArgs { config: Some(own), ..ServeArgs::default() }).expect_err("Vigil's");
    assert!(err.to_string().contains("[kafka] options: `group.id` is set by Vigil; use --kafka-group"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn flat_keys_still_read_each_with_a_warning_naming_its_section() {
    let dir = std::env::temp_dir().join(format!("vigil-config-flat-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("rules")).expect("temp dir");
    let rules = format!("rules = {:?}\n", dir.join("rules"));
    let resolve = |name: &str, text: &str| {
        let config = Some(write_config(&dir, name, &format!("{rules}{text}")));
        ServeConfig::resolve(ServeArgs { config, ..ServeArgs::default() })
    };
    let flat = resolve("flat.toml", FLAT).expect("flat keys still read");
    let sectioned = resolve("sectioned.toml", SECTIONED).expect("valid");
    for c in [&flat, &sectioned] {
        assert_eq!((c.engine.lateness_ms(), c.engine.workers, c.spool_max_mb), (60_000, 3, 3));
        assert_eq!((c.kafka_group.as_str(), c.topics[&Stream::Metric].as_str()), ("from-file", "m.topic"));
        assert_eq!(c.kafka_options["client.id"], "from-file");
    }
    assert!(
        flat.warnings.contains(
            &"vigil.toml: `kafka_group` at the top level is deprecated; write it as `group` in [kafka]".to_string()
        ),
        "{:?}",
        flat.warnings
    );
    assert!(flat
        .warnings
        .iter()
        .any(|w| w.contains("`kafka_options` at the top level is deprecated; write it as `options` in [kafka]")));
    assert!(flat
        .warnings
        .iter()
        .any(|w| w.contains("`lateness` at the top level is deprecated; write it as `lateness` in [engine]")));
    // `rules` flat, with the others in sections: one warning.
    assert_eq!(sectioned.warnings.len(), 1, "{:?}", sectioned.warnings);
    let err = resolve("twice.toml", "kafka_group = \"a\"\n[kafka]\ngroup = \"b\"\n").expect_err("twice").to_string();
    assert!(err.contains("`group` in [kafka] is also set at the top level"), "{err}");
    let err = resolve("misplaced.toml", "[http]\nbrokers = \"k:9092\"\n").expect_err("misplaced").to_string();
    assert!(err.contains("`brokers` in [http] is no setting; it is `brokers` in [kafka]"), "{err}");
    let err = resolve("unknown.toml", "[engine]\nwindow = 3\n").expect_err("unknown").to_string();
    assert!(err.contains("`window` in [engine] is no setting of vigil serve"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_topic_format_names_a_metric_topic_and_a_format_vigil_reads() {
    assert_eq!(parse_topic_format("telegraf=influx"), Ok(("telegraf".into(), Format::Influx)));
    assert_eq!(parse_topic_format("otel=otlp_proto"), Ok(("otel".into(), Format::OtlpProto)));
    assert_eq!(parse_topic_format("otel=otlp-json"), Ok(("otel".into(), Format::OtlpJson)));
    assert_eq!(parse_topic_format("t=telegraf-json"), Ok(("t".into(), Format::TelegrafJson)));
    let adapter = parse_topic_format("p=prometheus-kafka-adapter");
    assert_eq!(adapter, Ok(("p".into(), Format::PrometheusKafkaAdapter)));
    let err = parse_topic_format("telegraf=graphite").expect_err("not read");
    assert!(err.contains("`graphite` is not a format of Kafka messages Vigil reads"), "{err}");
    assert_eq!(parse_topic_format("t=vigil"), Ok(("t".into(), Format::Jsonl)));
    let err = parse_topic_format("t=nab").expect_err("a file format");
    assert!(err.contains("`nab` is not a format of Kafka messages: jsonl, influx"), "{err}");
    assert!(parse_topic_format("telegraf").is_err());
    let dir = std::env::temp_dir().join(format!("vigil-config-format-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let args = |formats: &[(&str, Format)]| ServeArgs {
        rules: Some(dir.clone()),
        topics: vec![("metric".into(), "telegraf".into())],
        kafka_topic_formats: formats.iter().map(|(t, f)| (t.to_string(), *f)).collect(),
        ..ServeArgs::default()
    };
    let c = ServeConfig::resolve(args(&[("telegraf", Format::Influx)])).expect("valid");
    assert_eq!(c.topic_formats["telegraf"], Format::Influx);
    let err = ServeConfig::resolve(args(&[("task_event", Format::Influx)])).expect_err("refused").to_string();
    assert!(err.contains("the format carries metric samples, and `task_event` is the task_event stream's"), "{err}");
    let args =
        |formats: &[(&str, Format)]| ServeArgs { topics: vec![("task_event".into(), "tasks".into())], ..args(formats) };
    let c = ServeConfig::resolve(args(&[("tasks", Format::Jsonl)])).expect("JSON lines carry any stream");
    assert!(c.topic_formats.is_empty(), "the default format is not kept: {:?}", c.topic_formats);
    let err = ServeConfig::resolve(args(&[("other", Format::Influx)])).expect_err("refused").to_string();
    assert!(err.contains("`other` is not a stream's topic"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_read_token_alone_is_refused_because_it_would_leave_writes_open() {
    let dir = std::env::temp_dir().join(format!("vigil-config-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let args = ServeArgs { rules: Some(dir.clone()), api_read_token: Some("r".into()), ..ServeArgs::default() };
    let err = ServeConfig::resolve(args).expect_err("refused").to_string();
    assert!(err.contains("--api-read-token is set without --api-token"), "{err}");
    let args = ServeArgs {
        rules: Some(dir.clone()),
        api_read_token: Some("r".into()),
        api_token: Some("w".into()),
        ..ServeArgs::default()
    };
    assert!(ServeConfig::resolve(args).is_ok());
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

#[test]
fn a_warm_start_is_set_in_its_own_section_and_a_bad_selector_is_refused() {
    let dir = std::env::temp_dir().join(format!("vigil-config-warm-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("rules")).expect("temp dir");
    let rules = format!("[engine]\nrules = {:?}\n", dir.join("rules"));
    let warm = "[warm]\nfrom_prometheus = \"http://prometheus:9090/\"\nlookback = \"2 d\"\nmatch = '{job=\"node\"}'\n";
    let file = write_config(&dir, "vigil.toml", &format!("{rules}{warm}"));
    let c = ServeConfig::resolve(ServeArgs { config: Some(file), ..ServeArgs::default() }).expect("valid");
    assert_eq!(c.warm_from_prometheus.as_deref(), Some("http://prometheus:9090"));
    assert_eq!(c.warm_lookback, Duration::from_secs(2 * 86_400));
    assert_eq!(c.warm_match, r#"{job="node"}"#);
    assert_eq!(c.warm_step, Duration::from_secs(150), "the default");
    let warm = c.warm_start().expect("a client").expect("a warm start");
    assert_eq!(warm.dropped_labels, ["__replica__", "prometheus_replica"]);

    let bad = write_config(&dir, "bad.toml", &format!("{rules}[warm]\nmatch = 'up{{job=\"node\"'\n"));
    let err = ServeConfig::resolve(ServeArgs { config: Some(bad), ..ServeArgs::default() }).expect_err("refused");
    assert!(err.to_string().contains("column 14: expected `,` or `}`"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_rules_file_is_refused_saying_the_service_watches_a_folder() {
    let dir = std::env::temp_dir().join(format!("vigil-config-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = write_config(&dir, "one.saql", "");
    let args = ServeArgs { rules: Some(file), ..ServeArgs::default() };
    let err = ServeConfig::resolve(args).expect_err("a file").to_string();
    assert!(err.contains("one.saql is a file: the service watches a folder of rule files"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
