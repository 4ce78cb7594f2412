//! A series' recent values, kept once for every scorer of a rule that reads them: `knn`'s lag
//! vectors and `robust_z`'s median both read the same values of `ss.v`, so they share one
//! history, as long as the longest of their windows, in `f32`, oldest first.

/// The recent values of one input of a rule's score block, for one group.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct History {
    /// Values kept at most: the longest window among the scorers that read them.
    cap: usize,
    /// The last `cap` values taken, oldest first; while `flat`, the one value every one was.
    values: Vec<f32>,
    /// Whether every value taken was the same (a series that never varied, as most of a
    /// node_exporter host's): `values` holds it once, and `run` says how many are kept.
    flat: bool,
    run: usize,
    /// Values taken since the group began: the last one's sequence number is `taken - 1`.
    taken: u64,
    /// Whether the value being judged now was taken (a value beyond `f32`'s range is not, and
    /// its readers give it no score).
    current: bool,
    /// Whether the value being judged now is the first unlike the ones before it, which were
    /// kept as one until then.
    #[serde(skip)]
    unflattened: bool,
}

impl History {
    pub fn new(cap: usize) -> Self {
        History {
            cap: cap.max(1),
            values: Vec::new(),
            flat: true,
            run: 0,
            taken: 0,
            current: false,
            unflattened: false,
        }
    }

    /// One that keeps every value even while they are all the same, to check that keeping a
    /// flat series as one value changes no score.
    #[cfg(test)]
    pub fn never_flat(cap: usize) -> Self {
        History { flat: false, ..History::new(cap) }
    }

    /// Takes the value the window that just closed is judged by, before any reader reads it.
    pub fn take(&mut self, x: f64) {
        let v = x as f32;
        self.current = v.is_finite();
        self.unflattened = false;
        if !self.current {
            return;
        }
        self.taken += 1;
        if self.flat {
            if self.values.first().is_none_or(|c| *c == v) {
                if self.values.is_empty() {
                    self.values = vec![v];
                }
                self.run = (self.run + 1).min(self.cap);
                return;
            }
            // The first value unlike the others: the run is written out, and kept from now on.
            self.values = vec![self.values[0]; self.run];
            self.flat = false;
            self.unflattened = true;
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
    }

    /// The values kept, the one being judged last when it was taken; for a flat history, see
    /// [`History::flat`].
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// The one value every value kept is, while they are all the same.
    pub fn flat(&self) -> Option<f32> {
        if self.flat {
            self.values.first().copied()
        } else {
            None
        }
    }

    /// Whether the values before the one being judged were all the same (kept as one until it
    /// came): a reader that kept nothing of its own for them then builds it.
    pub fn unflattened(&self) -> bool {
        self.unflattened
    }

    /// How many values are kept.
    pub fn kept(&self) -> usize {
        if self.flat {
            self.run
        } else {
            self.values.len()
        }
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
        super::heap(&self.values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_series_is_one_value_until_it_moves() {
        let mut h = History::new(20);
        for _ in 0..50 {
            h.take(3.0);
        }
        assert_eq!((h.flat(), h.kept(), h.taken(), h.values.capacity()), (Some(3.0), 20, 50, 1));
        h.take(4.0);
        assert!(h.unflattened());
        assert_eq!(h.flat(), None);
        let mut want = vec![3.0; 19];
        want.push(4.0);
        assert_eq!(h.values(), want.as_slice());
        h.take(3.0);
        assert!(!h.unflattened() && h.flat().is_none(), "once it moved, every value is kept");
    }

    #[test]
    fn it_keeps_the_last_values_and_grows_only_to_its_window() {
        let mut h = History::never_flat(20);
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
