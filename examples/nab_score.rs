//! Scores Vigil's alerts on the NAB AWS CloudWatch series against NAB's labelled windows.
//!
//! ```text
//! vigil replay --rules rules/metrics/metric_deviation.saql ../shared/data/nab/realAWSCloudwatch/*.csv --out nab.jsonl
//! cargo run --release --example nab_score -- ../shared/data/nab nab.jsonl
//! ```
//!
//! For each series: its anomaly windows, how many got a firing alert inside them, and the alerts
//! outside any window (false positives). The score follows NAB's standard profile (true positive
//! 1.0, false negative 1.0, false positive 0.11), with NAB's scaled sigmoid for where in or after
//! a window a detection falls, only the first detection of a window counting, and NAB's
//! probationary period (the first 15% of each file is not scored). It is normalised so that
//! detecting nothing scores 0 and detecting every window at its start scores 100. NAB's
//! scoreboard (`final_results.json`) is over all 58 NAB files, so the numbers are comparable in
//! kind, not directly.

use std::collections::BTreeMap;
use std::path::Path;

const TP: f64 = 1.0;
const FN: f64 = 1.0;
const FP: f64 = 0.11;
const PROBATION: f64 = 0.15;

/// NAB's scaled sigmoid: 1 near the start of a window, 0 at its end, -1 far after it.
fn sigma(y: f64) -> f64 {
    2.0 / (1.0 + (5.0 * y).exp()) - 1.0
}

fn millis(text: &str) -> i64 {
    vigil::input::parse_naive_utc(text).unwrap_or_else(|| panic!("bad time {text}"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(nab), Some(alerts_path)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: nab_score NAB_DIR ALERTS.jsonl   (NAB_DIR holds labels/ and realAWSCloudwatch/)");
        std::process::exit(2);
    };
    let nab = Path::new(nab);
    let labels: BTreeMap<String, Vec<[String; 2]>> =
        serde_json::from_str(&std::fs::read_to_string(nab.join("labels/combined_windows.json")).expect("labels"))
            .expect("labels JSON");

    // Firing alerts per series, keyed by the file stem the series came from.
    let mut detections: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for line in std::fs::read_to_string(alerts_path).expect("alerts file").lines() {
        let alert: vigil::alert::Alert = serde_json::from_str(line).expect("alert JSON");
        if alert.status != vigil::alert::Status::Firing {
            continue;
        }
        let text = |k: &str| alert.key.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let (host, name) = (text("s.host"), text("s.name"));
        let stem = if host == name { host } else { format!("{name}_{host}") };
        detections.entry(stem).or_default().push(alert.time);
    }

    println!("| series | windows | detected | false positives | score |");
    println!("|---|---:|---:|---:|---:|");
    let (mut windows_all, mut detected_all, mut fp_all) = (0, 0, 0);
    let (mut raw_all, mut null_all, mut perfect_all) = (0.0, 0.0, 0.0);
    for (file, windows) in &labels {
        let Some(stem) = file.strip_prefix("realAWSCloudwatch/").and_then(|f| f.strip_suffix(".csv")) else { continue };
        let data = std::fs::read_to_string(nab.join(file)).expect("series file");
        let stamps: Vec<i64> = data.lines().skip(1).filter_map(|l| l.split(',').next()).map(millis).collect();
        let (first, last) = (stamps[0], *stamps.last().expect("rows"));
        let scored_from = first + ((last - first) as f64 * PROBATION) as i64;
        let windows: Vec<(i64, i64)> = windows.iter().map(|[s, e]| (millis(s), millis(e))).collect();
        let mut hits = vec![false; windows.len()];
        let (mut score, mut fps) = (0.0, 0);
        let mut times = detections.get(stem).cloned().unwrap_or_default();
        times.sort_unstable();
        for t in times.into_iter().filter(|t| *t >= scored_from) {
            if let Some(i) = windows.iter().position(|(s, e)| t >= *s && t <= *e) {
                if !hits[i] {
                    let (s, e) = windows[i];
                    score += TP * sigma((t - e) as f64 / (e - s) as f64);
                    hits[i] = true;
                }
                continue;
            }
            fps += 1;
            score += match windows.iter().rfind(|(_, e)| *e < t) {
                Some((s, e)) => FP * sigma((t - e) as f64 / (e - s) as f64),
                None => -FP,
            };
        }
        let detected = hits.iter().filter(|h| **h).count();
        score -= FN * (windows.len() - detected) as f64;
        let null = -FN * windows.len() as f64;
        let perfect = TP * sigma(-1.0) * windows.len() as f64;
        let normalised = if windows.is_empty() { f64::NAN } else { 100.0 * (score - null) / (perfect - null) };
        println!("| {stem} | {} | {detected} | {fps} | {normalised:.1} |", windows.len());
        windows_all += windows.len();
        detected_all += detected;
        fp_all += fps;
        raw_all += score;
        null_all += null;
        perfect_all += perfect;
    }
    let total = 100.0 * (raw_all - null_all) / (perfect_all - null_all);
    println!("| **all** | {windows_all} | {detected_all} | {fp_all} | {total:.1} |");
}
