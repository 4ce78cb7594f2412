//! A series' recent values, kept once for every scorer of a rule that reads them: `knn`'s lag
//! vectors and `robust_z`'s median both read the same values of `ss.v`, so they share one
//! history, as long as the longest of their windows, in `f32`, oldest first.

/// The recent values of one input of a rule's score block, for one group.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct History {
    /// Values kept at most: the longest window among the scorers that read them.
    cap: usize,
    /// The last `cap` values taken, oldest first.
    values: Vec<f32>,
    /// Values taken since the group began: the last one's sequence number is `taken - 1`.
    taken: u64,
    /// Whether the value being judged now was taken (a value beyond `f32`'s range is not, and
    /// its readers give it no score).
    current: bool,
    /// Whether the window being judged has not given its value yet.
    #[serde(skip)]
    expecting: bool,
}

impl History {
    pub fn new(cap: usize) -> Self {
        History { cap: cap.max(1), values: Vec::new(), taken: 0, current: false, expecting: false }
    }

    /// A window closed: its value is taken by the first of [`History::take_once`], as every
    /// reader of one input is given the same value.
    pub fn expect(&mut self) {
        self.expecting = true;
    }

    pub fn take_once(&mut self, x: f64) {
        if std::mem::take(&mut self.expecting) {
            self.take(x);
        }
    }

    /// The window is judged: a value that did not come (no reader had one) is not waited for.
    pub fn settle(&mut self) {
        self.expecting = false;
    }

    /// Takes the value the window that just closed is judged by, before any reader reads it.
    pub fn take(&mut self, x: f64) {
        let v = x as f32;
        self.current = v.is_finite();
        if !self.current {
            return;
        }
        if self.values.len() == self.cap {
            self.values.remove(0);
        } else if self.values.len() == self.values.capacity() {
            // Grows as the series lives, by doubling, but never past the window: a series seen
            // for an hour holds an hour.
            let more = (self.values.len().max(8) * 2).min(self.cap) - self.values.len();
            self.values.reserve_exact(more);
        }
        self.values.push(v);
        self.taken += 1;
    }

    /// The values kept, the one being judged last when it was taken.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Whether the value being judged is the last of [`History::values`].
    pub fn current(&self) -> bool {
        self.current
    }

    /// The values taken since the group began.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    pub fn bytes(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<f32>() + 48
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_the_last_values_and_grows_only_to_its_window() {
        let mut h = History::new(20);
        for x in 0..50 {
            h.take(f64::from(x));
            assert!(h.current());
            assert!(h.values.capacity() <= 20, "capacity {} past the window", h.values.capacity());
        }
        assert_eq!(h.values(), (30..50).map(|x| x as f32).collect::<Vec<_>>().as_slice());
        assert_eq!(h.taken(), 50);
        h.take(1e300);
        assert!(!h.current(), "beyond f32: not taken");
        assert_eq!((h.taken(), h.values()[19]), (50, 49.0));
    }
}
