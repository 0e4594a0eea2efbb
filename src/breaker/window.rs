//! The sliding failure window of a breaker: [`BUCKETS`] sub-windows of `window_ms / BUCKETS` each. Each
//! sub-window remembers its epoch index (`now / width`), so a stale one is recognised and reset instead of
//! being summed: the window covers between 11/12 and 12/12 of `window_ms`. A window counted with another
//! width (the config changed) is discarded.
//!
//! A leaf of the breaker: it reads the part of a breaker's config it needs as a [`Rule`]
//! (`BreakerConfig::rule`), so the state machine imports the window and never the other way round.

use super::NS_PER_MS;

/// Number of sub-windows in the sliding failure window.
pub const BUCKETS: usize = 12;

/// Why the window says "open": the failure count reached `failure_threshold`.
pub(super) const REASON_THRESHOLD: &str = "failure_threshold";
/// Why the window says "open": the failure rate reached `failure_rate_percent`.
pub(super) const REASON_RATE: &str = "failure_rate";

/// What a window is counted with, and when it says "open": the fields of a `BreakerConfig` it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rule {
    /// Length of the window in ms (its sub-windows are `window_ms / BUCKETS` wide).
    pub(super) window_ms: u64,
    /// Failures in the window that say "open" (`u32::MAX`: only the rate does).
    pub(super) failure_threshold: u32,
    /// Failure share in percent that says "open" over at least `min_requests` outcomes (`None`: off).
    pub(super) failure_rate_percent: Option<u32>,
    /// Outcomes the window must hold before the rate applies.
    pub(super) min_requests: u32,
}

/// One sub-window of the sliding window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Bucket {
    /// `now_ns / bucket_ns` of the sub-window these counts belong to.
    pub(super) epoch: u64,
    pub(super) successes: u32,
    pub(super) failures: u32,
}

/// The outcomes counted in the last `window_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Window {
    /// Sub-window width the buckets were counted with (a config change resets them).
    pub(super) bucket_ns: u64,
    pub(super) buckets: [Bucket; BUCKETS],
}

/// Width of one sub-window in ns of a window `window_ms` long (never 0, even for an unvalidated config).
pub(super) fn bucket_ns(window_ms: u64) -> u64 {
    (window_ms.saturating_mul(NS_PER_MS) / BUCKETS as u64).max(1)
}

/// The sub-window `now_ns` falls in, for sub-windows `bucket_ns` wide: (its slot, its epoch).
pub(super) fn slot_at(bucket_ns: u64, now_ns: u64) -> (usize, u64) {
    let cur = now_ns / bucket_ns.max(1);
    (usize::try_from(cur % BUCKETS as u64).unwrap_or(0), cur)
}

/// Whether a sub-window of epoch `epoch` is in the window whose latest sub-window is `cur`: one of the
/// last [`BUCKETS`] epochs (or one ahead, for a worker whose clock read came a little later).
pub(super) fn in_window(epoch: u64, cur: u64) -> bool {
    epoch.saturating_add(BUCKETS as u64) > cur && epoch <= cur.saturating_add(1)
}

impl Window {
    /// (successes, failures) in the window ending at `now_ns`, as counted under `rule`.
    pub(super) fn counts(&self, rule: &Rule, now_ns: u64) -> (u64, u64) {
        let bucket_ns = bucket_ns(rule.window_ms);
        if self.bucket_ns != bucket_ns {
            return (0, 0);
        }
        let (_, cur) = slot_at(bucket_ns, now_ns);
        self.buckets
            .iter()
            .filter(|b| in_window(b.epoch, cur))
            .fold((0, 0), |(s, f), b| {
                (s + u64::from(b.successes), f + u64::from(b.failures))
            })
    }

    /// Adds one outcome to the sub-window of `now_ns`, resetting it first if it held an older epoch.
    pub(super) fn count(&mut self, rule: &Rule, now_ns: u64, success: bool) {
        if success {
            self.add_successes(rule, now_ns, 1);
        } else {
            self.add(rule, now_ns, 0, 1);
        }
    }

    /// Adds `n` successes to the sub-window of `now_ns`.
    pub(super) fn add_successes(&mut self, rule: &Rule, now_ns: u64, n: u32) {
        self.add(rule, now_ns, n, 0);
    }

    fn add(&mut self, rule: &Rule, now_ns: u64, successes: u32, failures: u32) {
        let bucket_ns = bucket_ns(rule.window_ms);
        if self.bucket_ns != bucket_ns {
            // The window was counted with another width (config changed): its epochs mean nothing now.
            self.buckets = [Bucket::default(); BUCKETS];
            self.bucket_ns = bucket_ns;
        }
        let (slot, cur) = slot_at(bucket_ns, now_ns);
        if let Some(b) = self.buckets.get_mut(slot) {
            if b.epoch != cur {
                *b = Bucket {
                    epoch: cur,
                    ..Bucket::default()
                };
            }
            b.successes = b.successes.saturating_add(successes);
            b.failures = b.failures.saturating_add(failures);
        }
    }

    /// Why the window says "open", if it does.
    pub(super) fn trip_reason(&self, rule: &Rule, now_ns: u64) -> Option<&'static str> {
        let (successes, failures) = self.counts(rule, now_ns);
        if failures >= u64::from(rule.failure_threshold.max(1)) {
            return Some(REASON_THRESHOLD);
        }
        let pct = u64::from(rule.failure_rate_percent?);
        let total = successes + failures;
        (total >= u64::from(rule.min_requests.max(1)) && failures * 100 >= pct * total)
            .then_some(REASON_RATE)
    }

    /// An empty window of the same width.
    pub(super) fn cleared(&self) -> Window {
        Window {
            bucket_ns: self.bucket_ns,
            ..Window::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;

    #[test]
    fn old_failures_slide_out_of_the_window() {
        let c = cfg();
        let mut s = BreakerState::default();
        for _ in 0..4 {
            rec(&mut s, &c, fail(), false, T0);
        }
        // 61 s later the four failures are outside the 60 s window.
        assert_eq!(rec(&mut s, &c, fail(), false, T0 + 61 * S), None);
        assert_eq!(s.state(), State::Closed);
        assert_eq!(s.window_counts(&c, T0 + 61 * S), (0, 1));
        // Four more close together do open it.
        for _ in 0..3 {
            assert_eq!(rec(&mut s, &c, fail(), false, T0 + 62 * S), None);
        }
        assert!(rec(&mut s, &c, fail(), false, T0 + 62 * S).is_some());
    }

    #[test]
    fn a_slot_reused_after_a_full_turn_forgets_its_old_counts() {
        let c = cfg();
        let mut s = BreakerState::default();
        rec(&mut s, &c, fail(), false, T0);
        rec(&mut s, &c, fail(), false, T0);
        // Exactly one window later: the same slot, a new epoch.
        rec(&mut s, &c, fail(), false, T0 + 60 * S);
        assert_eq!(s.window_counts(&c, T0 + 60 * S), (0, 1));
    }

    #[test]
    fn successes_are_not_written_without_a_rate_rule() {
        let c = cfg();
        let s = BreakerState::default();
        assert_eq!(record(&s, &c, Outcome::Success, false, T0), (None, None));
    }

    #[test]
    fn window_counted_with_another_width_is_discarded() {
        let c = cfg();
        let mut s = BreakerState::default();
        for _ in 0..4 {
            rec(&mut s, &c, fail(), false, T0);
        }
        let c2 = BreakerConfig {
            window_ms: 120_000,
            ..cfg()
        };
        assert_eq!(s.window_counts(&c2, T0), (0, 0));
        assert_eq!(rec(&mut s, &c2, fail(), false, T0), None);
        assert_eq!(s.window_counts(&c2, T0), (0, 1));
    }
}
