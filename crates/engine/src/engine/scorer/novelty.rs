//! `novelty`: how far a value falls outside the range the series has covered over about its last
//! `window` values, in widths of that range (0 inside it).
//!
//! The range is kept as the extremes of 32 blocks of `window / 32` values, so the state is a
//! few hundred bytes whatever the window and the oldest block leaves whole.

use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Novelty {
    block: usize,
    warmup: usize,
    /// Closed blocks' (min, max), oldest first.
    blocks: VecDeque<(f64, f64)>,
    /// The block being filled: (min, max, values).
    open: (f64, f64, usize),
    seen: u64,
    /// The range the last value was judged against.
    pub low: f64,
    pub high: f64,
}

const BLOCKS: usize = 32;

impl Novelty {
    pub fn new(window: usize, warmup: usize) -> Self {
        Novelty {
            block: window.div_ceil(BLOCKS).max(1),
            warmup: warmup.max(2),
            blocks: VecDeque::with_capacity(BLOCKS),
            open: (f64::INFINITY, f64::NEG_INFINITY, 0),
            seen: 0,
            low: f64::NAN,
            high: f64::NAN,
        }
    }

    pub fn update(&mut self, x: f64) -> Option<f64> {
        let out = (self.seen >= self.warmup as u64).then(|| {
            let (lo, hi) =
                self.blocks.iter().fold((self.open.0, self.open.1), |(lo, hi), (a, b)| (lo.min(*a), hi.max(*b)));
            self.low = lo;
            self.high = hi;
            let width = (hi - lo).max(f64::EPSILON * hi.abs().max(lo.abs()).max(1.0));
            if x > hi {
                (x - hi) / width
            } else if x < lo {
                (lo - x) / width
            } else {
                0.0
            }
        });
        self.seen += 1;
        self.open = (self.open.0.min(x), self.open.1.max(x), self.open.2 + 1);
        if self.open.2 == self.block {
            if self.blocks.len() == BLOCKS {
                self.blocks.pop_front();
            }
            self.blocks.push_back((self.open.0, self.open.1));
            self.open = (f64::INFINITY, f64::NEG_INFINITY, 0);
        }
        out
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_outside_the_range_in_widths() {
        let mut n = Novelty::new(64, 4);
        for x in [10.0, 12.0, 11.0, 14.0] {
            assert_eq!(n.update(x), None);
        }
        assert_eq!(n.update(13.0), Some(0.0));
        assert_eq!(n.update(16.0), Some(0.5), "2 above a range 4 wide");
        assert_eq!(n.update(6.0), Some(4.0 / 6.0), "the range now reaches 16");
        assert_eq!((n.low, n.high), (10.0, 16.0));
    }

    #[test]
    fn old_blocks_leave_the_range() {
        // Blocks of 2 values, 32 of them: 64 values remembered.
        let mut n = Novelty::new(64, 2);
        n.update(100.0);
        for _ in 0..80 {
            n.update(1.0);
        }
        assert_eq!(n.update(50.0), Some(49.0 / (f64::EPSILON)), "100 is forgotten; 1 is all there is");
    }
}
