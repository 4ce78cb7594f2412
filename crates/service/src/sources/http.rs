//! The HTTP ingest source: the thread between `POST /api/v1/events` and the engine.
//!
//! A request's events reach the engine only through here, in the order they are written to
//! the [ingest log](crate::ingest_log): the thread takes every request waiting, writes
//! them all, flushes the log to disk once (a group commit), then hands their events to the
//! engine with their log offsets and answers each request. So an answer means the events are
//! on disk, and a checkpoint that covers offset n covers every event before it: after a crash
//! the log is read on from the checkpoint's offset, before any new request.

use super::Position;
use crate::config::Overload;
use crate::engine_loop::Input;
use crate::ingest_log::{self, IngestLog};
use crate::telemetry::IngestLogFailed;
use axum::body::Bytes;
use std::ops::Range;
use std::path::PathBuf;
use tokio::sync::{mpsc, oneshot};
use vigil_engine::event::Event;

pub use crate::position::HTTP_SOURCE as SOURCE;

/// Requests written together at most, so that one flush does not wait on a long queue.
const GROUP: usize = 64;

/// One ingest request's events, to be logged and handed to the engine.
pub struct Batch {
    pub body: Bytes,
    /// Each event with the range of its line in `body`.
    pub events: Vec<(Range<usize>, Event)>,
    pub reply: oneshot::Sender<Logged>,
}

/// What became of a [`Batch`].
pub enum Logged {
    /// On disk, and on its way to the engine; the receiver gives how many were late once the
    /// engine has taken them.
    Taken(oneshot::Receiver<u64>),
    /// Dropped whole under the `shed` overload policy: the engine's queue had no room.
    Shed,
    /// The log could not be written; nothing of the batch was taken.
    Failed(String),
}

/// The thread's settings.
pub struct HttpSource {
    pub dir: PathBuf,
    pub fsync: bool,
    /// The next log offset the restored checkpoint has not covered.
    pub replay_from: u64,
    pub engine: mpsc::Sender<Input>,
    pub overload: Overload,
    pub shed: prometheus::IntCounter,
    pub telemetry: std::sync::Arc<crate::telemetry::Telemetry>,
    /// The streams the log's lines may be of: those of the rules at the start.
    pub catalog: vigil_lang::schema::Catalog,
}

impl HttpSource {
    /// Opens the log (an error here stops the service from starting) and starts the thread,
    /// which first hands the engine what the log holds past the checkpoint.
    pub fn spawn(self, rx: mpsc::Receiver<Batch>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let log = IngestLog::open(&self.dir, self.replay_from, self.fsync)?;
        std::thread::Builder::new().name("vigil-ingest".into()).spawn(move || self.run(log, rx))
    }

    fn run(self, mut log: IngestLog, mut rx: mpsc::Receiver<Batch>) {
        if !self.replay() {
            return;
        }
        while let Some(first) = rx.blocking_recv() {
            let mut group = vec![first];
            while group.len() < GROUP {
                match rx.try_recv() {
                    Ok(b) => group.push(b),
                    Err(_) => break,
                }
            }
            let mut room = self.engine.capacity();
            let mut taken = Vec::with_capacity(group.len());
            for batch in group {
                // Shed whole requests, before they are logged: a logged event is processed,
                // after a crash too.
                let needs = batch.events.len() + 1;
                if self.overload == Overload::Shed && needs > room {
                    self.shed.inc_by(batch.events.len() as u64);
                    let _ = batch.reply.send(Logged::Shed);
                    continue;
                }
                room = room.saturating_sub(needs);
                taken.push(batch);
            }
            let written = taken
                .iter()
                .map(|b| log.append(b.events.iter().map(|(range, _)| &b.body[range.clone()])))
                .collect::<std::io::Result<Vec<u64>>>()
                .and_then(|firsts| log.commit().map(|()| firsts));
            let firsts = match written {
                Ok(firsts) => firsts,
                Err(e) => {
                    self.telemetry.emit(IngestLogFailed { dir: &self.dir, error: &e });
                    for b in taken {
                        let _ = b.reply.send(Logged::Failed(format!("cannot write the ingest log: {e}")));
                    }
                    // What was written of the group is not acknowledged; start the next on a
                    // clean record boundary.
                    match IngestLog::open(&self.dir, log.next_offset(), self.fsync) {
                        Ok(reopened) => log = reopened,
                        Err(e) => tracing::error!(error = %e, "cannot reopen the ingest log"),
                    }
                    continue;
                }
            };
            for (batch, first) in taken.into_iter().zip(firsts) {
                let (late_tx, late_rx) = oneshot::channel();
                let _ = batch.reply.send(Logged::Taken(late_rx));
                for (i, (_, event)) in batch.events.into_iter().enumerate() {
                    if self.engine.blocking_send(Input::Ingested(event, first + i as u64)).is_err() {
                        return;
                    }
                }
                if self.engine.blocking_send(Input::Ack(late_tx)).is_err() {
                    return;
                }
            }
        }
    }

    /// Hands the engine what the log holds from the checkpoint on; false when the engine is
    /// gone.
    fn replay(&self) -> bool {
        let records = match ingest_log::read_from(&self.dir, self.replay_from) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, dir = %self.dir.display(), "cannot read the ingest log");
                return true;
            }
        };
        let mut n = 0u64;
        let mut decoder = vigil_engine::event::LineDecoder::new(self.catalog.clone());
        for (offset, line) in records {
            let event = decoder.decode_bytes(&line, None).map_err(|e| e.to_string());
            match event {
                Ok(e) => {
                    if self.engine.blocking_send(Input::Ingested(e, offset)).is_err() {
                        return false;
                    }
                    n += 1;
                }
                // Only events were logged; a line that does not decode is damage.
                Err(e) => tracing::error!(offset, error = %e, "an ingest log record is not an event; skipped"),
            }
        }
        if n > 0 {
            // The end of what was read back, as an `Ack` ends a request's events: until it
            // comes, the engine holds time ([`crate::engine_loop`]).
            let (done, _) = oneshot::channel();
            if self.engine.blocking_send(Input::Ack(done)).is_err() {
                return false;
            }
            tracing::info!(
                events = n,
                from = self.replay_from,
                "acknowledged HTTP events read back from the ingest log"
            );
        }
        true
    }
}

/// Where the checkpoint in `positions` left the ingest log.
pub fn replay_from(positions: &[Position]) -> u64 {
    super::resume_offset(positions, SOURCE).and_then(|o| u64::try_from(o).ok()).unwrap_or(0)
}
