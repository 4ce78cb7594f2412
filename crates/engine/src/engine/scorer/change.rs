//! `unchanged` and `change_rate`: how long a series has held its value, and how often it
//! changed recently, so that "stuck" can mean "a series that moved went flat".

use std::collections::VecDeque;

/// Updates in a row with the value of the latest (1 when it just changed).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Unchanged {
    last: Option<f64>,
    run: u64,
}

impl Unchanged {
    pub fn update(&mut self, x: f64) -> Option<f64> {
        self.run = if self.last == Some(x) { self.run + 1 } else { 1 };
        self.last = Some(x);
        Some(self.run as f64)
    }
}

/// Updates in a row at which a condition held (0 when it does not hold now).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Streak {
    run: u64,
}

impl Streak {
    pub fn update(&mut self, holds: bool) -> Option<f64> {
        self.run = if holds { self.run + 1 } else { 0 };
        Some(self.run as f64)
    }
}

/// The share of the last `window` updates before the current run of one value at which the
/// value differed from the one before: how much a series moved before it went flat, so that the
/// flat run itself does not dilute it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChangeRate {
    window: usize,
    last: Option<f64>,
    /// Change flags before the current run, oldest first.
    changed: VecDeque<bool>,
    changes: usize,
    /// Updates in the current run that repeated the value before them.
    run: usize,
}

impl ChangeRate {
    pub fn new(window: usize) -> Self {
        let window = window.max(1);
        ChangeRate { window, last: None, changed: VecDeque::with_capacity(window), changes: 0, run: 0 }
    }

    fn push(&mut self, changed: bool) {
        self.changed.push_back(changed);
        self.changes += usize::from(changed);
        if self.changed.len() > self.window && self.changed.pop_front() == Some(true) {
            self.changes -= 1;
        }
    }

    /// `None` until half a window of updates before the current run has been seen.
    pub fn update(&mut self, x: f64) -> Option<f64> {
        match self.last {
            Some(last) if last == x => self.run += 1,
            Some(_) => {
                // The run ended: its repeats now lie before the next one.
                for _ in 0..std::mem::take(&mut self.run).min(self.window) {
                    self.push(false);
                }
                self.push(true);
            }
            None => {}
        }
        self.last = Some(x);
        (self.changed.len() * 2 >= self.window).then(|| self.changes as f64 / self.changed.len() as f64)
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_rates_by_hand() {
        let mut u = Unchanged::default();
        let runs: Vec<f64> = [1.0, 1.0, 2.0, 2.0, 2.0, 1.0].iter().filter_map(|x| u.update(*x)).collect();
        assert_eq!(runs, [1.0, 2.0, 1.0, 2.0, 3.0, 1.0]);
        let mut s = Streak::default();
        let streaks: Vec<f64> = [true, true, false, true].iter().filter_map(|h| s.update(*h)).collect();
        assert_eq!(streaks, [1.0, 2.0, 0.0, 1.0]);
        let mut r = ChangeRate::new(4);
        let rates: Vec<Option<f64>> =
            [1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 5.0, 5.0].iter().map(|x| r.update(*x)).collect();
        // Changes: -, yes, no, yes, no, no, yes, yes, no. Over the last four before the current
        // run, from two seen on: a run of one value leaves the share as it was before the run.
        assert_eq!(
            rates,
            [None, None, None, Some(2.0 / 3.0), Some(2.0 / 3.0), Some(2.0 / 3.0), Some(0.5), Some(0.5), Some(0.5)]
        );
    }
}
