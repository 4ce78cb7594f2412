//! `vigil eval --outages`: the rules that judge silence, judged by silences made on purpose.
//!
//! NAB labels no gaps, so it cannot say whether a `host_silent` alert is right. Here each
//! `timestamp,value` file is replayed on its own with its samples cut for [`OUTAGE_MS`] after
//! three points (at 40%, 60% and 80% of its rows): a host that went down for half a day, on
//! every family's own cadence. An outage is detected when a silence rule alerts inside it; the
//! delay runs from the last sample before it. Silence alerts elsewhere fall in the recording's
//! own gaps: those at least as long as an outage are real silences the recording has (and
//! counted as such), shorter ones are the series being slower than the rule expected.

use super::{alerts_of, nab_times, EvalError};
use std::path::{Path, PathBuf};
use vigil_engine::event::Millis;
use vigil_engine::replay::ReplayOptions;
use vigil_formats::input::Format;
use vigil_lang::plan::RulePlan;

/// How long each cut lasts.
pub const OUTAGE_MS: Millis = 12 * 3_600_000;
/// Where the cuts start, as shares of a file's rows: after its probation, apart from each other.
const CUTS_AT: [f64; 3] = [0.4, 0.6, 0.8];

/// What one file's silences gave.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileOutages {
    /// `family/file.csv`.
    pub key: String,
    pub days: f64,
    pub outages: usize,
    /// From the last sample before each detected outage to its first silence alert.
    pub delays: Vec<Millis>,
    /// Gaps of the recording itself at least [`OUTAGE_MS`] long, and those a silence alert fell in.
    pub recorded_gaps: usize,
    pub recorded_alerted: usize,
    /// Silence alerts in the recording's shorter gaps.
    pub shorter: usize,
}

/// The cuts in a file of these row times: from a row's time to [`OUTAGE_MS`] after it.
pub fn cuts(times: &[Millis]) -> Vec<(Millis, Millis)> {
    if times.len() < 10 {
        return Vec::new();
    }
    CUTS_AT
        .iter()
        .map(|share| {
            let start = times[(share * times.len() as f64) as usize];
            (start, start + OUTAGE_MS)
        })
        .collect()
}

/// Replays each file with its cuts through `plans`, `threads` files at a time.
pub fn run_outages(
    plans: &[RulePlan],
    files: &[PathBuf],
    options: &ReplayOptions,
    threads: usize,
) -> Result<Vec<FileOutages>, EvalError> {
    let silence = super::silence_rules(plans);
    if silence.is_empty() {
        return Err(EvalError::Invalid {
            path: "the rules".into(),
            reason: "no rule judges silence (a sequence ending in `-> not e for D`)".into(),
        });
    }
    super::each_in_parallel(files, threads, |path| one_file(plans, &silence, path, options)).into_iter().collect()
}

fn one_file(
    plans: &[RulePlan],
    silence: &[&str],
    path: &Path,
    options: &ReplayOptions,
) -> Result<FileOutages, EvalError> {
    let times = nab_times(path)?;
    let cut = cuts(&times);
    let alerts = alerts_of(plans, &[path.to_path_buf()], Format::Nab, options, None, None, &cut)?;
    let alerted: Vec<Millis> = alerts.iter().filter(|a| silence.contains(&&*a.rule)).map(|a| a.time).collect();
    let inside = |t: Millis, (start, end): (Millis, Millis)| start < t && t <= end;
    let kept: Vec<Millis> = times.iter().copied().filter(|t| !cut.iter().any(|&c| inside(*t, c))).collect();
    let gaps: Vec<(Millis, Millis)> = kept
        .windows(2)
        .map(|w| (w[0], w[1]))
        .filter(|&(a, b)| b - a >= OUTAGE_MS && !cut.iter().any(|&(start, _)| start == a))
        .collect();
    let mut out = FileOutages {
        key: super::nab_key(path),
        days: times.last().zip(times.first()).map_or(0.0, |(b, a)| (b - a) as f64 / 86_400_000.0),
        outages: cut.len(),
        recorded_gaps: gaps.len(),
        ..FileOutages::default()
    };
    for &c in &cut {
        if let Some(first) = alerted.iter().filter(|t| inside(**t, c)).min() {
            out.delays.push(first - c.0);
        }
    }
    out.recorded_alerted = gaps.iter().filter(|&&g| alerted.iter().any(|t| inside(*t, g))).count();
    out.shorter = alerted.iter().filter(|t| !cut.iter().chain(&gaps).any(|&span| inside(**t, span))).count();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_cuts_of_half_a_day_after_the_probation() {
        let times: Vec<Millis> = (0..100).map(|i| i * 300_000).collect();
        let c = cuts(&times);
        assert_eq!(
            c,
            vec![
                (40 * 300_000, 40 * 300_000 + OUTAGE_MS),
                (60 * 300_000, 60 * 300_000 + OUTAGE_MS),
                (80 * 300_000, 80 * 300_000 + OUTAGE_MS)
            ]
        );
        assert!(cuts(&times[..5]).is_empty());
    }
}
