//! Rule tests: TOML files of cases, each with input events and the alerts expected from them.
//!
//! ```toml
//! rules = ["../evicted_then_failed.saql"]   # relative to this file
//! lateness = "0 s"                           # optional, for every case
//!
//! [[case]]
//! name = "eviction then failure elsewhere fires"
//! events = '''
//! {"stream":"task_event","ts":"2026-01-01T00:00:00Z","type":"EVICT","job_id":"j1","task_index":0,"machine_id":"m1"}
//! {"stream":"task_event","ts":"2026-01-01T00:04:00Z","type":"FAIL","job_id":"j1","task_index":0,"machine_id":"m2"}
//! '''
//! # or: events_file = "data/trace.jsonl" (any input format, detected as in replay), and
//! # events_format = "otlp-json" to name the format (as `vigil replay --format` does)
//!
//! [[case.expect]]               # every firing alert must be expected, and every expected found
//! rule = "evicted_then_failed"
//! time = "2026-01-01T00:04:00Z"  # optional: when it fired
//! key = { "t.job_id" = "j1" }     # optional, and like labels/values/annotations: a subset
//! status = "resolved"            # optional: resolved alerts are checked only if one is expected
//!
//! [[case.quiet]]                 # no alert (of `rule`, if given) fires in [from, to]
//! from = "2026-01-01T00:00:00Z"
//! to = "2026-01-01T01:00:00Z"
//! ```

use serde::Deserialize;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use vigil_engine::alert::{Alert, Status};
use vigil_engine::engine::{release_target, EngineConfig};
use vigil_engine::event::{format_time, parse_time, LineDecoder, Millis};
use vigil_engine::runtime::Runtime;
use vigil_engine::settings::EngineSettings;
use vigil_formats::input::{self, Format, InputOptions};
use vigil_lang::plan::RulePlan;
use vigil_lang::schema::Catalog;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    /// Rule files under test, relative to the test file.
    rules: Vec<String>,
    /// Allowed lateness for every case, e.g. "30 s".
    lateness: Option<String>,
    #[serde(rename = "case", default)]
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    /// Events as JSON lines.
    events: Option<String>,
    /// A file of events, relative to the test file.
    events_file: Option<String>,
    /// The file's format, as `vigil replay --format` names it (`influx`, `otlp-json`, ...);
    /// detected as replay does when left out.
    events_format: Option<String>,
    /// Allowed lateness for this case, overriding the file's.
    lateness: Option<String>,
    #[serde(default)]
    expect: Vec<Expect>,
    #[serde(default)]
    quiet: Vec<Quiet>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    rule: String,
    #[serde(default = "firing")]
    status: Status,
    time: Option<String>,
    #[serde(default)]
    key: BTreeMap<String, toml::Value>,
    #[serde(default)]
    values: BTreeMap<String, toml::Value>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn firing() -> Status {
    Status::Firing
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Quiet {
    rule: Option<String>,
    from: String,
    to: String,
}

/// Outcome of a run over test files.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TestReport {
    pub passed: usize,
    pub failed: usize,
}

/// Finds `*.toml` test files under `paths` (files or folders, recursively).
pub fn test_files(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> =
                std::fs::read_dir(p)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
            entries.sort();
            for e in entries {
                if e.is_dir() {
                    out.extend(test_files(&[e])?);
                } else if e.extension().is_some_and(|x| x == "toml") {
                    out.push(e);
                }
            }
        } else {
            std::fs::metadata(p)?;
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Runs every case of every file, printing as a test runner does.
/// Runs every case of `files` through an engine of `settings`, whose lateness applies to the
/// cases whose file and case set none.
pub fn run(files: &[PathBuf], settings: &EngineSettings, out: &mut dyn Write) -> std::io::Result<TestReport> {
    let mut report = TestReport::default();
    let mut failures: Vec<(String, String)> = Vec::new();
    for file in files {
        let name = file.display().to_string();
        match run_file(file, settings) {
            Err(problem) => {
                writeln!(out, "test {name} ... FAILED")?;
                failures.push((name, problem.to_string()));
                report.failed += 1;
            }
            Ok(results) => {
                for (case, result) in results {
                    let title = format!("{name} :: {case}");
                    match result {
                        Ok(()) => {
                            writeln!(out, "test {title} ... ok")?;
                            report.passed += 1;
                        }
                        Err(diff) => {
                            writeln!(out, "test {title} ... FAILED")?;
                            failures.push((title, diff));
                            report.failed += 1;
                        }
                    }
                }
            }
        }
    }
    if !failures.is_empty() {
        writeln!(out, "\nfailures:")?;
        for (title, diff) in &failures {
            writeln!(out, "\n---- {title}\n{diff}")?;
        }
    }
    writeln!(out, "\ntest result: {}.", if report.failed == 0 { "ok" } else { "FAILED" })?;
    writeln!(out, "{} passed, {} failed", report.passed, report.failed)?;
    Ok(report)
}

/// Why a test file, or a case of one, could not run: what is wrong with the test, not with the
/// rule (a rule that does not do what a case expects is a [`CaseResult`] with its diff).
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error("cannot read: {0}")]
    Read(#[from] std::io::Error),
    #[error("not a rule test file: {0}")]
    Toml(#[from] toml::de::Error),
    #[error(transparent)]
    Rules(#[from] vigil_lang::ruleset::RuleSetError),
    #[error("the file has no [[case]]")]
    NoCase,
    #[error("{0}")]
    Case(String),
}

/// A case's name and how it went: the diff of alerts when they are not what it expects.
type CaseResult = (String, Result<(), String>);

fn run_file(path: &Path, settings: &EngineSettings) -> Result<Vec<CaseResult>, TestError> {
    let text = std::fs::read_to_string(path)?;
    let file: TestFile = toml::from_str(&text)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let (plans, catalog) = load_rules(dir, &file.rules)?;
    let file_lateness = file.lateness.as_deref().map(lateness).transpose().map_err(TestError::Case)?;
    if file.cases.is_empty() {
        return Err(TestError::NoCase);
    }
    Ok(file
        .cases
        .iter()
        .map(|case| {
            let result = run_case(dir, (&plans, &catalog), settings, file_lateness, case);
            (case.name.clone(), result)
        })
        .collect())
}

fn lateness(text: &str) -> Result<Millis, String> {
    vigil_lang::parser::parse_duration(text).map(|ms| ms as Millis)
}

/// The rules a test file names, with the streams they declare: its events may be of those.
fn load_rules(dir: &Path, rules: &[String]) -> Result<(Vec<RulePlan>, Catalog), TestError> {
    let paths: Vec<_> = rules.iter().map(|r| dir.join(r)).collect();
    let set = vigil_lang::ruleset::RuleSet::load(&paths)?.checked()?;
    Ok((set.plans(), set.catalog().clone()))
}

fn run_case(
    dir: &Path,
    (plans, catalog): (&[RulePlan], &Catalog),
    settings: &EngineSettings,
    file_lateness: Option<Millis>,
    case: &Case,
) -> Result<(), String> {
    let lateness = match &case.lateness {
        Some(l) => self::lateness(l)?,
        None => file_lateness.unwrap_or(settings.lateness_ms()),
    };
    let config = EngineConfig { lateness_ms: lateness, ..settings.config() };
    let mut engine = Runtime::new(plans.to_vec(), config, settings.partitions(), settings.workers);
    let mut alerts: Vec<Alert> = Vec::new();
    let mut events = Vec::new();
    let mut decoder = LineDecoder::new(catalog.clone());
    if let Some(text) = &case.events {
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            events.push(decoder.decode(line, None).map_err(|e| format!("event line {}: {e}", i + 1))?);
        }
    }
    if let Some(f) = &case.events_file {
        let path = dir.join(f);
        let format = match &case.events_format {
            None => Format::Auto,
            Some(name) => <Format as clap::ValueEnum>::from_str(name, true)
                .map_err(|_| format!("events_format `{name}` is not a format `vigil replay --format` reads"))?,
        };
        let input = input::open(&path, format, &InputOptions { catalog: catalog.clone(), ..InputOptions::default() })
            .map_err(|e| format!("{}: {e}", path.display()))?;
        for r in input.records {
            events.push(r.event.map_err(|e| format!("{}:{}: {e}", path.display(), r.line))?);
        }
    }
    let bounds = settings.bounds();
    // Event time as the engine will have it when each event arrives (`replay` checks against
    // the engine's own): the newest time so far less the lateness.
    let mut watermark = None;
    for (i, e) in events.iter().enumerate() {
        bounds.check(e.ts, vigil_engine::event::now_ms(), watermark).map_err(|e| format!("event {}: {e}", i + 1))?;
        watermark = watermark.max(Some(release_target(e.ts, lateness)));
    }
    engine.push(events, Vec::new(), &mut alerts);
    engine.flush(&mut alerts);
    judge(case, &alerts)
}

fn judge(case: &Case, alerts: &[Alert]) -> Result<(), String> {
    let check_resolved = case.expect.iter().any(|e| e.status == Status::Resolved);
    let relevant: Vec<&Alert> = alerts.iter().filter(|a| a.status == Status::Firing || check_resolved).collect();
    let mut used = vec![false; relevant.len()];
    let mut missing = Vec::new();
    for exp in &case.expect {
        let found = (0..relevant.len()).find(|&i| !used[i] && matches(exp, relevant[i]));
        match found {
            Some(i) => used[i] = true,
            None => missing.push(describe_expect(exp)),
        }
    }
    let unexpected: Vec<String> = relevant.iter().zip(&used).filter(|(_, u)| !**u).map(|(a, _)| describe(a)).collect();
    let mut noisy = Vec::new();
    for q in &case.quiet {
        let (from, to) = (parse_time(&q.from), parse_time(&q.to));
        let (Some(from), Some(to)) = (from, to) else {
            return Err(format!("quiet period `{}`..`{}` is not two RFC 3339 times", q.from, q.to));
        };
        for a in alerts.iter().filter(|a| a.status == Status::Firing) {
            if a.time >= from && a.time <= to && q.rule.as_ref().is_none_or(|r| **r == *a.rule) {
                noisy.push(format!("{} (quiet from {} to {})", describe(a), q.from, q.to));
            }
        }
    }
    if missing.is_empty() && unexpected.is_empty() && noisy.is_empty() {
        return Ok(());
    }
    let mut diff = String::new();
    for m in &missing {
        diff.push_str(&format!("- expected  {m}\n"));
    }
    for u in &unexpected {
        diff.push_str(&format!("+ unexpected {u}\n"));
    }
    for n in &noisy {
        diff.push_str(&format!("+ in a quiet period {n}\n"));
    }
    diff.push_str(&format!("  all alerts ({}):\n", alerts.len()));
    for a in alerts {
        diff.push_str(&format!("    {}\n", describe(a)));
    }
    Err(diff)
}

fn matches(exp: &Expect, a: &Alert) -> bool {
    let json = |v: &toml::Value| serde_json::to_value(v).unwrap_or(Json::Null);
    *exp.rule == *a.rule
        && exp.status == a.status
        && exp.time.as_deref().is_none_or(|t| parse_time(t) == Some(a.time))
        && exp.key.iter().all(|(k, v)| a.key.get(k).is_some_and(|got| same(got, &json(v))))
        && exp.values.iter().all(|(k, v)| a.values.get(k).is_some_and(|got| same(got, &json(v))))
        && exp.labels.iter().all(|(k, v)| a.labels.get(k) == Some(v))
        && exp.annotations.iter().all(|(k, v)| a.annotations.get(k) == Some(v))
}

/// JSON equality where 3 and 3.0 are the same number.
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64() == y.as_f64(),
        (Json::Array(x), Json::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        _ => a == b,
    }
}

fn describe(a: &Alert) -> String {
    format!(
        "{} {} at {} key {}",
        a.status.as_str(),
        a.rule,
        format_time(a.time),
        serde_json::to_string(&a.key).unwrap_or_default()
    )
}

fn describe_expect(e: &Expect) -> String {
    let mut s = format!("{} {}", e.status.as_str(), e.rule);
    if let Some(t) = &e.time {
        s.push_str(&format!(" at {t}"));
    }
    if !e.key.is_empty() {
        let key: BTreeMap<&String, Json> =
            e.key.iter().map(|(k, v)| (k, serde_json::to_value(v).unwrap_or(Json::Null))).collect();
        s.push_str(&format!(" key {}", serde_json::to_string(&key).unwrap_or_default()));
    }
    s
}
