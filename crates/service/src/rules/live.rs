//! The folder's rules, loaded, watched and changed through the API ([`LiveRules`]).

use crate::engine_loop::Input;
use crate::sources::SharedCatalog;
use crate::telemetry::{RulesChanged, Telemetry};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, oneshot, watch, Mutex};
use vigil_lang::ruleset::{self, RuleInfo, RuleSet, RuleSetError, RunningRule};

/// Why a change to the rules did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RuleChangeError {
    #[error(transparent)]
    Rules(#[from] RuleSetError),
    /// The engine is stopping: the change was not applied.
    #[error("the engine is stopping")]
    Stopping,
}

/// The rules of the service and what changes them.
pub struct LiveRules {
    dir: PathBuf,
    infos: RwLock<Vec<RuleInfo>>,
    /// Serialises changes, so that two cannot interleave their check and write.
    lock: Mutex<()>,
    engine: mpsc::Sender<Input>,
    telemetry: Arc<Telemetry>,
    /// The catalogue the sources decode with, which a reload changes.
    catalog: Arc<SharedCatalog>,
    /// The running rules and the streams they read, which a change may not take from them.
    running: RwLock<Vec<RunningRule>>,
}

impl LiveRules {
    pub fn new(
        dir: PathBuf,
        loaded: &RuleSet,
        engine: mpsc::Sender<Input>,
        telemetry: Arc<Telemetry>,
        catalog: Arc<SharedCatalog>,
    ) -> Self {
        LiveRules {
            dir,
            infos: RwLock::new(loaded.infos()),
            lock: Mutex::new(()),
            engine,
            telemetry,
            catalog,
            running: RwLock::new(loaded.running()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn running(&self) -> Vec<RunningRule> {
        self.running.read().map(|r| r.clone()).unwrap_or_default()
    }

    /// The loaded rules.
    pub fn infos(&self) -> Vec<RuleInfo> {
        self.infos.read().map(|r| r.clone()).unwrap_or_default()
    }

    /// Sets rule `name` to `text` (one rule of that name) if the whole folder still checks with
    /// it; returns the file written and the rules whose state was kept.
    pub async fn put(&self, name: &str, text: Vec<u8>) -> Result<(PathBuf, Vec<String>), RuleChangeError> {
        let _guard = self.lock.lock().await;
        let dir = self.dir.clone();
        let name = name.to_string();
        let running = self.running();
        let (after, path) = blocking(move || {
            let (after, path, content) = load(&dir)?.with_rule(&dir, &name, &text)?;
            after.keeps_streams_of(&running)?;
            let after = after.checked()?;
            ruleset::write_atomically(&path, Some(&content))?;
            Ok((after, path))
        })
        .await?;
        let kept = self.apply(after).await?;
        Ok((path, kept))
    }

    /// Removes rule `name` from its file if the other rules still check without it; returns
    /// the rules whose state was kept.
    pub async fn delete(&self, name: &str) -> Result<Vec<String>, RuleChangeError> {
        let _guard = self.lock.lock().await;
        let dir = self.dir.clone();
        let name = name.to_string();
        let running = self.running();
        let after = blocking(move || {
            if !ruleset::valid_name(&name) {
                return Err(RuleSetError::BadName(name));
            }
            let (after, path, content) = load(&dir)?.without_rule(&name)?;
            after.keeps_streams_of(&running)?;
            let after = after.checked()?;
            ruleset::write_atomically(&path, content.as_deref())?;
            Ok(after)
        })
        .await?;
        self.apply(after).await
    }

    /// Loads the folder again; when it checks, the engine runs it.
    pub async fn reload(&self) -> Result<Vec<String>, RuleChangeError> {
        let _guard = self.lock.lock().await;
        let dir = self.dir.clone();
        let running = self.running();
        let loaded = blocking(move || {
            let set = load(&dir)?;
            set.keeps_streams_of(&running)?;
            set.checked()
        })
        .await;
        match loaded {
            Ok(set) => self.apply(set).await,
            Err(e) => {
                self.telemetry.emit(RulesChanged::Rejected(&e));
                Err(e)
            }
        }
    }

    /// Hands a checked rule set to the engine and records it for the API.
    async fn apply(&self, set: RuleSet) -> Result<Vec<String>, RuleChangeError> {
        let (reply, wait) = oneshot::channel();
        self.engine.send(Input::Reload(set.plans(), reply)).await.map_err(|_| RuleChangeError::Stopping)?;
        let kept = wait.await.map_err(|_| RuleChangeError::Stopping)?;
        if let Ok(mut infos) = self.infos.write() {
            *infos = set.infos();
        }
        if let Ok(mut running) = self.running.write() {
            *running = set.running();
        }
        self.catalog.set(set.catalog());
        self.telemetry.emit(RulesChanged::Applied);
        Ok(kept)
    }

    /// Reloads when the folder changes (checked every second) or on SIGHUP, until `stop`. A
    /// folder that does not check leaves the running rules as they are.
    pub async fn watch(self: Arc<Self>, mut seen: Vec<FileStamp>, mut stop: watch::Receiver<bool>) {
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let hangup = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let hangup = std::future::pending::<()>();
            let forced = tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => false,
                _ = hangup => true,
                _ = stop.changed() => return,
            };
            let now = fingerprint(&self.dir);
            if now == seen && !forced {
                continue;
            }
            seen = now;
            match self.reload().await {
                Ok(kept) => tracing::info!(kept = ?kept, "rules reloaded"),
                Err(RuleChangeError::Stopping) => return,
                // Reported as it happened.
                Err(_) => {}
            }
        }
    }
}

/// The folder's rule set.
pub fn load(dir: &Path) -> Result<RuleSet, RuleSetError> {
    RuleSet::load(&[dir.to_path_buf()])
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RuleSetError> + Send + 'static,
) -> Result<T, RuleChangeError> {
    tokio::task::spawn_blocking(work).await.map_err(|_| RuleChangeError::Stopping)?.map_err(Into::into)
}

/// A rule file's name, size and modification time.
pub type FileStamp = (PathBuf, u64, Option<SystemTime>);

/// What changes when a rule file changes: names, sizes and modification times.
pub fn fingerprint(dir: &Path) -> Vec<FileStamp> {
    vigil_lang::ruleset::files_under(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let meta = std::fs::metadata(&p).ok();
            let len = meta.as_ref().map_or(0, |m| m.len());
            let modified = meta.and_then(|m| m.modified().ok());
            (p, len, modified)
        })
        .collect()
}
