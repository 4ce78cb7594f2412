//! `vigil serve`: the engine as a service between Kafka (or HTTP ingest, or a recorded file) and
//! the people on call, with alerts stored in PostgreSQL or SQLite, pushed to a webhook and
//! tailed over HTTP.
//!
//! ```text
//! Kafka / POST /api/v1/events / --replay --> engine thread --> alert writer --> store
//!                                                                   |--> SSE clients
//!                                                                   '--> webhook outbox --> receiver
//! ```

pub mod api;
pub mod config;
pub mod engine_loop;
pub mod ingest_log;
pub mod kafka;
pub mod position;
pub mod rules;
pub mod server;
pub mod sources;
pub mod spool;
pub mod store;
pub mod telemetry;
pub mod webhook;
pub mod writer;

use anyhow::{anyhow, Context, Result};
use config::ServeConfig;
use engine_loop::{EngineHealth, EngineLoop};
use sources::Intake;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch, Notify, Semaphore};

/// Alert stream clients catching up from the store at once.
const CATCH_UP_READS: usize = 4;

/// Runs the service until SIGINT or SIGTERM.
pub async fn serve(config: ServeConfig) -> Result<()> {
    let telemetry = Arc::new(telemetry::Telemetry::new());
    let store = store::Store::connect(&config.database_url)
        .await
        .with_context(|| format!("cannot open the store at {}", redact(&config.database_url)))?;
    // Taken before the rules are read: a change after this point is seen by the watcher even if
    // it lands before the watcher starts.
    let fingerprint = rules::fingerprint(&config.rules);
    let loaded = rules::load(&config.rules)
        .and_then(|set| set.checked())
        .map_err(|e| anyhow!("the rules in {}: {e}", config.rules.display()))?;
    let plans = loaded.plans();
    tracing::info!(rules = plans.len(), folder = %config.rules.display(), "rules loaded");
    let mut engine = crate::engine::Engine::new(
        plans,
        crate::engine::EngineConfig {
            lateness_ms: config.lateness_ms(),
            limits: crate::engine::Limits {
                max_keys: config.max_keys_per_rule,
                idle_ms: config::millis(config.idle_timeout),
            },
            // Event time never runs ahead of the wall clock: no event can make the present late.
            clock: Some(Arc::new(crate::engine::SystemClock)),
        },
    );
    // Resume where the last checkpoint left off; Kafka, files and the ingest log resume from
    // the positions stored with it.
    let mut resume: Vec<position::Position> = Vec::new();
    match store.load_checkpoint().await.context("cannot read the checkpoint")? {
        None => tracing::info!("no checkpoint: starting empty"),
        Some((bytes, positions)) => {
            resume = serde_json::from_str(&positions).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the checkpoint's positions cannot be read; starting from the committed ones");
                Vec::new()
            });
            match crate::engine::Snapshot::from_bytes(&bytes).map_err(|e| e.to_string()).and_then(|s| engine.restore(s))
            {
                Ok(restored) => {
                    tracing::info!(rules = restored.len(), positions = %positions, "state restored from the checkpoint")
                }
                Err(e) => tracing::warn!(error = %e, "the checkpoint cannot be used; starting empty"),
            }
        }
    }
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.http_addr))?;
    let addr = listener.local_addr()?;
    let external_url = config.external_url.clone().unwrap_or_else(|| format!("http://{addr}"));

    let (tx, rx, alerts_tx, alerts_rx) = engine_loop::channels();
    let (dead_tx, dead_rx) = mpsc::channel(1024);
    let (ingest_tx, ingest_rx) = mpsc::channel(256);
    let (published, _) = broadcast::channel(4096);
    let (stop_tx, stop_rx) = watch::channel(false);
    let health = Arc::new(writer::Health::default());
    let engine_health = Arc::new(EngineHealth::default());
    let webhook_wake = Arc::new(Notify::new());
    let nonzero = |d: Duration| (!d.is_zero()).then(|| config::millis(d));
    let intake = Intake {
        bounds: crate::event::TimeBounds {
            max_future_ms: nonzero(config.max_event_future),
            max_jump_ms: nonzero(config.max_event_jump),
        },
        health: engine_health.clone(),
    };

    let consumer = match &config.kafka_brokers {
        Some(brokers) => {
            if config.kafka_create_topics {
                let topics: Vec<String> = config.topics.values().cloned().collect();
                kafka::ensure_topics(brokers, &topics, 1, &config.kafka_options)
                    .await
                    .context("cannot create the Kafka topics")?;
            }
            Some(Arc::new(
                kafka::consumer(brokers, &config.kafka_group, &config.kafka_options)
                    .context("cannot create the Kafka consumer")?,
            ))
        }
        None => None,
    };
    let engine_thread = EngineLoop {
        engine,
        telemetry: telemetry.clone(),
        health: engine_health.clone(),
        checkpoint_every: config.checkpoint_interval,
        restored: resume.clone(),
        max_state_bytes: config.max_state_bytes(),
    }
    .spawn(rx, alerts_tx);
    tokio::spawn(engine_health.clone().watch(config.stall_timeout));
    let spool = spool::Spool::open(&config.spool_dir, config.spool_max_mb.saturating_mul(1 << 20))
        .with_context(|| format!("cannot read the spool in {}", config.spool_dir.display()))?;
    let writer = tokio::spawn(writer::write_alerts(
        alerts_rx,
        writer::Writer {
            consumer: consumer.clone(),
            store: store.clone(),
            published: published.clone(),
            webhook: config.webhook_url.as_ref().map(|_| external_url.clone()),
            wake: webhook_wake.clone(),
            telemetry: telemetry.clone(),
            health: health.clone(),
            spool,
            ingest_log: Some(config.ingest_log_dir.clone()),
        },
    ));
    tokio::spawn(writer::write_dead_letters(dead_rx, store.clone(), telemetry.clone(), config.max_dead_letters));

    if let Some(url) = &config.webhook_url {
        let settings = config.webhook();
        let client =
            reqwest::Client::builder().timeout(settings.timeout).build().context("cannot build the webhook client")?;
        let deliverer = webhook::Deliverer {
            store: store.clone(),
            url: url.clone(),
            client,
            wake: webhook_wake.clone(),
            telemetry: telemetry.clone(),
            settings,
        };
        tokio::spawn(deliverer.run(stop_rx.clone()));
        tracing::info!(url = %redact(url), "delivering alerts to the webhook");
    }

    if let Some(consumer) = consumer {
        let source = sources::kafka::KafkaSource {
            topics: config.topics.clone(),
            start: resume.clone(),
            engine: tx.clone(),
            dead: dead_tx.clone(),
            intake: intake.clone(),
            overload: config.overload,
            shed: telemetry.shed.with_label_values(&["kafka"]),
        };
        tokio::spawn(sources::kafka::consume(consumer.clone(), source, stop_rx.clone()));
        tokio::spawn(sources::kafka::report_lag(consumer, telemetry.clone(), stop_rx.clone()));
    }

    let ticker = tokio::spawn(engine_loop::tick(tx.clone()));
    for file in &config.replay {
        sources::file::replay(file.clone(), &resume, intake.clone(), tx.clone(), dead_tx.clone());
        tracing::info!(file = %file.display(), "replaying into the service");
    }
    sources::http::HttpSource {
        dir: config.ingest_log_dir.clone(),
        fsync: config.ingest_fsync,
        replay_from: sources::http::replay_from(&resume),
        engine: tx.clone(),
        overload: config.overload,
        shed: telemetry.shed.with_label_values(&["http"]),
        errors: telemetry.store_errors.with_label_values(&["ingest_log"]),
    }
    .spawn(ingest_rx)
    .with_context(|| format!("cannot open the ingest log in {}", config.ingest_log_dir.display()))?;

    let live_rules = Arc::new(rules::LiveRules::new(config.rules.clone(), &loaded, tx.clone(), telemetry.clone()));
    drop(tx);
    let state = Arc::new(api::AppState {
        store,
        ingest: ingest_tx,
        intake,
        dead: dead_tx,
        published,
        telemetry: telemetry.clone(),
        rules: live_rules.clone(),
        token: config.api_token.clone(),
        read_token: config.api_read_token.clone(),
        health,
        engine_health,
        webhook_wake,
        limits: api::Limits {
            body_timeout: config.http_body_timeout,
            stream_clients: Arc::new(Semaphore::new(config.max_stream_clients)),
            catch_up: Arc::new(Semaphore::new(CATCH_UP_READS)),
            stall_timeout: config.stall_timeout,
        },
    });
    tokio::spawn(live_rules.watch(fingerprint, stop_rx.clone()));

    let limits = server::ServerLimits {
        max_connections: server::connections_that_fit(config.max_connections),
        header_timeout: config.http_header_timeout,
        write_timeout: config.http_body_timeout,
    };
    // Tests and scripts read this line to find a port chosen by the system (`--http-addr 127.0.0.1:0`).
    eprintln!("vigil: listening on http://{addr}");
    tracing::info!(%addr, store = ?state.store.backend(), kafka = config.kafka_brokers.is_some(), "serving");
    server::serve(listener, api::router(state.clone()), limits, telemetry, shutdown_signal()).await;

    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    ticker.abort();
    drop(state);
    // The engine ends when every input is closed; the writer then stores what is left.
    let _ =
        tokio::time::timeout(Duration::from_secs(5), tokio::task::spawn_blocking(move || engine_thread.join())).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), writer).await;
    Ok(())
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

/// A URL for messages: without the password of its credentials, and without its query (where
/// webhook receivers often take a token).
pub fn redact(url: &str) -> String {
    let url = match url.split_once('?') {
        Some((base, _)) => return redact(base) + "?***",
        None => url,
    };
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Text with every URL in it redacted, as [`redact`] does one: for error messages from
/// libraries that quote the URL they failed on.
pub fn redact_urls(text: &str) -> String {
    text.split(' ')
        .map(|word| match word.find("://") {
            Some(at) if at > 0 => {
                let start = word[..at].rfind(|c: char| !c.is_ascii_alphanumeric() && c != '+').map_or(0, |i| i + 1);
                let end = word[at..].find(['"', '\'', ')', '>']).map_or(word.len(), |i| at + i);
                format!("{}{}{}", &word[..start], redact(&word[start..end]), &word[end..])
            }
            _ => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_inside_messages_are_redacted() {
        assert_eq!(
            super::redact_urls("error sending request for url (https://h/x?token=abc): refused"),
            "error sending request for url (https://h/x?***): refused"
        );
        assert_eq!(super::redact_urls("no url here"), "no url here");
        assert_eq!(super::redact_urls("\"postgres://u:pw@db/x\" down"), "\"postgres://u:***@db/x\" down");
    }

    #[test]
    fn secrets_stay_out_of_messages() {
        assert_eq!(super::redact("postgres://vigil:s3cret@db:5432/vigil"), "postgres://vigil:***@db:5432/vigil");
        assert_eq!(super::redact("https://hooks.example/x?token=abc"), "https://hooks.example/x?***");
        assert_eq!(super::redact("https://u:p@h/x?t=1"), "https://u:***@h/x?***");
        assert_eq!(super::redact("sqlite://vigil.db"), "sqlite://vigil.db");
    }
}
