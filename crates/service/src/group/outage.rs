//! The store as the member's loop uses it while it runs: one attempt at a time, never waited
//! on. While the store cannot be written, a keyed partition keeps its alerts in memory and its
//! checkpoint waits (a checkpoint must not claim alerts that are not stored); Kafka is polled
//! as before, so the member keeps its partitions. Nothing is lost if the member dies then: its
//! partitions' last checkpoints are from before the alerts it held, and the next owners derive
//! them again from the keyed topic.

use super::keyed::KeyedPartition;
use super::{count, Looping, Shared};
use crate::backoff::Backoff;
use crate::store::Store;
use crate::telemetry::{InternalEvent, StoreFailed, Telemetry};
use rdkafka::consumer::Consumer;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one attempt may take (a store that does not answer, rather than refuses): long
/// enough for a large checkpoint on a healthy but busy store.
const ATTEMPT: Duration = Duration::from_secs(60);
/// While the store fails, each try begins with a ping that may take this long, so that the
/// loop never stands still for long waiting on a store that is down (a member that stands still
/// holds back its partitions' idleness).
const PROBE: Duration = Duration::from_millis(300);
/// The wait after a first failure; it doubles, up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(5);

/// When the store may be tried again.
#[derive(Default)]
pub struct StoreGate(Mutex<Failing>);

struct Failing {
    /// Since when the store fails, and when to try it next.
    since: Option<Instant>,
    next: Option<Instant>,
    backoff: Backoff,
}

impl Default for Failing {
    fn default() -> Self {
        Failing { since: None, next: None, backoff: Backoff::new(FIRST_WAIT, MAX_WAIT) }
    }
}

impl StoreGate {
    /// Whether the store failed last time and its wait is not over.
    pub fn closed(&self) -> bool {
        self.0.lock().expect("gate").next.is_some_and(|t| Instant::now() < t)
    }

    /// One attempt of `op`, unless the gate is closed, or the store failed last time and does
    /// not answer a ping now; none when it was not made or failed.
    pub fn attempt<T, E: std::fmt::Display>(
        &self,
        runtime: &tokio::runtime::Handle,
        telemetry: &Telemetry,
        store: &Store,
        what: &'static str,
        op: impl std::future::Future<Output = Result<T, E>>,
    ) -> Option<T> {
        if self.closed() {
            return None;
        }
        if self.0.lock().expect("gate").since.is_some() {
            let probe = runtime.block_on(async { tokio::time::timeout(PROBE, store.ping()).await });
            if let Err(e) =
                probe.map_err(|_| "no answer to a ping".to_string()).and_then(|r| r.map_err(|e| e.to_string()))
            {
                self.failed(telemetry, what, &e);
                return None;
            }
        }
        let outcome = runtime.block_on(async { tokio::time::timeout(ATTEMPT, op).await });
        match outcome {
            Ok(Ok(v)) => {
                let mut failing = self.0.lock().expect("gate");
                if let Some(since) = failing.since.take() {
                    tracing::info!(
                        ms = since.elapsed().as_millis() as u64,
                        "the store is back: held alerts are stored, then checkpoints go on"
                    );
                }
                *failing = Failing::default();
                Some(v)
            }
            Ok(Err(e)) => {
                self.failed(telemetry, what, &e.to_string());
                None
            }
            Err(_) => {
                self.failed(telemetry, what, &format!("no answer in {} s", ATTEMPT.as_secs()));
                None
            }
        }
    }

    /// A try failed: the gate closes for a while, longer after each failure.
    fn failed(&self, telemetry: &Telemetry, what: &'static str, error: &str) {
        StoreFailed { operation: what, error: &error }.emit(telemetry);
        let mut failing = self.0.lock().expect("gate");
        if failing.since.is_none() {
            failing.since = Some(Instant::now());
            tracing::warn!(
                "the store cannot be written: keyed partitions hold their alerts and their checkpoints wait; input \
                 goes on"
            );
        }
        failing.next = Some(Instant::now() + failing.backoff.failed());
    }
}

/// What became of a checkpoint.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Saved {
    Yes,
    /// Another instance owns the partition now.
    Fenced,
    /// Not stored now (the store fails, or its alerts are not stored yet): it is tried again.
    Later,
}

impl Shared {
    /// Stores a keyed partition's checkpoint, unless alerts it raised are not stored yet (the
    /// checkpoint would have them raised): one attempt, none while the store fails.
    pub(super) fn save(&self, p: &mut KeyedPartition) -> Saved {
        if !p.out.is_empty() || self.gate.closed() {
            return Saved::Later;
        }
        let checkpoint = p.checkpoint();
        count(&self.telemetry, p.tally());
        let checkpoint = match checkpoint {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(partition = p.fence.partition, error = %e, "cannot snapshot the partition");
                return Saved::Later;
            }
        };
        let now = vigil_engine::event::now_ms();
        let op = self.store.save_partition_checkpoint(&p.fence, &checkpoint, now);
        match self.gate.attempt(&self.runtime, &self.telemetry, &self.store, "save_partition_checkpoint", op) {
            None => Saved::Later,
            Some(true) => Saved::Yes,
            Some(false) => {
                self.telemetry.group.fenced.inc();
                tracing::warn!(
                    partition = p.fence.partition,
                    epoch = p.fence.epoch,
                    "another instance owns the partition now: its checkpoint is not stored"
                );
                Saved::Fenced
            }
        }
    }
}

impl Looping {
    /// Stores a partition's alerts while it holds the partition; false when another instance
    /// owns it now (its alerts are that instance's to store). While the store fails, the
    /// partition holds them and they are tried again in a later round.
    pub(super) fn store_alerts(&self, p: &mut KeyedPartition) -> bool {
        let ctx = self.input.context();
        if p.out.is_empty() || ctx.gate.closed() {
            return true;
        }
        let now = vigil_engine::event::now_ms();
        for a in p.out.iter_mut() {
            a.detected_at = now;
        }
        let url = self.m.webhook.clone();
        let payload = move |a: &vigil_engine::alert::Alert| {
            crate::webhook::alertmanager_payload(a, url.as_deref().unwrap_or_default()).to_string()
        };
        let webhook: Option<&(dyn Fn(&vigil_engine::alert::Alert) -> String + Sync)> = match self.m.webhook {
            Some(_) => Some(&payload),
            None => None,
        };
        let op = self.m.store.insert_alerts_fenced(&p.fence, &p.out, webhook);
        let Some(stored) = ctx.gate.attempt(&ctx.runtime, &self.m.telemetry, &self.m.store, "insert_alerts", op) else {
            return true;
        };
        p.out.clear();
        let Some(stored) = stored else { return false };
        for s in stored {
            if s.alert.status == vigil_engine::alert::Status::Firing {
                self.m.telemetry.alerts.with_label_values(&[&s.alert.rule, &s.alert.severity]).inc();
            }
            let _ = self.m.published.send(Arc::new(s));
        }
        self.m.wake.notify_one();
        true
    }
}
