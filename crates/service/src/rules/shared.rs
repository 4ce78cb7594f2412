//! One rule set for a group. The store keeps the group's rule set (its files, a version and a
//! digest); every instance runs it:
//!
//! - an instance that starts where the group has no rule set publishes its folder's;
//! - an instance whose folder differs from the group's, and that did not change it itself
//!   since it last ran the group's (it has just started, or another instance changed them),
//!   writes the group's files into its folder and runs them;
//! - a change made on an instance (a `PUT` or `DELETE` through the API, a file edited in its
//!   folder) is published once the folder checks, if the group's version is still the one the
//!   instance ran; otherwise the other change came first and this one is replaced by it;
//! - an instance that cannot run the group's rules (they do not check here, as on an older
//!   Vigil, or its folder cannot be written) does not process: it leaves the consumer groups,
//!   so the others take its partitions, and `/readyz` says why. It joins again once it runs the
//!   group's rules.
//!
//! The store is read every second: a change on one instance reaches the others within about
//! two seconds.

use super::live::{LiveRules, RuleChangeError};
use crate::engine_loop::EngineHealth;
use crate::store::{GroupRules, Store};
use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use vigil_lang::ruleset::{RuleSet, RuleSetError};

/// A rule set's files: each name, relative to the rules folder, and its text.
pub type RuleFiles = BTreeMap<String, String>;

/// How often the group's rule set is read.
const SYNC_EVERY: Duration = Duration::from_secs(1);

/// The rule files under `dir`.
pub fn read_folder(dir: &Path) -> Result<RuleFiles, RuleSetError> {
    let read = |path: &Path, source| RuleSetError::Read { path: path.to_path_buf(), source };
    let files = vigil_lang::ruleset::files_under(dir).map_err(|e| read(dir, e))?;
    let mut out = RuleFiles::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| read(&path, e))?;
        out.insert(relative_name(dir, &path), text);
    }
    Ok(out)
}

/// A rule file's name as the group keeps it: relative to the folder, with `/` between parts.
fn relative_name(dir: &Path, path: &Path) -> String {
    path.strip_prefix(dir).unwrap_or(path).to_string_lossy().replace('\\', "/")
}

/// A digest of a rule set's files, names included.
pub fn digest(files: &RuleFiles) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (name, text) in files {
        for part in [name.as_bytes(), text.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    format!("{:032x}", h.digest128())
}

/// Whether `files` check as a rule set on this instance.
fn check(files: &RuleFiles) -> Result<(), RuleSetError> {
    let inputs: Vec<(String, Vec<u8>)> = files.iter().map(|(n, t)| (n.clone(), t.as_bytes().to_vec())).collect();
    RuleSet::from_sources(&inputs).checked().map(|_| ())
}

/// Makes the rule files under `dir` be `files`: the others removed, each written whole.
fn write_folder(dir: &Path, files: &RuleFiles) -> Result<(), RuleSetError> {
    for name in files.keys() {
        let path = Path::new(name);
        let inside = path.components().all(|c| matches!(c, Component::Normal(_)));
        if !inside || path.extension().is_none_or(|e| e != "saql") {
            return Err(RuleSetError::BadFileName(name.clone()));
        }
    }
    let files_here = vigil_lang::ruleset::files_under(dir)
        .map_err(|source| RuleSetError::Read { path: dir.to_path_buf(), source })?;
    for old in files_here {
        if !files.contains_key(&relative_name(dir, &old)) {
            vigil_lang::ruleset::write_atomically(&old, None)?;
        }
    }
    for (name, text) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|source| RuleSetError::Write { path: parent.to_path_buf(), source })?;
        }
        if std::fs::read_to_string(&path).is_ok_and(|t| t == *text) {
            continue;
        }
        vigil_lang::ruleset::write_atomically(&path, Some(text.as_bytes()))?;
    }
    Ok(())
}

/// Keeps an instance's rules those of its group.
pub struct RuleSync {
    pub store: Store,
    pub group: String,
    pub dir: std::path::PathBuf,
    /// Who this instance is, in the store: its external URL.
    pub by: String,
    pub health: Arc<EngineHealth>,
    /// The group's version this instance last ran, and its digest.
    synced: Option<(i64, String)>,
}

impl RuleSync {
    pub fn new(store: Store, group: String, dir: std::path::PathBuf, by: String, health: Arc<EngineHealth>) -> Self {
        RuleSync { store, group, dir, by, health, synced: None }
    }

    /// One round: publish, adopt or hold, as the module says. `live` runs an adopted rule set
    /// (none before the service has loaded its rules: they are read from the folder then).
    pub async fn step(&mut self, live: Option<&LiveRules>) -> Result<(), crate::store::StoreError> {
        let local = match read_folder(&self.dir) {
            Ok(f) => f,
            Err(e) => {
                self.hold(Some(e.to_string()));
                return Ok(());
            }
        };
        let here = digest(&local);
        let group = self.store.group_rules(&self.group).await?;
        let Some(group) = group else {
            if let Some(v) = self.publish(None, &local, &here).await? {
                tracing::info!(group = %self.group, version = v, rules = local.len(), "published this instance's rules as the group's");
            }
            return Ok(());
        };
        if group.digest == here {
            self.synced = Some((group.version, here));
            self.hold(None);
            return Ok(());
        }
        if self.synced.as_ref().is_some_and(|(v, _)| *v == group.version) {
            // Changed here since this instance ran the group's: published when it checks (a
            // folder that does not check was not loaded, and the group's rules still run).
            if check(&local).is_ok() {
                match self.publish(Some(group.version), &local, &here).await? {
                    Some(v) => tracing::info!(group = %self.group, version = v, "published a rule change made here"),
                    None => {
                        tracing::warn!(group = %self.group, "another instance changed the group's rules first; theirs replace the change made here")
                    }
                }
            }
            return Ok(());
        }
        let reason = self.adopt(&group, live).await;
        if reason.is_none() {
            self.synced = Some((group.version, group.digest.clone()));
            tracing::info!(group = %self.group, version = group.version, by = %group.updated_by, "running the group's rules");
        }
        self.hold(reason);
        Ok(())
    }

    /// Writes the group's rules into the folder and runs them; why it could not, if it could not.
    async fn adopt(&self, group: &GroupRules, live: Option<&LiveRules>) -> Option<String> {
        let why = |e: String| {
            Some(format!(
                "this instance cannot run the rules of its group `{}` (version {}, set by {}): {e}",
                self.group, group.version, group.updated_by
            ))
        };
        let files: RuleFiles = match serde_json::from_str(&group.files) {
            Ok(f) => f,
            Err(e) => return why(format!("the stored rule set cannot be read: {e}")),
        };
        if let Err(e) = check(&files) {
            return why(format!("they do not check here: {e}"));
        }
        if let Err(e) = write_folder(&self.dir, &files) {
            return why(e.to_string());
        }
        match live.map(|l| l.reload()) {
            Some(reload) => match reload.await {
                Ok(_) | Err(RuleChangeError::Stopping) => None,
                Err(RuleChangeError::Rules(e)) => why(e.to_string()),
            },
            None => None,
        }
    }

    async fn publish(
        &mut self,
        over: Option<i64>,
        files: &RuleFiles,
        digest: &str,
    ) -> Result<Option<i64>, crate::store::StoreError> {
        let rules = GroupRules {
            version: 0,
            digest: digest.to_string(),
            files: serde_json::to_string(files).expect("rule files serialise"),
            updated_by: self.by.clone(),
            updated_at_ms: vigil_engine::event::now_ms(),
        };
        let published = self.store.publish_group_rules(&self.group, over, &rules).await?;
        if let Some(v) = published {
            self.synced = Some((v, digest.to_string()));
            self.hold(None);
        }
        Ok(published)
    }

    fn hold(&self, reason: Option<String>) {
        if reason != self.health.held() {
            match &reason {
                Some(r) => tracing::error!(reason = %r, "not processing"),
                None => tracing::info!("processing: this instance runs its group's rules"),
            }
        }
        self.health.hold(reason);
    }

    /// Rounds every second until `stop`; a store that does not answer is tried again.
    pub async fn run(mut self, live: Arc<LiveRules>, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SYNC_EVERY) => {}
                _ = stop.changed() => return,
            }
            if let Err(e) = self.step(Some(&live)).await {
                tracing::warn!(error = %e, "cannot read the group's rules; trying again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_written_as_the_group_has_it() {
        let dir = std::env::temp_dir().join(format!("vigil-group-rules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("old")).expect("dir");
        std::fs::write(dir.join("old/gone.saql"), "rule gone { task t fail as e }").expect("write");
        std::fs::write(dir.join("notes.txt"), "not a rule").expect("write");
        let files: RuleFiles =
            [("a.saql", "rule a { task t fail as e }"), ("sub/b.saql", "rule b { task t evict as e }")]
                .into_iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect();
        write_folder(&dir, &files).expect("written");
        let read = read_folder(&dir).expect("read");
        assert_eq!(read, files);
        assert_eq!(digest(&read), digest(&files));
        assert!(dir.join("notes.txt").exists(), "only rule files are replaced");
        let mut other = files.clone();
        other.insert("c.saql".into(), String::new());
        assert_ne!(digest(&other), digest(&files));
        let escape: RuleFiles = [("../x.saql".to_string(), String::new())].into_iter().collect();
        assert!(write_folder(&dir, &escape).is_err(), "a name outside the folder is refused");
        assert!(check(&files).is_ok());
        let broken: RuleFiles = [("a.saql".to_string(), "rule a {".to_string())].into_iter().collect();
        assert!(check(&broken).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
