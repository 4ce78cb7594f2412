//! The rules folder of a running service: loading, watching, and changes through the API.
//!
//! A reload compiles the whole folder; if any file has a problem the running rules stay as they
//! are (the problems are logged and counted). The API writes one rule per file, `<name>.saql`,
//! and only inside the folder: names are identifiers, so no path can escape it.

use crate::plan::RulePlan;
use crate::Compiled;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What the API shows of a loaded rule.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RuleInfo {
    pub name: String,
    pub file: String,
    pub model: String,
    pub description: Option<String>,
    /// The plan as `vigil explain` prints it.
    pub plan: String,
}

/// A compiled rule folder.
pub struct Loaded {
    pub plans: Vec<RulePlan>,
    pub infos: Vec<RuleInfo>,
}

/// Problems that kept a folder from loading, rendered for a log or an HTTP answer.
#[derive(Debug)]
pub struct LoadError {
    pub rendered: String,
    pub json: Vec<crate::diagnostic::JsonDiagnostic>,
}

pub use crate::rule_files;

/// Compiles the folder, with `replace` standing in for one file's content (`None` removes it).
pub fn compile_folder(dir: &Path, replace: Option<(&Path, Option<&[u8]>)>) -> Result<Vec<Compiled>, std::io::Error> {
    let mut inputs = Vec::new();
    let mut replaced = false;
    for f in rule_files(dir)? {
        match replace {
            Some((path, content)) if f == path => {
                replaced = true;
                if let Some(c) = content {
                    inputs.push((f.display().to_string(), c.to_vec()));
                }
            }
            _ => inputs.push((f.display().to_string(), std::fs::read(&f)?)),
        }
    }
    if let (false, Some((path, Some(content)))) = (replaced, replace) {
        inputs.push((path.display().to_string(), content.to_vec()));
    }
    Ok(crate::compile_all(&inputs))
}

pub fn load(dir: &Path) -> Result<Loaded, LoadError> {
    let compiled = compile_folder(dir, None)
        .map_err(|e| LoadError { rendered: format!("cannot read {}: {e}", dir.display()), json: Vec::new() })?;
    into_loaded(compiled)
}

pub fn into_loaded(compiled: Vec<Compiled>) -> Result<Loaded, LoadError> {
    if compiled.iter().any(|c| !c.is_ok()) {
        let rendered = compiled.iter().map(|c| c.source().render(&c.diagnostics, false)).collect();
        let json = compiled.iter().flat_map(|c| c.source().to_json(&c.diagnostics)).collect();
        return Err(LoadError { rendered, json });
    }
    let mut plans = Vec::new();
    let mut infos = Vec::new();
    for c in compiled {
        for p in c.plans {
            infos.push(RuleInfo {
                name: p.name.clone(),
                file: c.name.clone(),
                model: p.model.to_string(),
                description: p.description.clone(),
                plan: p.to_string(),
            });
            plans.push(p);
        }
    }
    Ok(Loaded { plans, infos })
}

/// A rule file's name, size and modification time.
pub type FileStamp = (PathBuf, u64, Option<SystemTime>);

/// What changes when a rule file changes: names, sizes and modification times.
pub fn fingerprint(dir: &Path) -> Vec<FileStamp> {
    rule_files(dir)
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

/// A rule name the API accepts: an identifier, which also makes it a safe file name.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128
}

/// Writes a file atomically: a temporary file in the same folder, then a rename.
pub fn write_atomically(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("saql.tmp{}", std::process::id()));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_escape_the_folder() {
        assert!(valid_name("machine_cpu_spike"));
        for bad in ["", "../etc/passwd", "a/b", "a.saql", "1abc", "x y", "..", "%2e%2e"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
