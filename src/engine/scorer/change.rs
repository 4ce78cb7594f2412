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

/// The share of the last `window` updates at which the value differed from the one before.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChangeRate {
    window: usize,
    last: Option<f64>,
    changed: VecDeque<bool>,
    changes: usize,
}

impl ChangeRate {
    pub fn new(window: usize) -> Self {
        let window = window.max(1);
        ChangeRate { window, last: None, changed: VecDeque::with_capacity(window), changes: 0 }
    }

    /// `None` until half a window of changes (or not) has been seen.
    pub fn update(&mut self, x: f64) -> Option<f64> {
        if let Some(last) = self.last {
            let changed = last != x;
            self.changed.push_back(changed);
            self.changes += usize::from(changed);
            if self.changed.len() > self.window && self.changed.pop_front() == Some(true) {
                self.changes -= 1;
            }
        }
        self.last = Some(x);
        (self.changed.len() * 2 >= self.window).then(|| self.changes as f64 / self.changed.len() as f64)
    }

    pub fn bytes(&self) -> usize {
        self.window + 32
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
        let rates: Vec<Option<f64>> = [1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0].iter().map(|x| r.update(*x)).collect();
        // Changes: -, yes, no, yes, no, no, no, no; from two seen on, over the last four.
        assert_eq!(rates, [None, None, Some(0.5), Some(2.0 / 3.0), Some(0.5), Some(0.25), Some(0.25), Some(0.0)]);
    }
}
