//! The file source: a recorded file fed into the running service (`--replay`).
//!
//! Each event carries its line number as its position, so checkpoints cover the file too: after
//! a restart the file is read on from the line after the last checkpointed one, and nothing of
//! it is read twice (nor counted late).

use super::{now_ms, Intake, Position};
use crate::engine_loop::Input;
use crate::store::DeadLetter;
use tokio::sync::mpsc;

/// The source name a replayed file's position is checkpointed under (Kafka topic names cannot
/// hold a `:`, so the two never mix).
pub fn source_name(path: &std::path::Path) -> String {
    format!("{}{}", crate::position::FILE_PREFIX, path.display())
}

/// Feeds a recorded file into the running service on a thread of its own, its collectors'
/// samples placed under hosts as `hosts` says (as from Kafka and HTTP), reporting malformed
/// lines (and times out of bounds) as dead letters.
pub fn replay(
    path: std::path::PathBuf,
    resume: &[Position],
    intake: Intake,
    hosts: vigil_formats::HostMapping,
    tx: mpsc::Sender<Input>,
    dead: mpsc::Sender<DeadLetter>,
) -> std::thread::JoinHandle<()> {
    let source = source_name(&path);
    let next_line = super::resume_offset(resume, &source).unwrap_or(0);
    std::thread::spawn(move || {
        let input = match vigil_formats::input::open(
            &path,
            vigil_formats::input::Format::Auto,
            &vigil_formats::input::InputOptions { catalog: intake.catalog.get(), hosts, ..Default::default() },
        ) {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "cannot replay");
                return;
            }
        };
        if next_line > 0 {
            tracing::info!(file = %path.display(), line = next_line, "replay resumes where the checkpoint left off");
        }
        let name = input.name.clone();
        let mut n = 0u64;
        for record in input.records.filter(|r| r.line as i64 >= next_line) {
            match record.event.and_then(|e| intake.check(&e).map(|()| e)) {
                Ok(e) => {
                    let position = Position { topic: source.clone(), partition: 0, offset: record.line as i64 };
                    if tx.blocking_send(Input::Event(e, Some(position))).is_err() {
                        return;
                    }
                    n += 1;
                }
                Err(e) => {
                    let _ = dead.blocking_send(DeadLetter {
                        source: "replay".into(),
                        topic: Some(name.clone()),
                        partition: None,
                        offset: None,
                        line: Some(record.line as i64),
                        reason: e.to_string(),
                        payload: String::new(),
                        received_at_ms: now_ms(),
                    });
                }
            }
        }
        tracing::info!(file = %name, events = n, "replay finished");
    })
}
