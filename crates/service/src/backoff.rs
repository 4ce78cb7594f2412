//! Waits between tries of something that fails (the store, a webhook receiver): the first wait,
//! doubled after each failure up to a cap, back to the first after a success.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first }
    }

    /// The wait before the next try.
    pub fn wait(&self) -> Duration {
        self.next
    }

    /// A try failed: the wait after it (the one before), and the next one doubles.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).clamp(self.first, self.max);
        wait
    }

    /// A try succeeded: the next failure waits the first wait again.
    pub fn succeeded(&mut self) {
        self.next = self.first;
    }

    /// Whether no try has failed since the last success.
    pub fn is_reset(&self) -> bool {
        self.next == self.first
    }

    /// The wait before try `attempts + 1` of something tried `attempts` times, with up to 20%
    /// either way, so that receivers coming back are not hit by every sender at once.
    pub fn nth_with_jitter(&self, attempts: u32) -> Duration {
        let exp = self.first.saturating_mul(1u32 << attempts.min(20)).min(self.max);
        exp.mul_f64(1.0 + fastrand::f64() * 0.4 - 0.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_and_start_over_after_a_success() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let waits: Vec<u64> = (0..5).map(|_| b.failed().as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
        assert!(!b.is_reset());
        b.succeeded();
        assert_eq!(b.wait(), Duration::from_millis(100));
        assert!(b.is_reset());
    }

    #[test]
    fn the_nth_wait_is_within_a_fifth_of_its_doubling() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(3600));
        for attempts in 0..40 {
            let exp = (1u64 << attempts.min(20)).min(3600) as f64;
            let got = b.nth_with_jitter(attempts).as_secs_f64();
            assert!(got >= exp * 0.8 - 1e-9 && got <= exp * 1.2 + 1e-9, "attempt {attempts}: {got} vs {exp}");
        }
    }
}
