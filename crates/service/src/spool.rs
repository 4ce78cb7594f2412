//! Alerts kept on disk while the store cannot take them.
//!
//! When a batch of alerts cannot be stored, the writer appends it to the spool file, one JSON
//! line per batch, flushed to disk before it moves on, so the engine keeps detecting through a
//! database outage and a crash meanwhile loses nothing. While the spool holds anything, new
//! batches go behind it, so alerts reach the store in the order they were raised. The spool is
//! bounded; when full, the writer stops taking batches and the engine and then the sources wait.
//! At start an existing spool is read back, and it is emptied into the store as soon as the
//! store answers. Stored alerts are idempotent by id and status, so a batch written twice (a
//! crash between storing a batch and truncating the spool) is stored once.
//!
//! A line is a JSON array of alerts, or, for a group member's keyed partition, an object with
//! the claim's `fence` and the `alerts`: such a batch is stored only while the claim holds
//! (after a restart it usually does not, and the partition's next owner raises them again).
//! The folder is locked while a spool is open, so two instances never share one.

use crate::store::Fence;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use vigil_engine::alert::Alert;

/// Alerts stored together; a keyed partition's carry its claim's fence.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum Batch {
    Alerts(Vec<Alert>),
    Fenced { fence: Fence, alerts: Vec<Alert> },
}

impl Batch {
    pub fn alerts(&self) -> &[Alert] {
        match self {
            Batch::Alerts(alerts) | Batch::Fenced { alerts, .. } => alerts,
        }
    }

    fn line(&self) -> serde_json::Result<String> {
        /// A fenced batch as its line has it.
        #[derive(serde::Serialize)]
        struct Fenced<'a> {
            fence: &'a Fence,
            alerts: &'a [Alert],
        }
        let mut line = match self {
            Batch::Alerts(alerts) => serde_json::to_string(alerts)?,
            Batch::Fenced { fence, alerts } => serde_json::to_string(&Fenced { fence, alerts })?,
        };
        line.push('\n');
        Ok(line)
    }
}

pub struct Spool {
    path: PathBuf,
    max_bytes: u64,
    /// Batches in the file, oldest first (they are also kept in memory to write them back).
    batches: Vec<Batch>,
    bytes: u64,
    file: Option<File>,
    /// Held open, locked, while the spool is: the lock goes with the process.
    _lock: File,
}

#[derive(Debug)]
pub enum SpoolError {
    /// Taking the batch would pass the size limit.
    Full,
    Io(std::io::Error),
    /// Another process has the folder's spool open.
    InUse(PathBuf),
}

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpoolError::Full => write!(f, "the spool is full"),
            SpoolError::Io(e) => write!(f, "{e}"),
            SpoolError::InUse(_) => {
                write!(f, "another running instance has it open: give each instance its own --spool-dir")
            }
        }
    }
}

/// Its text says the cause, so it has no source.
impl std::error::Error for SpoolError {}

impl Spool {
    /// Opens the spool in `dir`, reading back what an earlier run left there. A line that
    /// cannot be read (a crash in the middle of writing it) is reported and skipped: its
    /// batch was never acknowledged, and is raised again from the checkpoint.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Spool, SpoolError> {
        std::fs::create_dir_all(dir).map_err(SpoolError::Io)?;
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("alerts.spool.lock"));
        let lock = lock.map_err(SpoolError::Io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(SpoolError::InUse(dir.to_path_buf())),
            Err(std::fs::TryLockError::Error(e)) => return Err(SpoolError::Io(e)),
        }
        let path = dir.join("alerts.spool");
        let mut spool = Spool { path, max_bytes, batches: Vec::new(), bytes: 0, file: None, _lock: lock };
        spool.read_back().map_err(SpoolError::Io)?;
        Ok(spool)
    }

    fn read_back(&mut self) -> std::io::Result<()> {
        match File::open(&self.path) {
            Ok(f) => {
                for (n, line) in BufReader::new(f).lines().enumerate() {
                    let line = line?;
                    match serde_json::from_str::<Batch>(&line) {
                        Ok(batch) => self.batches.push(batch),
                        Err(e) => {
                            tracing::warn!(file = %self.path.display(), line = n + 1, error = %e, "unreadable spooled batch skipped")
                        }
                    }
                }
                // Written afresh, so that a torn last line does not run into the next one.
                self.rewrite()?;
                if !self.batches.is_empty() {
                    tracing::info!(alerts = self.alerts(), file = %self.path.display(), "alerts spooled by an earlier run");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn rewrite(&mut self) -> std::io::Result<()> {
        self.file = None;
        self.bytes = 0;
        if self.batches.is_empty() {
            return match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let fresh = self.path.with_extension("spool.new");
        let mut f = File::create(&fresh)?;
        for batch in &self.batches {
            let line = batch.line()?;
            self.bytes += line.len() as u64;
            f.write_all(line.as_bytes())?;
        }
        f.sync_all()?;
        std::fs::rename(&fresh, &self.path)
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Alerts waiting in the spool.
    pub fn alerts(&self) -> usize {
        self.batches.iter().map(|b| b.alerts().len()).sum()
    }

    /// Appends a batch, on disk before this returns. A batch not taken is handed back.
    pub fn push(&mut self, batch: Batch) -> Result<(), (SpoolError, Batch)> {
        let line = match batch.line() {
            Ok(line) => line,
            Err(e) => return Err((SpoolError::Io(e.into()), batch)),
        };
        // An empty spool always takes one batch, however big, so that progress is possible.
        if !self.batches.is_empty() && self.bytes + line.len() as u64 > self.max_bytes {
            return Err((SpoolError::Full, batch));
        }
        if let Err(e) = self.append(&line) {
            return Err((SpoolError::Io(e), batch));
        }
        self.bytes += line.len() as u64;
        self.batches.push(batch);
        Ok(())
    }

    fn append(&mut self, line: &str) -> std::io::Result<()> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            self.file = Some(OpenOptions::new().create(true).append(true).open(&self.path)?);
        }
        let file = self.file.as_mut().expect("opened above");
        file.write_all(line.as_bytes())?;
        file.sync_data()
    }

    /// The oldest batch, to be stored.
    pub fn front(&self) -> Option<&Batch> {
        self.batches.first()
    }

    /// Drops the oldest batch once it is stored; the file goes when the spool is empty.
    pub fn pop(&mut self) -> std::io::Result<()> {
        if !self.batches.is_empty() {
            self.batches.remove(0);
        }
        if self.batches.is_empty() {
            self.rewrite()?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A firing alert with id `id`, for tests.
    pub(crate) fn alert(id: &str) -> Alert {
        Alert {
            id: id.into(),
            rule: "r".into(),
            severity: "high".into(),
            status: vigil_engine::alert::Status::Firing,
            time: 1_000,
            starts_at: 1_000,
            ends_at: None,
            detected_at: 2_000,
            key: Default::default(),
            values: Default::default(),
            labels: Default::default(),
            annotations: Default::default(),
            evidence: Vec::new().into(),
        }
    }

    #[test]
    fn batches_survive_a_restart_in_order_and_the_limit_holds() {
        let dir = std::env::temp_dir().join(format!("vigil-spool-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let mut spool = Spool::open(&dir, 400).expect("open");
        spool.push(Batch::Alerts(vec![alert("a"), alert("b")])).expect("first batch always fits");
        let more = Batch::Alerts(vec![alert("c"); 3]);
        assert!(matches!(spool.push(more), Err((SpoolError::Full, back)) if back.alerts().len() == 3));
        drop(spool);
        // A torn last line, as a crash while writing leaves it.
        let mut f = OpenOptions::new().append(true).open(dir.join("alerts.spool")).expect("file");
        f.write_all(b"[{\"id\":").expect("write");
        drop(f);
        let mut again = Spool::open(&dir, 400).expect("reopen");
        assert_eq!(again.alerts(), 2);
        assert_eq!(again.front().map(|b| b.alerts()[1].id.clone()), Some("b".to_string()));
        assert_eq!(again.front().map(|b| b.alerts()[0].detected_at), Some(2_000));
        again.pop().expect("pop");
        assert!(again.is_empty());
        assert!(!dir.join("alerts.spool").exists());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_fenced_batch_comes_back_with_its_fence_and_the_folder_is_one_instance_s() {
        let dir = std::env::temp_dir().join(format!("vigil-spool-fenced-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let fence = Fence { group: "g".into(), partition: 3, epoch: 7 };
        let batch = Batch::Fenced { fence: fence.clone(), alerts: vec![alert("a")] };
        let mut spool = Spool::open(&dir, 1 << 20).expect("open");
        spool.push(Batch::Alerts(vec![alert("b")])).expect("push");
        spool.push(batch.clone()).expect("push");
        match Spool::open(&dir, 1 << 20) {
            Err(SpoolError::InUse(d)) => assert_eq!(d, dir),
            other => panic!("a second spool in the folder: {:?}", other.map(|s| s.alerts())),
        }
        drop(spool);
        let mut again = Spool::open(&dir, 1 << 20).expect("reopen once the first is closed");
        assert_eq!(again.front().map(Batch::alerts).map(|a| a[0].id.clone()), Some("b".to_string()));
        again.pop().expect("pop");
        assert_eq!(again.front(), Some(&batch));
        drop(again);
        std::fs::remove_dir_all(&dir).ok();
    }
}
