//! What `vigil eval` prints: Markdown tables, so that they can go into the README as they are.

use super::outages::{FileOutages, OUTAGE_MS};
use super::{normalised, Budget, FileScore, LabelledRun, PROFILES};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// Published detectors' scores from a scoreboard, by section (`all`, or a family), each row a
/// detector and its three profile scores.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Anchors(pub BTreeMap<String, Vec<(String, [f64; 3])>>);

impl Anchors {
    /// Reads a scoreboard in the form of `../shared/data/nab/scoreboard.md`: a `## ` heading
    /// per section (`all ...` or a family name), then a table of detector, standard, low FP, low FN.
    pub fn read(path: &Path) -> Result<Anchors, super::EvalError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| super::EvalError::Read { path: path.display().to_string(), source })?;
        Ok(Anchors::parse(&text))
    }

    pub fn parse(text: &str) -> Anchors {
        let mut out: BTreeMap<String, Vec<(String, [f64; 3])>> = BTreeMap::new();
        let mut section: Option<String> = None;
        for line in text.lines() {
            if let Some(title) = line.strip_prefix("## ") {
                let word = title.split_whitespace().next().unwrap_or_default();
                section = Some(if word == "all" { "all".to_string() } else { word.to_string() });
                continue;
            }
            let Some(section) = &section else { continue };
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
            if cells.len() != 4 {
                continue;
            }
            let numbers: Option<Vec<f64>> = cells[1..].iter().map(|c| c.parse::<f64>().ok()).collect();
            if let Some(n) = numbers {
                out.entry(section.clone()).or_default().push((cells[0].to_string(), [n[0], n[1], n[2]]));
            }
        }
        Anchors(out)
    }
}

fn score_cell(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.1}")
    }
}

fn alerts_cell(alerts: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = alerts.iter().filter(|(_, n)| **n > 0).map(|(r, n)| format!("{r} {n}")).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The labelled evaluation: per file, per family and in all, with the anchors beside.
pub fn labelled(run: &LabelledRun, anchors: Option<&Anchors>, label: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Per file\n");
    let _ = writeln!(out, "| file | windows | detected | false positives | alerts | standard |");
    let _ = writeln!(out, "|---|---:|---:|---:|---|---:|");
    for (file, score) in &run.files {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            file.key,
            score.windows,
            score.detected,
            score.false_positives,
            alerts_cell(&score.alerts),
            score_cell(normalised(&[score])[0])
        );
    }
    let mut families: BTreeMap<&str, Vec<&FileScore>> = BTreeMap::new();
    for (file, score) in &run.files {
        families.entry(file.family()).or_default().push(score);
    }
    let all: Vec<&FileScore> = run.files.iter().map(|(_, s)| s).collect();
    let _ = writeln!(out, "\n## Per family and in all\n");
    let _ = writeln!(out, "| family | files | windows | detected | false positives | standard | low FP | low FN |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let rows = families.iter().map(|(f, s)| (f.to_string(), s)).chain(std::iter::once(("**all**".to_string(), &all)));
    for (name, scores) in rows {
        let n = normalised(scores);
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            scores.len(),
            scores.iter().map(|s| s.windows).sum::<usize>(),
            scores.iter().map(|s| s.detected).sum::<usize>(),
            scores.iter().map(|s| s.false_positives).sum::<usize>(),
            score_cell(n[0]),
            score_cell(n[1]),
            score_cell(n[2]),
        );
    }
    let mut by_rule: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, s) in &run.files {
        for (rule, n) in &s.alerts {
            *by_rule.entry(rule).or_default() += n;
        }
    }
    let _ = writeln!(out, "\nFiring alerts by rule: {}", {
        let parts: Vec<String> = by_rule.iter().map(|(r, n)| format!("{r} {n}")).collect();
        if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        }
    });
    silence_note(&mut out, &all);
    if let Some(anchors) = anchors {
        for (section, rows) in &anchors.0 {
            let scores: &Vec<&FileScore> = if section == "all" {
                &all
            } else {
                match families.get(section.as_str()) {
                    Some(s) => s,
                    None => continue,
                }
            };
            let ours = normalised(scores);
            let _ = writeln!(out, "\n## Beside the published detectors: {section} ({} files)\n", scores.len());
            let _ = writeln!(out, "| detector | standard | low FP | low FN |");
            let _ = writeln!(out, "|---|---:|---:|---:|");
            let mut table: Vec<(String, [f64; 3])> = rows.clone();
            table.push((format!("**{label}**"), ours));
            table.sort_by(|a, b| b.1[0].total_cmp(&a.1[0]));
            for (name, s) in table {
                let _ =
                    writeln!(out, "| {name} | {} | {} | {} |", score_cell(s[0]), score_cell(s[1]), score_cell(s[2]));
            }
        }
    }
    let _ = writeln!(out, "\nProfiles: {}.", {
        let p: Vec<String> =
            PROFILES.iter().map(|p| format!("{} (TP {}, FP {}, FN {})", p.name, p.tp, p.fp, p.fn_)).collect();
        p.join("; ")
    });
    out
}

/// What the silence rules' alerts, left out of the scores, would have scored.
fn silence_note(out: &mut String, all: &[&FileScore]) {
    let silence: usize = all.iter().map(|s| s.silence).sum();
    if silence > 0 {
        let with: Vec<FileScore> = all
            .iter()
            .map(|s| FileScore { raw: s.raw_with_silence, windows: s.windows, ..FileScore::default() })
            .collect();
        let n = normalised(&with.iter().collect::<Vec<_>>());
        let _ = writeln!(
            out,
            "\nThe {silence} alerts of rules that judge silence are not scored above: NAB's labels mark no \
             gaps, and `vigil eval --outages` judges them. Scored as detections too, the whole would \
             score {} / {} / {}.",
            score_cell(n[0]),
            score_cell(n[1]),
            score_cell(n[2])
        );
    }
}

/// The page budget: firing alerts per series per day and per host per day, by rule.
pub fn budget(b: &Budget) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} series on {} hosts, {:.1} series-days ({:.1} host-days)\n",
        b.series, b.hosts, b.series_days, b.host_days
    );
    let _ = writeln!(out, "| rule | alerts | per series per day | per host per day |");
    let _ = writeln!(out, "|---|---:|---:|---:|");
    for (rule, n) in &b.alerts {
        let _ = writeln!(out, "| {rule} | {n} | {:.3} | {:.3} |", b.per_series_day(*n), b.per_host_day(*n));
    }
    let total = b.total();
    let _ = writeln!(out, "| **all** | {total} | {:.3} | {:.3} |", b.per_series_day(total), b.per_host_day(total));
    let pages: usize = b.pages.values().sum();
    let by_rule: Vec<String> = b.pages.iter().map(|(rule, n)| format!("{n} {rule}")).collect();
    let _ = writeln!(
        out,
        "\nPages (critical): {pages}, {:.3} per host per week{}",
        b.per_host_day(pages) * 7.0,
        if by_rule.is_empty() { String::new() } else { format!(" ({})", by_rule.join(", ")) }
    );
    out
}

/// Silence rules against cut outages: per family and in all.
pub fn outages(files: &[FileOutages]) -> String {
    let mut out = String::new();
    let hours = OUTAGE_MS / 3_600_000;
    let _ = writeln!(
        out,
        "| family | files | series-days | outages cut ({hours} h) | detected | median delay | recorded gaps of {hours} h+ | alerted | silence alerts in shorter gaps | per series per day |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut families: BTreeMap<&str, Vec<&FileOutages>> = BTreeMap::new();
    for f in files {
        families.entry(super::family_of(&f.key)).or_default().push(f);
    }
    let all: Vec<&FileOutages> = files.iter().collect();
    for (name, rows) in
        families.iter().map(|(f, r)| (f.to_string(), r)).chain(std::iter::once(("**all**".into(), &all)))
    {
        let mut delays: Vec<i64> = rows.iter().flat_map(|f| f.delays.iter().copied()).collect();
        delays.sort_unstable();
        let median =
            delays.get(delays.len() / 2).map_or("-".to_string(), |d| format!("{:.0} min", *d as f64 / 60_000.0));
        let days: f64 = rows.iter().map(|f| f.days).sum();
        let shorter: usize = rows.iter().map(|f| f.shorter).sum();
        let _ = writeln!(
            out,
            "| {name} | {} | {days:.1} | {} | {} | {median} | {} | {} | {shorter} | {:.3} |",
            rows.len(),
            rows.iter().map(|f| f.outages).sum::<usize>(),
            delays.len(),
            rows.iter().map(|f| f.recorded_gaps).sum::<usize>(),
            rows.iter().map(|f| f.recorded_alerted).sum::<usize>(),
            if days > 0.0 { shorter as f64 / days } else { 0.0 },
        );
    }
    out
}
