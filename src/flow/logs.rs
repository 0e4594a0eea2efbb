//! Rate-limited logging of failing dependencies: per cause, the first occurrence is logged, later ones
//! within [`WINDOW_NS`] are only counted (`tokengate_logs_suppressed`), and the next line logged for that
//! cause (or the root tick's [`LogGate::summaries`]) says how many were suppressed.
//!
//! A Redis outage at 1,000 requests/s then writes about one line per cause every 10 s instead of a
//! thousand a second:
//! ```text
//! quota check failed at cluster 'webdis' (the shim answered 503); admitting (on_failure=open)
//! quota check failed at cluster 'webdis' (the shim answered 503); admitting (on_failure=open) (9871 more like it suppressed)
//! ```

/// One line per cause per this many ns at most.
pub const WINDOW_NS: u64 = 10_000_000_000;
/// Causes tracked at most (a bound: causes are static strings, so this is never reached in practice).
pub const MAX_CAUSES: usize = 64;

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Log it; `suppressed` lines of this cause were dropped since the last one logged.
    Log {
        /// Lines dropped since the last one.
        suppressed: u64,
    },
    /// Drop it (counted).
    Suppress,
}

/// Per-cause log rate limiter (one per VM): `(cause, last logged ns, suppressed since)`.
#[derive(Debug, Default)]
pub struct LogGate {
    causes: Vec<(&'static str, u64, u64)>,
}

impl LogGate {
    /// Whether a line of `cause` is logged at `now_ns`.
    pub fn admit(&mut self, cause: &'static str, now_ns: u64) -> Gate {
        let i = match self.causes.iter().position(|(c, ..)| *c == cause) {
            Some(i) => i,
            None => {
                if self.causes.len() >= MAX_CAUSES {
                    self.causes.clear();
                }
                self.causes.push((cause, 0, 0));
                self.causes.len() - 1
            }
        };
        let Some(entry) = self.causes.get_mut(i) else {
            return Gate::Log { suppressed: 0 };
        };
        let (_, last, suppressed) = *entry;
        if last == 0 || now_ns.saturating_sub(last) >= WINDOW_NS {
            entry.1 = now_ns.max(1);
            entry.2 = 0;
            Gate::Log { suppressed }
        } else {
            entry.2 = suppressed.saturating_add(1);
            Gate::Suppress
        }
    }

    /// Summary lines for causes whose window ended with lines suppressed: `(cause, count)`. The cause's
    /// window restarts, so a continuing outage still logs its next line at once.
    pub fn summaries(&mut self, now_ns: u64) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        for (cause, last, suppressed) in self.causes.iter_mut() {
            if *suppressed > 0 && now_ns.saturating_sub(*last) >= WINDOW_NS {
                out.push((*cause, *suppressed));
                *suppressed = 0;
                *last = 0;
            }
        }
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn first_line_of_a_cause_is_logged_then_suppressed_within_the_window() {
        let mut g = LogGate::default();
        assert_eq!(g.admit("quota", S), Gate::Log { suppressed: 0 });
        for i in 1..1000 {
            assert_eq!(g.admit("quota", S + i * 1_000_000), Gate::Suppress);
        }
        // Another cause is independent.
        assert_eq!(g.admit("global", 2 * S), Gate::Log { suppressed: 0 });
        assert_eq!(
            g.admit("quota", S + WINDOW_NS),
            Gate::Log { suppressed: 999 }
        );
    }

    #[test]
    fn summaries_report_suppressed_lines_once_the_window_ends() {
        let mut g = LogGate::default();
        g.admit("quota", S);
        g.admit("quota", S + 1);
        g.admit("quota", S + 2);
        assert!(g.summaries(S + 5).is_empty());
        assert_eq!(g.summaries(S + WINDOW_NS), vec![("quota", 2)]);
        assert!(g.summaries(S + 2 * WINDOW_NS).is_empty());
        // The window restarted: the next line is logged at once.
        assert_eq!(
            g.admit("quota", S + WINDOW_NS + 3),
            Gate::Log { suppressed: 0 }
        );
    }
}
