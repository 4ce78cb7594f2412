//! `vigil serve`: the engine as a service between Kafka (or HTTP ingest, or a recorded file) and
//! the people on call, with alerts stored in PostgreSQL or SQLite, pushed to a webhook and
//! tailed over HTTP.
//!
//! ```text
//! Kafka / POST /api/v1/events / --replay --> engine thread --> alert writer --> store
//!                                                                   |--> SSE clients
//!                                                                   '--> webhook outbox --> receiver
//! ```

pub mod alertmanager;
pub mod api;
pub mod backoff;
pub mod config;
pub mod engine_loop;
pub mod event_time;
pub mod group;
pub mod ha;
pub mod history;
pub mod idle;
pub mod ingest_log;
pub mod kafka;
pub mod pacing;
pub mod position;
pub mod redact;
pub mod resent;
pub mod rules;
pub mod server;
pub mod sources;
pub mod spool;
pub mod store;
pub mod telemetry;
#[cfg(test)]
mod testing;
pub mod tls;
pub mod webhook;
pub mod writer;

use config::ServeConfig;
use engine_loop::{EngineHealth, EngineLoop};
use position::Position;
use redact::redact;
use sources::Intake;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch, Notify, Semaphore};

/// Alert stream clients catching up from the store at once.
const CATCH_UP_READS: usize = 4;

/// Why the service could not start. Each says what failed; its cause follows in the chain
/// (`main` prints it as `what: cause`).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot open the store at {url}")]
    Store { url: String, source: store::StoreError },
    #[error("cannot read the checkpoint")]
    Checkpoint(#[source] store::StoreError),
    #[error("cannot read or publish the rules of the consumer group `{group}`")]
    GroupRules { group: String, source: store::StoreError },
    #[error("the rules in {dir} do not load")]
    Rules { dir: PathBuf, source: vigil_lang::ruleset::RuleSetError },
    #[error("cannot listen on {addr}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Topics(String),
    #[error("cannot create the Kafka topics")]
    KafkaTopics(#[source] kafka::KafkaError),
    #[error("cannot create the Kafka consumer")]
    KafkaConsumer(#[source] kafka::KafkaError),
    #[error("cannot join the Kafka consumer group {group}")]
    JoinGroup { group: String, source: rdkafka::error::KafkaError },
    #[error(
        "the group's keyed topic {topic} has {found} partitions and --kafka-keyed-partitions is {configured}: \
         each key group's state lives in partition (key group mod partitions), so the members must agree with \
         the topic; set --kafka-keyed-partitions {found} (changing the count of a group's keyed partitions is not \
         supported yet)"
    )]
    KeyedPartitions { topic: String, found: usize, configured: u32 },
    #[error("cannot open the spool in {dir}")]
    Spool { dir: PathBuf, source: spool::SpoolError },
    #[error("cannot open the ingest log in {dir}")]
    IngestLog { dir: PathBuf, source: std::io::Error },
    #[error("cannot build the webhook client")]
    Webhook(#[source] reqwest::Error),
    #[error("cannot serve TLS: {0}")]
    Tls(tls::TlsError),
}

impl ServiceError {
    /// Whether starting again later may succeed: the store, the port or the broker may come
    /// back; a rule, a folder or a client that cannot be built will not.
    pub fn retryable(&self) -> bool {
        match self {
            ServiceError::Store { source, .. }
            | ServiceError::Checkpoint(source)
            | ServiceError::GroupRules { source, .. } => source.retryable,
            ServiceError::Listen { .. }
            | ServiceError::KafkaTopics(_)
            | ServiceError::KafkaConsumer(_)
            | ServiceError::JoinGroup { .. } => true,
            _ => false,
        }
    }
}

/// What every source checks of an event before it is taken.
fn intake_of(config: &ServeConfig, health: &Arc<EngineHealth>, catalog: &vigil_lang::schema::Catalog) -> Intake {
    Intake {
        bounds: config.engine.bounds(),
        health: health.clone(),
        labels: sources::LabelLimits {
            per_series: config.max_labels_per_series,
            name_bytes: config.max_label_name_length,
            value_bytes: config.max_label_value_length,
        },
        catalog: Arc::new(sources::SharedCatalog::new(catalog.clone())),
    }
}

fn server_limits(config: &ServeConfig) -> server::ServerLimits {
    server::ServerLimits {
        max_connections: server::connections_that_fit(config.max_connections),
        header_timeout: config.http_header_timeout,
        write_timeout: config.http_body_timeout,
    }
}

/// What the stages of the service share: its channels and the state they report to.
struct Wiring {
    telemetry: Arc<telemetry::Telemetry>,
    store: store::Store,
    engine: mpsc::Sender<engine_loop::Input>,
    dead: mpsc::Sender<store::DeadLetter>,
    published: broadcast::Sender<Arc<store::Stored>>,
    health: Arc<writer::Health>,
    engine_health: Arc<EngineHealth>,
    webhook_wake: Arc<Notify>,
    silences: Arc<alertmanager::Silences>,
    /// A group member's keyed partitions, as its loop keeps them: the alerts it resends to
    /// Alertmanager are theirs. None for a single instance, which resends all.
    owned_partitions: Option<alertmanager::OwnedPartitions>,
    intake: Intake,
    /// The metric families' types and units, as remote-write metadata and the warm start's
    /// server describe them.
    families: Arc<vigil_formats::metric_kind::Families>,
    stop: watch::Receiver<bool>,
}

/// Runs the service until SIGINT or SIGTERM.
/// The rules of the folder, checked; the streams they declare get their topics.
fn load_rules(config: &mut ServeConfig) -> Result<vigil_lang::ruleset::RuleSet, ServiceError> {
    let loaded = rules::load(&config.rules)
        .and_then(|set| set.checked())
        .map_err(|source| ServiceError::Rules { dir: config.rules.clone(), source })?;
    tracing::info!(rules = loaded.plans().len(), folder = %config.rules.display(), "rules loaded");
    config.add_declared_topics(loaded.catalog()).map_err(ServiceError::Topics)?;
    Ok(loaded)
}

pub async fn serve(mut config: ServeConfig) -> Result<(), ServiceError> {
    let telemetry = Arc::new(telemetry::Telemetry::new());
    let store = store::Store::connect(&config.database_url)
        .await
        .map_err(|source| ServiceError::Store { url: redact(&config.database_url), source })?;
    let engine_health = Arc::new(EngineHealth::default());
    // A group member runs its group's rules: the folder is made the group's first.
    let rule_sync = sync_group_rules(&config, &store, &engine_health).await?;
    // Taken before the rules are read: a change after this point is seen by the watcher even if
    // it lands before the watcher starts.
    let fingerprint = rules::fingerprint(&config.rules);
    let loaded = load_rules(&mut config)?;
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .map_err(|source| ServiceError::Listen { addr: config.http_addr, source })?;
    let addr = listener.local_addr().map_err(|source| ServiceError::Listen { addr: config.http_addr, source })?;
    let tls =
        tls::Tls::serve(config.tls_cert_file.as_deref(), config.tls_key_file.as_deref()).map_err(ServiceError::Tls)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let external_url = config.external_url.clone().unwrap_or_else(|| format!("{scheme}://{addr}"));

    let (tx, rx, alerts_tx, alerts_rx) = engine_loop::channels();
    let (dead_tx, dead_rx) = mpsc::channel(1024);
    let (stop_tx, stop_rx) = watch::channel(false);
    let wiring = Wiring {
        telemetry: telemetry.clone(),
        store: store.clone(),
        engine: tx,
        dead: dead_tx,
        published: broadcast::channel(4096).0,
        health: Arc::new(writer::Health::default()),
        intake: intake_of(&config, &engine_health, loaded.catalog()),
        engine_health,
        owned_partitions: config.kafka_join_group.then(Default::default),
        webhook_wake: Arc::new(Notify::new()),
        silences: Default::default(),
        families: Default::default(),
        stop: stop_rx,
    };
    tokio::spawn(wiring.engine_health.clone().watch(config.stall_timeout, wiring.stop.clone()));
    let channels = (rx, alerts_tx, alerts_rx, dead_rx);
    let (engine_thread, writer, ticker, ingest_tx) =
        start_engine(&config, &wiring, loaded.plans(), channels, &external_url).await?;

    let live_rules = Arc::new(rules::LiveRules::new(
        config.rules.clone(),
        &loaded,
        wiring.engine.clone(),
        telemetry.clone(),
        wiring.intake.catalog.clone(),
    ));
    tokio::spawn(live_rules.clone().watch(fingerprint, wiring.stop.clone()));
    if let Some(sync) = rule_sync {
        tokio::spawn(sync.run(live_rules.clone(), wiring.stop.clone()));
    }
    let state = app_state(&config, &wiring, store, live_rules, ingest_tx);
    // The way to tell the engine to stop: the API's handlers keep senders of their own alive.
    let engine = wiring.engine.clone();
    drop(wiring);

    let limits = server_limits(&config);
    // Tests and scripts read this line to find a port chosen by the system (`--http-addr 127.0.0.1:0`).
    eprintln!("vigil: listening on {scheme}://{addr}");
    tracing::info!(%addr, tls = tls.is_some(), store = ?state.store.backend(), kafka = config.kafka_brokers.is_some(), "serving");
    // On the signal, the stop is said first: the receivers answer 503 with `Retry-After` from
    // then on (a sender keeps its samples and sends them again), and the sources stop reading.
    let stop_tx = Arc::new(stop_tx);
    let signalled = said_on_signal(stop_tx.clone());
    server::serve(listener, api::router(state.clone()), limits, tls, telemetry, signalled).await;

    let _ = stop_tx.send(true);
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    drop(state);
    stop_engine(engine, engine_thread, writer).await;
    Ok(())
}

/// The engine takes what is queued, then its last checkpoint goes to the writer behind its last
/// alerts; the writer ends once every sender of alerts is gone. Within the 30 s a service
/// manager gives before it kills (HTTP's 5 s before this, then 15 s and 8 s at most).
async fn stop_engine(
    engine: mpsc::Sender<engine_loop::Input>,
    engine_thread: std::thread::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
) {
    // The stop waits for room in the engine's queue, so both are bounded together.
    let stopped = async move {
        let _ = engine.send(engine_loop::Input::Stop).await;
        drop(engine);
        tokio::task::spawn_blocking(move || engine_thread.join()).await
    };
    if tokio::time::timeout(Duration::from_secs(15), stopped).await.is_err() {
        tracing::warn!("the engine did not stop within 15 s; its last checkpoint is not taken");
    }
    if tokio::time::timeout(Duration::from_secs(8), writer).await.is_err() {
        tracing::warn!("the writer did not finish within 8 s; what it had not stored is in its spool or replayed");
    }
    tracing::info!("stopped");
}

/// What runs the engine, and what the API and the shutdown hold of it.
type Started = (
    std::thread::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
    Option<tokio::task::JoinHandle<()>>,
    mpsc::Sender<sources::http::Batch>,
);

/// The engine's channels: its input, its output both ways, and the dead letters.
type EngineChannels = (
    mpsc::Receiver<engine_loop::Input>,
    mpsc::Sender<engine_loop::Output>,
    mpsc::Receiver<engine_loop::Output>,
    mpsc::Receiver<store::DeadLetter>,
);

/// Starts the engine, as a group's member or on its own thread with its sources, and the
/// writers: the engine's thread, the writer, the ticker and the way into HTTP ingest.
async fn start_engine(
    config: &ServeConfig,
    wiring: &Wiring,
    plans: Vec<vigil_lang::plan::RulePlan>,
    (rx, alerts_tx, alerts_rx, dead_rx): EngineChannels,
    external_url: &str,
) -> Result<Started, ServiceError> {
    if config.kafka_join_group {
        let (settled_tx, settled) = std::sync::mpsc::channel();
        let writer = spawn_writers(config, wiring, None, alerts_rx, dead_rx, external_url, Some(settled_tx))?;
        let member = join_group(config, wiring, plans, rx, (alerts_tx, settled)).await?;
        Ok((member, writer, None, forward_ingest(config)?))
    } else {
        let mut engine = build_engine(config, plans);
        let (resume, restored) = restore(&wiring.store, &mut engine).await?;
        let warm = warm_start(config, wiring, restored).map(|w| (w, tokio::runtime::Handle::current()));
        wiring.telemetry.workers.set(engine.count() as i64);
        wiring.telemetry.partitions.set(engine.partitions() as i64);
        tracing::info!(workers = engine.count(), partitions = engine.partitions(), "engine started");
        let consumer = kafka_consumer(config).await?;
        let engine_thread = EngineLoop {
            engine,
            telemetry: wiring.telemetry.clone(),
            health: wiring.engine_health.clone(),
            checkpoint_every: config.checkpoint_interval,
            warm,
            restored: resume.clone(),
            max_state_bytes: config.max_state_bytes(),
            input_stopped_after: config.input_stopped_after,
            source_idle_after: config.source_idle_after,
        }
        .spawn(rx, alerts_tx);
        let writer = spawn_writers(config, wiring, consumer.clone(), alerts_rx, dead_rx, external_url, None)?;
        let (ticker, ingest_tx) = spawn_sources(config, wiring, consumer, &resume)?;
        Ok((engine_thread, writer, Some(ticker), ingest_tx))
    }
}

/// A group member's first round of [`rules::shared::RuleSync`], before its rules are loaded: the
/// group's rule set is published or written into the folder. None when not in a group.
async fn sync_group_rules(
    config: &ServeConfig,
    store: &store::Store,
    health: &Arc<EngineHealth>,
) -> Result<Option<rules::shared::RuleSync>, ServiceError> {
    if !config.kafka_join_group {
        return Ok(None);
    }
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    let by = match &config.external_url {
        Some(url) => url.clone(),
        None => format!("{host} pid {} ({})", std::process::id(), config.http_addr),
    };
    let mut sync = rules::shared::RuleSync::new(
        store.clone(),
        config.kafka_group.clone(),
        config.rules.clone(),
        by,
        health.clone(),
    );
    sync.step(None).await.map_err(|source| ServiceError::GroupRules { group: config.kafka_group.clone(), source })?;
    Ok(Some(sync))
}

/// Starts this instance as a member of its consumer group (`--kafka-join-group`).
async fn join_group(
    config: &ServeConfig,
    w: &Wiring,
    plans: Vec<vigil_lang::plan::RulePlan>,
    control: mpsc::Receiver<engine_loop::Input>,
    (out, settled): (mpsc::Sender<engine_loop::Output>, std::sync::mpsc::Receiver<writer::Settled>),
) -> Result<std::thread::JoinHandle<()>, ServiceError> {
    let brokers = config.kafka_brokers.clone().unwrap_or_default();
    let mut topics = vec![group::keyed_topic(&config.kafka_group)];
    if config.kafka_create_topics {
        topics.extend(config.topics.values().cloned());
    }
    let partitions = i32::try_from(config.kafka_keyed_partitions).unwrap_or(i32::MAX);
    kafka::ensure_topics(&brokers, &topics, partitions, &config.kafka_options)
        .await
        .map_err(ServiceError::KafkaTopics)?;
    let keyed = group::keyed_topic(&config.kafka_group);
    let (b, o, t) = (brokers.clone(), config.kafka_options.clone(), keyed.clone());
    let found = tokio::task::spawn_blocking(move || kafka::partition_count(&b, &t, &o))
        .await
        .unwrap_or(Ok(None))
        .map_err(ServiceError::KafkaTopics)?;
    if let Some(found) = found.filter(|n| *n != config.kafka_keyed_partitions as usize) {
        return Err(ServiceError::KeyedPartitions { topic: keyed, found, configured: config.kafka_keyed_partitions });
    }
    w.telemetry.workers.set(config.engine.workers as i64);
    let member = group::Member {
        group: config.kafka_group.clone(),
        brokers,
        kafka_options: config.kafka_options.clone(),
        instance_id: config.kafka_instance_id.clone(),
        topics: stream_topics(config),
        formats: config.topic_formats.clone(),
        collectors: config.host_mapping(),
        keyed_partitions: config.kafka_keyed_partitions,
        max_held_alerts: config.kafka_max_held_alerts,
        workers: config.engine.workers,
        checkpoint_every: config.checkpoint_interval,
        max_state_bytes: config.max_state_bytes(),
        plans,
        engine: engine_config(config),
        store: w.store.clone(),
        runtime: tokio::runtime::Handle::current(),
        telemetry: w.telemetry.clone(),
        out,
        settled,
        dead: w.dead.clone(),
        intake: w.intake.clone(),
        health: w.engine_health.clone(),
        store_health: w.health.clone(),
        owned_partitions: w.owned_partitions.clone().unwrap_or_default(),
        warm: warm_start(config, w, false).map(|warm| group::WarmGroup {
            warm,
            handle: tokio::runtime::Handle::current(),
            lateness: config.engine.lateness_ms(),
        }),
    };
    member
        .spawn(control, w.stop.clone())
        .map_err(|source| ServiceError::JoinGroup { group: config.kafka_group.clone(), source })
}

/// The streams' topics: as configured, and for streams the rules declare.
fn stream_topics(config: &ServeConfig) -> sources::kafka::StreamTopics {
    sources::kafka::StreamTopics { start: config.topics.clone(), declared: config.declared_topics.clone() }
}

/// HTTP ingest of a group member: forwarded to the group's Kafka topics ([`sources::forward`]).
fn forward_ingest(config: &ServeConfig) -> Result<mpsc::Sender<sources::http::Batch>, ServiceError> {
    let brokers = config.kafka_brokers.as_deref().unwrap_or_default();
    let producer =
        kafka::push_producer(brokers, &config.kafka_options).map_err(|e| ServiceError::KafkaConsumer(e.into()))?;
    let forward = sources::forward::Forward { producer, topics: config.topics.clone() };
    Ok(forward.spawn())
}

/// What the API's handlers share.
fn app_state(
    config: &ServeConfig,
    wiring: &Wiring,
    store: store::Store,
    rules: Arc<rules::LiveRules>,
    ingest: mpsc::Sender<sources::http::Batch>,
) -> Arc<api::AppState> {
    Arc::new(api::AppState {
        store,
        ingest,
        intake: wiring.intake.clone(),
        dead: wiring.dead.clone(),
        published: wiring.published.clone(),
        telemetry: wiring.telemetry.clone(),
        rules,
        token: config.api_token.clone(),
        read_token: config.api_read_token.clone(),
        stop: wiring.stop.clone(),
        ha: Arc::new(ha::HaTracker::new(config.remote_write_ha())),
        resent: Default::default(),
        metric_families: wiring.families.clone(),
        hosts: config.host_mapping(),
        health: wiring.health.clone(),
        engine_health: wiring.engine_health.clone(),
        webhook_wake: wiring.webhook_wake.clone(),
        silences: wiring.silences.clone(),
        history: config.history().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no history for questions: the Prometheus URL is not usable");
            None
        }),
        limits: api::Limits {
            body_timeout: config.http_body_timeout,
            stream_clients: Arc::new(Semaphore::new(config.max_stream_clients)),
            catch_up: Arc::new(Semaphore::new(CATCH_UP_READS)),
            stall_timeout: config.stall_timeout,
            max_samples_per_request: config.max_samples_per_request,
            questions: Arc::new(Semaphore::new(1)),
        },
    })
}

fn build_engine(config: &ServeConfig, plans: Vec<vigil_lang::plan::RulePlan>) -> vigil_engine::runtime::Runtime {
    use vigil_engine::runtime::Runtime;
    let engine = &config.engine;
    match config.checkpoint_layout {
        config::CheckpointLayout::Record => {
            Runtime::new(plans, engine_config(config), engine.partitions(), engine.workers)
        }
        // The build before ran one engine per worker, fleet-wide rules whole.
        config::CheckpointLayout::Previous => {
            let partitions = engine.partitions.unwrap_or(engine.workers);
            Runtime::previous(plans, engine_config(config), partitions, engine.workers)
        }
    }
}

fn engine_config(config: &ServeConfig) -> vigil_engine::engine::EngineConfig {
    vigil_engine::engine::EngineConfig {
        // Event time never runs ahead of the wall clock: no event can make the present late.
        clock: Some(Arc::new(vigil_engine::engine::SystemClock)),
        // A group member sets `two_stage` (`crates/service/src/group`): one engine judges a
        // window whole.
        ..config.engine.config()
    }
}

/// Restores the last checkpoint into `engine`; returns the positions Kafka, files and the
/// ingest log resume from. The rules it does not name start empty: new or changed ones, and
/// those whose entities' keys changed since it was written.
async fn restore(
    store: &store::Store,
    engine: &mut vigil_engine::runtime::Runtime,
) -> Result<(Vec<Position>, bool), ServiceError> {
    let Some((bytes, positions)) = store.load_checkpoint().await.map_err(ServiceError::Checkpoint)? else {
        tracing::info!("no checkpoint: starting empty");
        return Ok((Vec::new(), false));
    };
    let resume = serde_json::from_str(&positions).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the checkpoint's positions cannot be read; starting from the committed ones");
        Vec::new()
    });
    let restored = match engine.restore(&bytes) {
        Ok(rules) => {
            tracing::info!(rules = ?rules, positions = %positions, "state restored from the checkpoint");
            !rules.is_empty()
        }
        Err(e) => {
            tracing::warn!(error = %e, "the checkpoint cannot be used; starting empty");
            false
        }
    };
    Ok((resume, restored))
}

/// The warm start `--warm-from-prometheus` asks for, unless a checkpoint restored the rules'
/// state (which wins over history). A configuration that cannot be used is said in the log,
/// and the service starts cold.
fn warm_start(config: &ServeConfig, wiring: &Wiring, restored: bool) -> Option<history::warm::WarmStart> {
    match config.warm_start() {
        Ok(Some(_)) if restored => {
            tracing::info!("the checkpoint restored the rules' state: no warm start");
            None
        }
        // The families live samples are kinded by, and the service's stop.
        Ok(warm) => warm.map(|w| history::warm::WarmStart {
            families: wiring.families.clone(),
            stop: Some(wiring.stop.clone()),
            ..w
        }),
        Err(e) => {
            tracing::error!(error = %e, "no warm start");
            None
        }
    }
}

async fn kafka_consumer(config: &ServeConfig) -> Result<Option<Arc<rdkafka::consumer::StreamConsumer>>, ServiceError> {
    let Some(brokers) = &config.kafka_brokers else { return Ok(None) };
    if config.kafka_create_topics {
        let topics: Vec<String> = config.topics.values().cloned().collect();
        kafka::ensure_topics(brokers, &topics, 1, &config.kafka_options).await.map_err(ServiceError::KafkaTopics)?;
    }
    let consumer = kafka::consumer(brokers, &config.kafka_group, &config.kafka_options)
        .map_err(|e| ServiceError::KafkaConsumer(e.into()))?;
    Ok(Some(Arc::new(consumer)))
}

/// The alert writer, the dead-letter writer and the webhook worker.
fn spawn_writers(
    config: &ServeConfig,
    w: &Wiring,
    consumer: Option<Arc<rdkafka::consumer::StreamConsumer>>,
    alerts: mpsc::Receiver<engine_loop::Output>,
    dead: mpsc::Receiver<store::DeadLetter>,
    external_url: &str,
    settled: Option<std::sync::mpsc::Sender<writer::Settled>>,
) -> Result<tokio::task::JoinHandle<()>, ServiceError> {
    let spool = spool::Spool::open(&config.spool_dir, config.spool_max_mb.saturating_mul(1 << 20))
        .map_err(|source| ServiceError::Spool { dir: config.spool_dir.clone(), source })?;
    let writer = tokio::spawn(writer::write_alerts(
        alerts,
        writer::Writer {
            consumer,
            store: w.store.clone(),
            published: w.published.clone(),
            webhook: config.webhook_url.as_ref().map(|_| external_url.to_string()),
            wake: w.webhook_wake.clone(),
            telemetry: w.telemetry.clone(),
            health: w.health.clone(),
            engine_health: w.engine_health.clone(),
            spool,
            ingest_log: Some(config.ingest_log_dir.clone()),
            settled,
        },
    ));
    tokio::spawn(writer::write_dead_letters(dead, w.store.clone(), w.telemetry.clone(), config.max_dead_letters));
    if let Some(url) = &config.webhook_url {
        let settings = config.webhook();
        let client = reqwest::Client::builder().timeout(settings.timeout).build().map_err(ServiceError::Webhook)?;
        let deliverer = webhook::Deliverer {
            store: w.store.clone(),
            url: url.clone(),
            client,
            wake: w.webhook_wake.clone(),
            telemetry: w.telemetry.clone(),
            settings,
            shared: config.kafka_join_group,
        };
        tokio::spawn(deliverer.run(w.stop.clone()));
        tracing::info!(url = %redact(url), "delivering alerts to the webhook");
    }
    if !config.alertmanager_url.is_empty() {
        let client =
            reqwest::Client::builder().timeout(config.alertmanager_timeout).build().map_err(ServiceError::Webhook)?;
        let notifier = alertmanager::Notifier {
            settings: alertmanager::Settings {
                urls: config.alertmanager_url.clone(),
                resend_delay: config.alertmanager_resend_delay,
                external_labels: config.alertmanager_external_labels.clone(),
                external_url: external_url.to_string(),
            },
            silences: w.silences.clone(),
            store: w.store.clone(),
            published: w.published.subscribe(),
            telemetry: w.telemetry.clone(),
            client,
            owned_partitions: w.owned_partitions.clone(),
        };
        tokio::spawn(notifier.run(w.stop.clone()));
        let urls: Vec<String> = config.alertmanager_url.iter().map(|u| redact(u)).collect();
        tracing::info!(alertmanagers = ?urls, "sending alerts to Alertmanager");
    }
    Ok(writer)
}

/// Kafka, the replayed files, HTTP ingest's thread, and the engine's ticks. Returns the ticker
/// and the way into HTTP ingest.
fn spawn_sources(
    config: &ServeConfig,
    w: &Wiring,
    consumer: Option<Arc<rdkafka::consumer::StreamConsumer>>,
    resume: &[Position],
) -> Result<(tokio::task::JoinHandle<()>, mpsc::Sender<sources::http::Batch>), ServiceError> {
    if let Some(consumer) = consumer {
        let source = sources::kafka::KafkaSource {
            topics: stream_topics(config),
            formats: config.topic_formats.clone(),
            collectors: config.host_mapping(),
            start: resume.to_vec(),
            engine: w.engine.clone(),
            dead: w.dead.clone(),
            intake: w.intake.clone(),
            overload: config.overload,
            shed: w.telemetry.shed.with_label_values(&["kafka"]),
            telemetry: w.telemetry.clone(),
        };
        tokio::spawn(sources::kafka::consume(consumer.clone(), source, w.stop.clone()));
        tokio::spawn(sources::kafka::report_lag(consumer, w.telemetry.clone(), w.stop.clone()));
    }
    let ticker = tokio::spawn(engine_loop::tick(w.engine.clone()));
    for file in &config.replay {
        let hosts = config.host_mapping();
        sources::file::replay(file.clone(), resume, w.intake.clone(), hosts, w.engine.clone(), w.dead.clone());
        tracing::info!(file = %file.display(), "replaying into the service");
    }
    let (ingest_tx, ingest_rx) = mpsc::channel(256);
    sources::http::HttpSource {
        dir: config.ingest_log_dir.clone(),
        fsync: config.ingest_fsync,
        replay_from: sources::http::replay_from(resume),
        engine: w.engine.clone(),
        overload: config.overload,
        shed: w.telemetry.shed.with_label_values(&["http"]),
        telemetry: w.telemetry.clone(),
        catalog: w.intake.catalog.get(),
    }
    .spawn(ingest_rx)
    .map_err(|source| ServiceError::IngestLog { dir: config.ingest_log_dir.clone(), source })?;
    Ok((ticker, ingest_tx))
}

/// Completes on SIGINT or SIGTERM, once it has told the service through `stop`.
async fn said_on_signal(stop: Arc<watch::Sender<bool>>) {
    shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = stop.send(true);
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
