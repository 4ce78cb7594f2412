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

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use vigil_engine::alert::Alert;

pub struct Spool {
    path: PathBuf,
    max_bytes: u64,
    /// Batches in the file, oldest first (they are also kept in memory to write them back).
    batches: Vec<Vec<Alert>>,
    bytes: u64,
    file: Option<File>,
}

#[derive(Debug)]
pub enum SpoolError {
    /// Taking the batch would pass the size limit.
    Full,
    Io(std::io::Error),
}

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpoolError::Full => write!(f, "the spool is full"),
            SpoolError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl Spool {
    /// Opens the spool in `dir`, reading back what an earlier run left there. A line that
    /// cannot be read (a crash in the middle of writing it) is reported and skipped: its
    /// batch was never acknowledged, and is raised again from the checkpoint.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Spool> {
        let path = dir.join("alerts.spool");
        let mut spool = Spool { path, max_bytes, batches: Vec::new(), bytes: 0, file: None };
        match File::open(&spool.path) {
            Ok(f) => {
                for (n, line) in BufReader::new(f).lines().enumerate() {
                    let line = line?;
                    match serde_json::from_str::<Vec<Alert>>(&line) {
                        Ok(batch) => spool.batches.push(batch),
                        Err(e) => {
                            tracing::warn!(file = %spool.path.display(), line = n + 1, error = %e, "unreadable spooled batch skipped")
                        }
                    }
                }
                // Written afresh, so that a torn last line does not run into the next one.
                spool.rewrite()?;
                if !spool.batches.is_empty() {
                    tracing::info!(alerts = spool.alerts(), file = %spool.path.display(), "alerts spooled by an earlier run");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(spool)
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
            let line = serde_json::to_string(batch)? + "\n";
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
        self.batches.iter().map(Vec::len).sum()
    }

    /// Appends a batch, on disk before this returns. A batch not taken is handed back.
    pub fn push(&mut self, batch: Vec<Alert>) -> Result<(), (SpoolError, Vec<Alert>)> {
        let mut line = match serde_json::to_string(&batch) {
            Ok(line) => line,
            Err(e) => return Err((SpoolError::Io(e.into()), batch)),
        };
        line.push('\n');
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
    pub fn front(&self) -> Option<&[Alert]> {
        self.batches.first().map(Vec::as_slice)
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
mod tests {
    use super::*;

    fn alert(id: &str) -> Alert {
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
        spool.push(vec![alert("a"), alert("b")]).expect("first batch always fits");
        assert!(matches!(spool.push(vec![alert("c"); 3]), Err((SpoolError::Full, back)) if back.len() == 3));
        drop(spool);
        // A torn last line, as a crash while writing leaves it.
        let mut f = OpenOptions::new().append(true).open(dir.join("alerts.spool")).expect("file");
        f.write_all(b"[{\"id\":").expect("write");
        drop(f);
        let mut again = Spool::open(&dir, 400).expect("reopen");
        assert_eq!(again.alerts(), 2);
        assert_eq!(again.front().map(|b| b[1].id.clone()), Some("b".to_string()));
        assert_eq!(again.front().map(|b| b[0].detected_at), Some(2_000));
        again.pop().expect("pop");
        assert!(again.is_empty());
        assert!(!dir.join("alerts.spool").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
