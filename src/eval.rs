//! `vigil eval`: how well rules detect, on labelled series (NAB) and within a page budget on
//! unlabelled fleets.
//!
//! **Labelled.** Each NAB file (a `timestamp,value` CSV named in the labels' anomaly windows) is
//! replayed on its own through a fresh engine, as a live series would be, and every firing alert
//! is a detection at the first row at or after the alert's time. Detections are scored as NAB
//! scores a detector's: per window, the earliest detection inside it counts, weighted by a
//! sigmoid of how early it came; a window without one costs the false-negative weight; each
//! detection outside every window costs the false-positive weight, less right after a window;
//! rows in the probationary period (the first 15% of a file, at most 750 rows) are not scored.
//! Scores are summed over files and normalised so that detecting nothing scores 0 and detecting
//! every window at its start 100, for each of NAB's three profiles. Alerts of rules that judge
//! silence (`host_silent`) are counted but not scored: NAB's labels mark no gaps, so such an
//! alert lands in a window only by chance. `--outages` judges them instead ([`outages`]).
//!
//! **Page budget.** Unlabelled inputs are replayed together, as a deployment would read them;
//! the count is firing alerts per metric series per day of that series' samples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vigil_engine::alert::{Alert, Status};
use vigil_engine::event::{Decoded, Millis};
use vigil_engine::replay::Spans;
use vigil_engine::replay::{replay_into, Quiet, ReplayOptions};
use vigil_formats::input::{Format, InputOptions};
use vigil_lang::plan::RulePlan;

pub mod outages;
pub mod report;

/// What goes wrong in an evaluation, with the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// NAB's weights for a true positive, a false positive and a false negative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    pub tp: f64,
    pub fp: f64,
    pub fn_: f64,
}

/// NAB's three application profiles (`profiles.json`).
pub const PROFILES: [Profile; 3] = [
    Profile { name: "standard", tp: 1.0, fp: 0.11, fn_: 1.0 },
    Profile { name: "reward_low_FP_rate", tp: 1.0, fp: 0.22, fn_: 1.0 },
    Profile { name: "reward_low_FN_rate", tp: 1.0, fp: 0.11, fn_: 2.0 },
];

/// Share of a file's rows, and most rows, that are not scored while a detector learns.
const PROBATION_SHARE: f64 = 0.15;
const PROBATION_MAX_ROWS: usize = 750;

/// NAB's scaled sigmoid of a position relative to a window: near 1 at a window's left edge, 0 at
/// its right edge, towards -1 well after it.
fn scaled_sigmoid(position: f64) -> f64 {
    if position >= 3.0 {
        -1.0
    } else {
        2.0 / (1.0 + (5.0 * position).exp()) - 1.0
    }
}

/// A labelled series: its rows' times and its anomaly windows (first and last time, inclusive).
#[derive(Debug, Clone)]
pub struct Labelled {
    /// `family/file.csv`, as the labels name it.
    pub key: String,
    pub path: PathBuf,
    pub times: Vec<Millis>,
    pub windows: Vec<(Millis, Millis)>,
}

impl Labelled {
    pub fn family(&self) -> &str {
        family_of(&self.key)
    }
}

/// A NAB file's key, as the labels name it: `family/file.csv`, the family its folder.
pub fn nab_key(path: &Path) -> String {
    let family = path.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{}/{name}", family.unwrap_or_default())
}

/// The family of a `family/file.csv` key.
pub fn family_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(f, _)| f)
}

/// The names of the rules that judge silence ([`RulePlan::judges_silence`]).
pub fn silence_rules(plans: &[RulePlan]) -> Vec<&str> {
    plans.iter().filter(|p| p.judges_silence()).map(|p| p.name.as_str()).collect()
}

/// `f` of each item, `threads` items at a time, in the items' order.
pub fn each_in_parallel<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let result = f(item);
                if let Ok(mut r) = results.lock() {
                    r.push((i, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// How one file's detections score.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileScore {
    /// Windows with a scored row.
    pub windows: usize,
    pub detected: usize,
    /// Detections outside every window (after the probation).
    pub false_positives: usize,
    /// Firing alerts in all, by rule.
    pub alerts: BTreeMap<String, usize>,
    /// Raw score by profile, in [`PROFILES`] order.
    pub raw: [f64; 3],
    /// Alerts of rules that judge silence ([`RulePlan::judges_silence`]): not scored, since
    /// NAB's labels mark no gaps; `--outages` judges them.
    pub silence: usize,
    /// The raw score had the silence alerts been scored as detections too.
    pub raw_with_silence: [f64; 3],
}

/// Scores the rows flagged at `detections` (times) against `file`'s windows.
pub fn score_file(file: &Labelled, detections: &[Millis]) -> FileScore {
    let rows = file.times.len();
    let probation = ((PROBATION_SHARE * rows as f64).floor() as usize).min(PROBATION_MAX_ROWS);
    // Windows as row ranges: from the first row at or after the start to the last at or before
    // the end.
    let windows: Vec<(usize, usize)> = file
        .windows
        .iter()
        .filter_map(|&(start, end)| {
            let left = file.times.partition_point(|t| *t < start);
            let right = file.times.partition_point(|t| *t <= end).checked_sub(1)?;
            (left <= right).then_some((left, right))
        })
        .collect();
    let mut flagged = vec![false; rows];
    for &t in detections {
        let row = file.times.partition_point(|x| *x < t).min(rows.saturating_sub(1));
        if rows > 0 {
            flagged[row] = true;
        }
    }
    let max_tp = scaled_sigmoid(-1.0);
    let mut score = FileScore::default();
    // Per window: whether it has a scored row, and its best detection's unweighted value.
    let mut best: Vec<Option<f64>> = vec![None; windows.len()];
    let mut counted = vec![false; windows.len()];
    let mut fp_sum = 0.0;
    let mut previous: Option<(usize, usize)> = None;
    let mut w = 0;
    for (row, &is_flagged) in flagged.iter().enumerate() {
        while w < windows.len() && windows[w].1 < row {
            previous = Some(windows[w]);
            w += 1;
        }
        let inside = windows.get(w).filter(|(l, r)| *l <= row && row <= *r).copied();
        if row < probation {
            continue;
        }
        if let Some((left, right)) = inside {
            counted[w] = true;
            if is_flagged {
                let width = (right - left + 1) as f64;
                let position = -((right - row + 1) as f64) / width;
                let value = scaled_sigmoid(position) / max_tp;
                best[w] = Some(best[w].map_or(value, |b: f64| b.max(value)));
            }
        } else if is_flagged {
            score.false_positives += 1;
            fp_sum += match previous {
                None => scaled_sigmoid(3.0),
                Some((left, right)) => {
                    let width = (right - left + 1) as f64;
                    scaled_sigmoid((row - right) as f64 / (width - 1.0).max(1.0))
                }
            };
        }
    }
    score.windows = counted.iter().filter(|c| **c).count();
    score.detected = best.iter().zip(&counted).filter(|(b, c)| **c && b.is_some()).count();
    for (p, profile) in PROFILES.iter().enumerate() {
        let windows: f64 = best
            .iter()
            .zip(&counted)
            .filter(|(_, c)| **c)
            .map(|(b, _)| b.map_or(-profile.fn_, |v| v * profile.tp))
            .sum();
        score.raw[p] = windows + fp_sum * profile.fp;
    }
    score
}

/// Normalised scores of several files together, by profile: 0 detects nothing, 100 detects
/// every window at its start.
pub fn normalised(scores: &[&FileScore]) -> [f64; 3] {
    let windows: usize = scores.iter().map(|s| s.windows).sum();
    let mut out = [0.0; 3];
    for (p, profile) in PROFILES.iter().enumerate() {
        let raw: f64 = scores.iter().map(|s| s.raw[p]).sum();
        let null = -profile.fn_ * windows as f64;
        let perfect = profile.tp * windows as f64;
        out[p] = if windows == 0 { f64::NAN } else { 100.0 * (raw - null) / (perfect - null) };
    }
    out
}

/// The labels: anomaly windows by `family/file.csv`.
pub fn read_labels(path: &Path) -> Result<BTreeMap<String, Vec<(Millis, Millis)>>, EvalError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| EvalError::Read { path: path.display().to_string(), source })?;
    let raw: BTreeMap<String, Vec<[String; 2]>> = serde_json::from_str(&text).map_err(|e| EvalError::Invalid {
        path: path.display().to_string(),
        reason: format!("not a map of file to [start, end] windows: {e}"),
    })?;
    let mut out = BTreeMap::new();
    for (file, windows) in raw {
        let mut parsed = Vec::new();
        for [start, end] in windows {
            let time = |s: &str| {
                vigil_formats::input::parse_naive_utc(s).ok_or_else(|| EvalError::Invalid {
                    path: path.display().to_string(),
                    reason: format!("{file}: `{s}` is not a time"),
                })
            };
            parsed.push((time(&start)?, time(&end)?));
        }
        out.insert(file, parsed);
    }
    Ok(out)
}

/// The CSV files under `inputs` (files or folders) that the labels name, as `family/file.csv`.
pub fn labelled_files(
    inputs: &[PathBuf],
    labels: &BTreeMap<String, Vec<(Millis, Millis)>>,
) -> Result<Vec<Labelled>, EvalError> {
    let mut out = Vec::new();
    for path in files_under(inputs)? {
        let key = nab_key(&path);
        let Some(windows) = labels.get(&key) else { continue };
        let times = nab_times(&path)?;
        out.push(Labelled { key, path, times, windows: windows.clone() });
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Every file under the given files and folders, folders walked in name order.
pub fn files_under(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, EvalError> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = inputs.iter().rev().cloned().collect();
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            let read = |e| EvalError::Read { path: path.display().to_string(), source: e };
            let mut entries: Vec<PathBuf> =
                std::fs::read_dir(&path).map_err(read)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            stack.extend(entries.into_iter().rev());
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

/// The row times of a NAB file, in file order.
pub(crate) fn nab_times(path: &Path) -> Result<Vec<Millis>, EvalError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| EvalError::Read { path: path.display().to_string(), source })?;
    let mut times = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let stamp = line.split(',').next().unwrap_or_default();
        let t = vigil_formats::input::parse_naive_utc(stamp).ok_or_else(|| EvalError::Invalid {
            path: format!("{}:{}", path.display(), i + 1),
            reason: format!("`{stamp}` is not `YYYY-MM-DD hh:mm:ss`"),
        })?;
        times.push(t);
    }
    // NAB files are in time order but for a few repeated stamps; the windows are matched on
    // sorted times.
    times.sort_unstable();
    Ok(times)
}

/// Replays `inputs` together through a fresh engine running `plans`; the firing alerts. With
/// `spans`, the time span of each metric series read is noted in it; with `gather`, the
/// series are gathered onto that many hosts first ([`gather_onto`]); events after the start of
/// a `cut` and up to its end are left out (an outage).
pub fn alerts_of(
    plans: &[RulePlan],
    inputs: &[PathBuf],
    format: Format,
    options: &ReplayOptions,
    spans: Option<&std::rc::Rc<std::cell::RefCell<Spans>>>,
    gather: Option<u32>,
    cut: &[(Millis, Millis)],
) -> Result<Vec<Alert>, EvalError> {
    let (mut engine, gate) = vigil_engine::replay::engines(plans.to_vec(), &options.engine);
    let pool = std::rc::Rc::new(std::cell::RefCell::new(vigil_engine::event::EventPool::default()));
    let mut opened = Vec::new();
    for path in inputs {
        let mut input =
            vigil_formats::input::open_gated(path, format, &InputOptions::default(), gate.clone(), pool.clone())
                .map_err(|source| EvalError::Read { path: path.display().to_string(), source })?;
        if let Some(hosts) = gather {
            let records = std::mem::replace(&mut input.records, Box::new(std::iter::empty()));
            input.records = Box::new(records.map(move |mut r| {
                if let Ok(Decoded::Event(e)) = &mut r.event {
                    if e.stream == vigil_lang::schema::Stream::Metric {
                        gather_onto(std::sync::Arc::make_mut(e), hosts);
                    }
                }
                r
            }));
        }
        if !cut.is_empty() {
            let cut = cut.to_vec();
            let records = std::mem::replace(&mut input.records, Box::new(std::iter::empty()));
            input.records = Box::new(records.filter(move |r| match &r.event {
                Ok(Decoded::Event(e)) => !cut.iter().any(|&(start, end)| start < e.ts && e.ts <= end),
                _ => true,
            }));
        }
        if let Some(spans) = spans {
            input = input.noting(spans);
        }
        opened.push(input);
    }
    let mut fired = Vec::new();
    replay_into(
        engine.as_mut(),
        opened,
        &pool,
        options,
        &mut |alerts| {
            fired.extend(alerts.drain(..).filter(|a| a.status == Status::Firing));
            Ok(())
        },
        &mut Quiet,
    )
    .map_err(|source| EvalError::Read { path: "the inputs".into(), source })?;
    Ok(fired)
}

/// Puts a metric sample's series on one of `hosts` hosts (`gathered-<n>`, by a hash of its own
/// host), its own host kept as the label `instance` so that it stays a series of its own: real
/// series on hosts of as many series as a node_exporter host sends, when the data has a few per
/// host.
pub fn gather_onto(e: &mut vigil_engine::event::Event, hosts: u32) {
    use vigil_engine::event::{field_position, Value};
    let host_at = field_position(e.stream, "host");
    let labels_at = field_position(e.stream, "labels");
    let own = e.value(host_at).to_text();
    let n = vigil_engine::engine::keys::key_group_of(&own) % hosts.max(1);
    let mut labels = match e.value(labels_at) {
        Value::Map(m) => (*m).clone(),
        _ => BTreeMap::new(),
    };
    labels.insert("instance".into(), own);
    e.fields[host_at] = Value::str(&format!("gathered-{n}"));
    e.fields[labels_at] = Value::Map(std::sync::Arc::new(labels));
}

/// Firing alerts per series per day over unlabelled input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budget {
    pub series: usize,
    pub hosts: usize,
    /// Days of samples, summed over series.
    pub series_days: f64,
    /// Days of samples, summed over hosts (a host's span is its series' together).
    pub host_days: f64,
    pub alerts: BTreeMap<String, usize>,
    /// Pages: firing alerts of severity `critical`, by rule.
    pub pages: BTreeMap<String, usize>,
}

impl Budget {
    pub fn total(&self) -> usize {
        self.alerts.values().sum()
    }

    pub fn per_series_day(&self, alerts: usize) -> f64 {
        alerts as f64 / self.series_days.max(f64::MIN_POSITIVE)
    }

    pub fn per_host_day(&self, alerts: usize) -> f64 {
        alerts as f64 / self.host_days.max(f64::MIN_POSITIVE)
    }
}

/// Replays `inputs` together through `plans` and counts alerts against the series' days (with
/// `gather`, the series gathered onto that many hosts, [`gather_onto`]).
pub fn run_budget(
    plans: &[RulePlan],
    inputs: &[PathBuf],
    format: Format,
    options: &ReplayOptions,
    gather: Option<u32>,
) -> Result<Budget, EvalError> {
    let spans = std::rc::Rc::new(std::cell::RefCell::new(Spans::default()));
    let alerts = alerts_of(plans, inputs, format, options, Some(&spans), gather, &[])?;
    let spans = spans.borrow();
    let mut budget = Budget {
        series: spans.series(),
        hosts: spans.hosts(),
        series_days: spans.series_days(),
        host_days: spans.host_days(),
        alerts: BTreeMap::new(),
        pages: BTreeMap::new(),
    };
    for p in plans {
        budget.alerts.insert(p.name.clone(), 0);
    }
    for a in alerts {
        *budget.alerts.entry(a.rule.to_string()).or_default() += 1;
        if &*a.severity == "critical" {
            *budget.pages.entry(a.rule.to_string()).or_default() += 1;
        }
    }
    Ok(budget)
}

/// Labelled files scored, with the alerts each raised.
pub struct LabelledRun {
    pub files: Vec<(Labelled, FileScore)>,
}

/// Runs every labelled file through `plans`, each on its own, `threads` at a time.
pub fn run_labelled(
    plans: &[RulePlan],
    files: Vec<Labelled>,
    options: &ReplayOptions,
    threads: usize,
) -> Result<LabelledRun, EvalError> {
    let silence = silence_rules(plans);
    let scores = each_in_parallel(&files, threads, |file| {
        let alerts = alerts_of(plans, std::slice::from_ref(&file.path), Format::Nab, options, None, None, &[])?;
        let is_silence = |a: &Alert| silence.contains(&&*a.rule);
        let values: Vec<Millis> = alerts.iter().filter(|a| !is_silence(a)).map(|a| a.time).collect();
        let every: Vec<Millis> = alerts.iter().map(|a| a.time).collect();
        let mut score = score_file(file, &values);
        score.raw_with_silence = score_file(file, &every).raw;
        for a in &alerts {
            *score.alerts.entry(a.rule.to_string()).or_default() += 1;
            score.silence += usize::from(is_silence(a));
        }
        Ok(score)
    });
    let mut out = Vec::new();
    for (file, score) in files.into_iter().zip(scores) {
        out.push((file, score?));
    }
    Ok(LabelledRun { files: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 rows a minute apart, one window over rows 40 to 59.
    fn file() -> Labelled {
        let times: Vec<Millis> = (0..100).map(|i| i * 60_000).collect();
        Labelled { key: "family/f.csv".into(), path: PathBuf::new(), windows: vec![(times[40], times[59])], times }
    }

    fn at(rows: &[i64]) -> Vec<Millis> {
        rows.iter().map(|r| r * 60_000).collect()
    }

    #[test]
    fn a_detection_at_a_windows_start_scores_a_whole_true_positive() {
        let s = score_file(&file(), &at(&[40]));
        assert_eq!((s.windows, s.detected, s.false_positives), (1, 1, 0));
        assert!((s.raw[0] - 1.0).abs() < 1e-12, "{:?}", s.raw);
        assert!((normalised(&[&s])[0] - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_late_detection_scores_less_and_only_the_earliest_counts() {
        // At the last row of the window: 2 / (1 + e^(-0.25)) - 1 = 0.124353, over 0.986614.
        let s = score_file(&file(), &at(&[59, 45]));
        let at_45 = (2.0 / (1.0 + (5.0f64 * -(15.0 / 20.0)).exp()) - 1.0) / scaled_sigmoid(-1.0);
        assert!((s.raw[0] - at_45).abs() < 1e-12);
        let late = score_file(&file(), &at(&[59]));
        assert!((late.raw[0] - 0.124353 / 0.986614).abs() < 1e-5, "{:?}", late.raw);
    }

    #[test]
    fn false_positives_cost_by_profile_less_right_after_a_window_and_none_in_probation() {
        // Row 10 is in the probation (15 rows); row 20 is before any window: a whole FP; row 60
        // is one row after the window: 2 / (1 + e^(5/19)) - 1 = -0.130802 of one.
        let s = score_file(&file(), &at(&[10, 20, 60]));
        assert_eq!((s.detected, s.false_positives), (0, 2));
        let fps = -1.0 + -0.130802;
        for (p, profile) in PROFILES.iter().enumerate() {
            assert!((s.raw[p] - (-profile.fn_ + profile.fp * fps)).abs() < 1e-5, "{} {:?}", profile.name, s.raw);
        }
        assert!((normalised(&[&score_file(&file(), &[])])[0]).abs() < 1e-12, "nothing detected scores 0");
    }

    #[test]
    fn a_detection_between_rows_counts_at_the_next_row() {
        let s = score_file(&file(), &[39 * 60_000 + 1]);
        assert_eq!(s.detected, 1);
        assert!((s.raw[0] - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_scoreboard_is_read_by_section() {
        let text = "# x\n\n## all 51 files here (files=51 windows=97)\n\n| detector | standard | low FP | low FN |\n|---|---:|---:|---:|\n| ARTime | 77.00 | 67.70 | 82.26 |\n\n## realAWSCloudwatch (files=17 windows=30)\n\n| numenta | 73.42 | 65.79 | 76.72 |\n";
        let a = report::Anchors::parse(text);
        assert_eq!(a.0["all"], vec![("ARTime".to_string(), [77.0, 67.7, 82.26])]);
        assert_eq!(a.0["realAWSCloudwatch"][0].0, "numenta");
    }
}
