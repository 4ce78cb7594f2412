//! The store as the member's loop asks it who owns what (claims, epochs): one attempt at a
//! time, never waited on. While the store fails, claims wait and Kafka is polled as before, so
//! the member keeps the partitions it has. (Alerts and checkpoints go through the writer, and
//! its spool, as a single instance's do.)

use crate::backoff::Backoff;
use crate::store::Store;
use crate::telemetry::{InternalEvent, StoreFailed, Telemetry};
use crate::writer::Health;
use std::sync::atomic::Ordering;
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
pub struct StoreGate {
    failing: Mutex<Failing>,
    /// The writer's view of the store: while its writes fail, an attempt begins with a ping, as
    /// after a failure of the gate's own, so that the loop does not wait out a connection
    /// timeout on a store the writer already finds down.
    writer: Arc<Health>,
}

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
    pub fn new(writer: Arc<Health>) -> StoreGate {
        StoreGate { failing: Mutex::default(), writer }
    }

    /// Whether the store failed last time and its wait is not over.
    pub fn closed(&self) -> bool {
        self.failing.lock().expect("gate").next.is_some_and(|t| Instant::now() < t)
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
        let failing = self.failing.lock().expect("gate").since.is_some();
        if failing || self.writer.failing.load(Ordering::Relaxed) {
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
                let mut failing = self.failing.lock().expect("gate");
                if let Some(since) = failing.since.take() {
                    tracing::info!(
                        ms = since.elapsed().as_millis() as u64,
                        "the store is back: partitions waiting for their claims are claimed"
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
        let mut failing = self.failing.lock().expect("gate");
        if failing.since.is_none() {
            failing.since = Some(Instant::now());
            tracing::warn!(
                "the store cannot be reached: partitions assigned here wait for their claims; input goes on"
            );
        }
        failing.next = Some(Instant::now() + failing.backoff.failed());
    }
}
