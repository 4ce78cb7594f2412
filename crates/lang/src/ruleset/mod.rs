//! A rule set: rule files loaded and checked together. The command line (`check`, `explain`,
//! `replay`), the rule tests and the service all load rules through it, and the service's API
//! changes a rule through it: in the file the rule lives in, whichever that is.

use crate::diagnostic::JsonDiagnostic;
use crate::plan::RulePlan;
use crate::Compiled;
use std::path::{Path, PathBuf};

/// Why a rule set could not be had.
#[derive(Debug, thiserror::Error)]
pub enum RuleSetError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    /// Some file has problems; each is rendered with carets, and as JSON.
    #[error("the rules do not check:\n{rendered}")]
    Invalid { rendered: String, json: Vec<JsonDiagnostic> },
    #[error("no rule `{0}`")]
    NoRule(String),
    #[error("the text must define exactly one rule, named `{0}`")]
    NotOneRule(String),
    #[error("`{0}` is not a rule name (letters, digits and _)")]
    BadName(String),
    #[error("`{0}` is not the name of a rule file (`.saql`) inside the rules folder")]
    BadFileName(String),
    /// E0405: the change takes a stream from rules it leaves as they were.
    #[error("the change is refused:\n{0}")]
    StreamsInUse(String),
}

mod in_use;
pub use in_use::RunningRule;

/// What the API shows of a loaded rule.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub struct RuleInfo {
    pub name: String,
    pub file: String,
    pub model: String,
    pub description: Option<String>,
    /// The plan as `vigil explain` prints it.
    pub plan: String,
    /// The rule's declaration as written.
    pub text: String,
    pub severity: String,
    pub for_ms: u64,
    pub keep_firing_for_ms: u64,
}

/// Rule files, each compiled, with every name clash across them reported.
pub struct RuleSet {
    files: Vec<Compiled>,
}

impl RuleSet {
    /// Loads the `*.saql` files named by `paths`, folders walked recursively, in a stable order.
    pub fn load(paths: &[PathBuf]) -> Result<RuleSet, RuleSetError> {
        let mut inputs = Vec::new();
        for path in rule_files(paths)? {
            let bytes = std::fs::read(&path).map_err(|source| RuleSetError::Read { path: path.clone(), source })?;
            inputs.push((path.display().to_string(), bytes));
        }
        Ok(RuleSet::from_sources(&inputs))
    }

    /// Compiles named texts as one set.
    pub fn from_sources(files: &[(String, Vec<u8>)]) -> RuleSet {
        RuleSet { files: crate::compile_all(files) }
    }

    pub fn files(&self) -> &[Compiled] {
        &self.files
    }

    /// The streams and kinds the set's files declare, over Vigil's own.
    pub fn catalog(&self) -> &crate::schema::Catalog {
        match self.files.first() {
            Some(c) => &c.catalog,
            None => crate::schema::Catalog::prelude(),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.files.iter().all(Compiled::is_ok)
    }

    /// Every problem of every file, rendered for a terminal.
    pub fn render(&self, color: bool) -> String {
        self.files.iter().map(|c| c.source().render(&c.diagnostics, color)).collect()
    }

    pub fn to_json(&self) -> Vec<JsonDiagnostic> {
        self.files.iter().flat_map(|c| c.source().to_json(&c.diagnostics)).collect()
    }

    /// The set as an error when it has problems.
    pub fn checked(self) -> Result<RuleSet, RuleSetError> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(RuleSetError::Invalid { rendered: self.render(false), json: self.to_json() })
        }
    }

    /// Every rule's plan, in file order.
    pub fn plans(&self) -> Vec<RulePlan> {
        self.files.iter().flat_map(|c| c.plans.iter().cloned()).collect()
    }

    pub fn infos(&self) -> Vec<RuleInfo> {
        self.files
            .iter()
            .flat_map(|c| {
                c.plans.iter().map(|p| {
                    let span = c.rule_spans.iter().find(|(name, _)| *name == p.name).map(|(_, span)| *span);
                    RuleInfo {
                        name: p.name.clone(),
                        file: c.name.clone(),
                        model: p.kind().to_string(),
                        description: p.description.clone(),
                        plan: p.to_string(),
                        text: span.and_then(|s| c.text.get(s.start..s.end)).unwrap_or_default().to_string(),
                        severity: p.alert.severity.to_string(),
                        for_ms: p.alert.for_ms,
                        keep_firing_for_ms: p.alert.keep_firing_for_ms,
                    }
                })
            })
            .collect()
    }

    /// The file that defines `rule`, with where in it.
    fn site(&self, rule: &str) -> Option<(&Compiled, crate::ast::Span)> {
        self.files.iter().find_map(|c| c.rule_spans.iter().find(|(name, _)| name == rule).map(|(_, span)| (c, *span)))
    }

    /// The set with rule `name` set to `text` (one rule, named `name`): as the whole file that
    /// defines it when it defines nothing else, in its place among the other rules of its file,
    /// or else in a new file `<dir>/<name>.saql`. Returns the
    /// set as it would be, and the file to write with its new content.
    pub fn with_rule(&self, dir: &Path, name: &str, text: &[u8]) -> Result<(RuleSet, PathBuf, Vec<u8>), RuleSetError> {
        if !valid_name(name) {
            return Err(RuleSetError::BadName(name.to_string()));
        }
        let own = crate::compile(&format!("{name}.saql"), text);
        if !(own.rule_names.len() == 1 && own.rule_names[0].0 == name) {
            return Err(RuleSetError::NotOneRule(name.to_string()));
        }
        // A file of its own is the text; a rule among others has its place in the file replaced.
        let (path, content) = match self.site(name) {
            Some((file, _)) if file.rule_spans.len() == 1 => (PathBuf::from(&file.name), text.to_vec()),
            Some((file, span)) => (PathBuf::from(&file.name), splice(&file.text, span, text)),
            None => (dir.join(format!("{name}.saql")), text.to_vec()),
        };
        Ok((self.replaced(&path, Some(&content)), path, content))
    }

    /// The set without rule `name`: its file loses it, or goes when it held nothing else.
    /// Returns the set as it would be, the file, and its new content (`None`: delete it).
    pub fn without_rule(&self, name: &str) -> Result<(RuleSet, PathBuf, Option<Vec<u8>>), RuleSetError> {
        let Some((file, span)) = self.site(name) else { return Err(RuleSetError::NoRule(name.to_string())) };
        let path = PathBuf::from(&file.name);
        let content = (file.rule_spans.len() > 1).then(|| splice(&file.text, span, b""));
        Ok((self.replaced(&path, content.as_deref()), path, content))
    }

    /// The set with the file at `path` holding `content` (`None`: gone).
    fn replaced(&self, path: &Path, content: Option<&[u8]>) -> RuleSet {
        let name = path.display().to_string();
        let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
        let mut found = false;
        for c in &self.files {
            if c.name == name {
                found = true;
                inputs.extend(content.map(|t| (name.clone(), t.to_vec())));
            } else {
                inputs.push((c.name.clone(), c.text.as_bytes().to_vec()));
            }
        }
        if !found {
            inputs.extend(content.map(|t| (name.clone(), t.to_vec())));
        }
        inputs.sort_by(|a, b| a.0.cmp(&b.0));
        RuleSet::from_sources(&inputs)
    }
}

/// `text` with `span` replaced by `with`.
fn splice(text: &str, span: crate::ast::Span, with: &[u8]) -> Vec<u8> {
    let mut out = text.as_bytes()[..span.start].to_vec();
    out.extend_from_slice(with);
    out.extend_from_slice(&text.as_bytes()[span.end..]);
    out
}

/// The `*.saql` files named by `paths`, folders walked recursively, sorted within each folder.
pub fn rule_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, RuleSetError> {
    let mut files = Vec::new();
    for path in paths {
        let read = |source| RuleSetError::Read { path: path.clone(), source };
        if std::fs::metadata(path).map_err(read)?.is_dir() {
            files.extend(files_under(path).map_err(|source| RuleSetError::Read { path: path.clone(), source })?);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// The `*.saql` files under `dir`, recursively, sorted.
pub fn files_under(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let p = entry?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "saql") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Every rule file under `dir` as (name, content), ready for [`crate::compile_all`].
pub fn read_files_under(dir: &Path) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    files_under(dir)?.into_iter().map(|p| Ok((p.display().to_string(), std::fs::read(&p)?))).collect()
}

/// A rule name the API accepts: an identifier, which also makes it a safe file name.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128
}

/// Writes a file atomically: a temporary file in the same folder, then a rename; `None`
/// deletes it.
pub fn write_atomically(path: &Path, content: Option<&[u8]>) -> Result<(), RuleSetError> {
    let write = |source| RuleSetError::Write { path: path.to_path_buf(), source };
    let Some(content) = content else { return std::fs::remove_file(path).map_err(write) };
    let tmp = path.with_extension(format!("saql.tmp{}", std::process::id()));
    std::fs::write(&tmp, content).map_err(write)?;
    std::fs::rename(&tmp, path).map_err(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "// two rules\nrule a { task t fail as e }\n\nrule b { task t evict as e }\n";

    fn set(files: &[(&str, &str)]) -> RuleSet {
        let inputs: Vec<(String, Vec<u8>)> =
            files.iter().map(|(n, t)| (n.to_string(), t.as_bytes().to_vec())).collect();
        RuleSet::from_sources(&inputs)
    }

    #[test]
    fn a_rule_is_changed_in_the_file_it_lives_in_and_its_neighbours_stay() {
        let rules = set(&[("rules/x/two.saql", TWO)]);
        let (after, path, content) =
            rules.with_rule(Path::new("rules"), "b", b"rule b { task t kill as e }").expect("valid");
        assert_eq!(path, PathBuf::from("rules/x/two.saql"));
        let content = String::from_utf8(content).expect("utf-8");
        assert_eq!(content, "// two rules\nrule a { task t fail as e }\n\nrule b { task t kill as e }\n");
        assert!(after.is_ok(), "{}", after.render(false));
        assert_eq!(after.plans().len(), 2);
        // A new rule gets a file of its own.
        let (after, path, _) = rules.with_rule(Path::new("rules"), "c", b"rule c { task t lost as e }").expect("valid");
        assert_eq!(path, PathBuf::from("rules/c.saql"));
        assert_eq!(after.plans().len(), 3);
    }

    #[test]
    fn a_rule_is_removed_from_its_file_and_a_file_left_empty_goes() {
        let rules = set(&[("two.saql", TWO), ("one.saql", "rule c { task t lost as e }")]);
        let (after, path, content) = rules.without_rule("a").expect("exists");
        assert_eq!(path, PathBuf::from("two.saql"));
        assert!(content.is_some_and(|c| !String::from_utf8_lossy(&c).contains("rule a")));
        assert_eq!(after.plans().len(), 2);
        let (after, path, content) = rules.without_rule("c").expect("exists");
        assert_eq!((path, content), (PathBuf::from("one.saql"), None));
        assert_eq!(after.plans().len(), 2);
        assert!(matches!(rules.without_rule("zz"), Err(RuleSetError::NoRule(_))));
    }

    #[test]
    fn a_text_that_is_not_one_rule_of_that_name_is_refused() {
        let rules = set(&[("two.saql", TWO)]);
        for text in ["rule x { task t fail as e }", "rule a { task t fail as e } rule b { task t fail as e }", ""] {
            assert!(matches!(rules.with_rule(Path::new("."), "a", text.as_bytes()), Err(RuleSetError::NotOneRule(_))));
        }
        assert!(matches!(rules.with_rule(Path::new("."), "../x", b""), Err(RuleSetError::BadName(_))));
    }

    #[test]
    fn names_cannot_escape_the_folder() {
        assert!(valid_name("machine_cpu_spike"));
        for bad in ["", "../etc/passwd", "a/b", "a.saql", "1abc", "x y", "..", "%2e%2e"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
