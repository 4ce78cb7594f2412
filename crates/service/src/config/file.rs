//! `vigil.toml`: the settings in sections, each under its flag's name, less the section's name
//! where the flag begins with it (`--kafka-brokers` is `brokers` in `[kafka]`, `--lateness` is
//! `lateness` in `[engine]`). The flat keys of earlier versions (`kafka_brokers = ...` at the
//! top) are still read, each with a warning that names where it goes now.

use super::{FileConfig, PLAIN_SECTIONS};
use std::path::Path;
use vigil_engine::settings::EngineArgs;

/// The sections, in the order the documentation lists them.
pub const SECTIONS: [&str; 8] = ["http", "store", "kafka", "sources", "warm", "engine", "webhook", "alertmanager"];

/// The settings that are not plain values (flags, tables, lists), each with its section.
const OTHER_SECTIONS: [(&str, &str); 8] = [
    ("kafka_create_topics", "kafka"),
    ("kafka_join_group", "kafka"),
    ("topics", "kafka"),
    ("kafka_options", "kafka"),
    ("kafka_topic_format", "kafka"),
    ("replay", "sources"),
    ("alertmanager_url", "alertmanager"),
    ("alertmanager_external_labels", "alertmanager"),
];

/// Every setting of the file: its flag's name with `_`, and its section.
fn placements() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = PLAIN_SECTIONS.to_vec();
    out.extend(OTHER_SECTIONS);
    out.extend(EngineArgs::NAMES.map(|name| (name, "engine")));
    out
}

/// A setting's key in its section: its name without the section's name in front.
pub fn key_in(name: &'static str, section: &str) -> &'static str {
    name.strip_prefix(section).and_then(|rest| rest.strip_prefix('_')).unwrap_or(name)
}

/// Where a setting is written, for messages: `[kafka] options`.
pub fn place(name: &'static str) -> String {
    match placements().into_iter().find(|(n, _)| *n == name) {
        Some((n, section)) => format!("[{section}] {}", key_in(n, section)),
        None => name.to_string(),
    }
}

/// Reads a `vigil.toml`; every problem of it at once, or its settings. A deprecated flat key
/// adds a warning to `warnings`.
pub fn read(path: &Path, warnings: &mut Vec<String>) -> Result<FileConfig, Vec<String>> {
    let at = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{at}: {e}")])?;
    let doc: toml::Table = toml::from_str(&text).map_err(|e| vec![format!("{at}: {e}")])?;
    let mut problems = Vec::new();
    let flat = flatten(doc, &mut problems, warnings);
    let file = toml::Value::Table(flat).try_into::<FileConfig>().map_err(|e| vec![format!("{at}: {e}")])?;
    if problems.is_empty() {
        Ok(file)
    } else {
        Err(problems.into_iter().map(|p| format!("{at}: {p}")).collect())
    }
}

/// The file's settings under their flags' names, the engine's in a table `engine`, as
/// [`FileConfig`] reads them.
pub fn flatten(doc: toml::Table, problems: &mut Vec<String>, warnings: &mut Vec<String>) -> toml::Table {
    let placements = placements();
    let mut flat = toml::Table::new();
    let mut engine = toml::Table::new();
    let mut put = |name: &'static str, value: toml::Value, problems: &mut Vec<String>| {
        let into = if EngineArgs::NAMES.contains(&name) { &mut engine } else { &mut flat };
        if into.insert(name.to_string(), value).is_some() {
            let section = placements.iter().find(|(n, _)| *n == name).map_or("", |(_, s)| s);
            problems.push(format!("`{}` in [{section}] is also set at the top level", key_in(name, section)));
        }
    };
    for (key, value) in doc {
        if SECTIONS.contains(&key.as_str()) {
            let toml::Value::Table(section) = value else {
                problems.push(format!("`{key}` is a section: write it as [{key}]"));
                continue;
            };
            for (k, v) in section {
                match placements.iter().find(|(name, s)| *s == key && key_in(name, s) == k) {
                    Some((name, _)) => put(name, v, problems),
                    None => problems.push(unknown(&k, Some(&key), &placements)),
                }
            }
        } else if let Some((name, section)) = placements.iter().find(|(name, _)| *name == key) {
            warnings.push(format!(
                "vigil.toml: `{key}` at the top level is deprecated; write it as `{}` in [{section}]",
                key_in(name, section)
            ));
            put(name, value, problems);
        } else {
            problems.push(unknown(&key, None, &placements));
        }
    }
    if !engine.is_empty() {
        flat.insert("engine".into(), toml::Value::Table(engine));
    }
    flat
}

/// A key no setting has, with the section that has it when it is only misplaced.
fn unknown(key: &str, section: Option<&str>, placements: &[(&'static str, &'static str)]) -> String {
    let here = section.map_or("at the top level".to_string(), |s| format!("in [{s}]"));
    let elsewhere = placements.iter().find(|(name, s)| key_in(name, s) == key || *name == key);
    match elsewhere {
        Some((name, s)) => format!("`{key}` {here} is no setting; it is `{}` in [{s}]", key_in(name, s)),
        None => format!("`{key}` {here} is no setting of vigil serve"),
    }
}
