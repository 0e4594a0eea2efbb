//! Outcome classification: which finished upstream requests count as failures or successes
//! ([`FailurePolicy`], [`classify`]), a stream cut after it started, and how long the upstream asked us to
//! wait ([`retry_after_ms`]).

use super::machine::Outcome;

/// Which HTTP results count as failures (see [`classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailurePolicy {
    /// Inclusive status ranges that are failures, each within 500..=599 (default `[(500, 599)]`).
    pub failure_statuses: Vec<(u32, u32)>,
    /// Whether an upstream 429 is a failure (default true).
    pub count_429: bool,
    /// Envoy response-code details or response flags that mean the upstream failed (connect failure,
    /// reset, timeout). An entry matches a comma-separated token equal to it or equal to it followed by
    /// `{…}` (e.g. `upstream_reset_before_response_started{connection_failure}`).
    pub failure_reasons: Vec<String>,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            failure_statuses: vec![(500, 599)],
            count_429: true,
            failure_reasons: [
                // Response code details.
                "upstream_reset_before_response_started",
                "upstream_reset_after_response_started",
                "upstream_response_timeout",
                // Envoy 1.40 labels a route timeout's local reply `response_timeout`.
                "response_timeout",
                "upstream_per_try_timeout",
                "upstream_per_try_idle_timeout",
                "upstream_max_stream_duration_reached",
                "no_healthy_upstream",
                // Response flags.
                "UF",
                "UH",
                "UT",
                "UC",
                "UR",
                "URX",
                "UPE",
                "UMSDR",
            ]
            .iter()
            .map(|s| (*s).to_string())
            .collect(),
        }
    }
}

impl FailurePolicy {
    /// Checks meaning; the error names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        for (i, (lo, hi)) in self.failure_statuses.iter().enumerate() {
            if !(500..=599).contains(lo) || !(500..=599).contains(hi) || lo > hi {
                return Err(format!(
                    "failure_statuses[{i}] must be a range lo..=hi within 500..=599"
                ));
            }
        }
        for (i, r) in self.failure_reasons.iter().enumerate() {
            if r.trim().is_empty() {
                return Err(format!("failure_reasons[{i}] must not be empty"));
            }
        }
        Ok(())
    }

    fn is_failure_status(&self, status: u32) -> bool {
        self.failure_statuses
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&status))
    }

    fn is_failure_reason(&self, reason: &str) -> bool {
        reason.split(',').map(str::trim).any(|token| {
            self.failure_reasons.iter().any(|e| {
                token
                    .strip_prefix(e.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
            })
        })
    }
}

/// Classifies one finished upstream request; `None` means "counts neither way".
///
/// * `local_reason`: Envoy's response code details or response flags, as the host has them. `None`, `""`,
///   `"-"` and `"via_upstream"` mean the upstream answered and the status decides. A reason in
///   `policy.failure_reasons` (connect failure, reset, timeout) is a failure whatever the status; any
///   other reason is a reply made by Envoy or a filter (tokengate's own 429, a fault filter…), which says
///   nothing about the upstream: `None`.
/// * Status: 429 is a failure if `count_429`; other 4xx never count; statuses in `failure_statuses`
///   fail; 2xx/3xx succeed unless `stream_completed == Some(false)` (the upstream's stream ended without
///   its final event). Pass `None` for `stream_completed` when not streaming or when the *client* went
///   away: that is not the upstream's fault.
///
/// A failure comes back without Retry-After; attach it with [`Outcome::with_retry_after`].
pub fn classify(
    status: u32,
    local_reason: Option<&str>,
    stream_completed: Option<bool>,
    policy: &FailurePolicy,
) -> Option<Outcome> {
    let failure = Outcome::Failure {
        retry_after_ms: None,
    };
    if let Some(r) = local_reason
        .map(str::trim)
        .filter(|r| !r.is_empty() && *r != "-" && *r != "via_upstream")
    {
        return policy.is_failure_reason(r).then_some(failure);
    }
    match status {
        429 => policy.count_429.then_some(failure),
        400..=499 => None,
        s if policy.is_failure_status(s) => Some(failure),
        200..=399 if stream_completed == Some(false) => Some(failure),
        200..=399 => Some(Outcome::Success),
        _ => None,
    }
}

/// Whether a 2xx/3xx response ended because the upstream connection was reset or closed after the
/// response had started (Envoy's `upstream_reset_after_response_started{…}` details): a cut stream.
pub fn cut_after_response_started(status: u32, local_reason: Option<&str>) -> bool {
    (200..400).contains(&status)
        && local_reason.is_some_and(|r| {
            r.trim()
                .starts_with("upstream_reset_after_response_started")
        })
}

/// How long the upstream asked us to wait, in ms: the largest of `Retry-After` (delta seconds; an
/// HTTP-date or anything else is ignored) and the reset headers (`x-ratelimit-reset-requests` /
/// `-tokens` style durations such as `1s`, `6m0s`, `20ms`, `0.5s`, `1h2m`, or bare decimal seconds
/// `0.25`), rounded up to whole ms. `None` when nothing parses. The caller caps it at `max_recovery_ms`.
pub fn retry_after_ms(retry_after: Option<&str>, reset_headers: &[&str]) -> Option<u64> {
    let from_retry_after = retry_after.and_then(parse_delta_seconds);
    reset_headers
        .iter()
        .filter_map(|h| parse_duration_ms(h))
        .chain(from_retry_after)
        .max()
}

/// `Retry-After` delta-seconds: ASCII digits only.
fn parse_delta_seconds(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // All digits: a parse error can only be overflow.
    let secs = v.parse::<u64>().unwrap_or(u64::MAX);
    Some(secs.saturating_mul(1000))
}

/// A Go-style duration (`1h2m3.5s`, `20ms`, `100us`) or bare decimal seconds, in ms rounded up.
fn parse_duration_ms(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    let mut rest = v;
    let mut total_ms = 0.0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        if !num.bytes().any(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            // Bare number: seconds, and only as the whole value.
            "" if num_len == v.len() => 1000.0,
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1000.0,
            "ms" => 1.0,
            "us" | "µs" => 0.001,
            "ns" => 0.000_001,
            _ => return None,
        };
        total_ms += n * scale;
        rest = tail;
    }
    if !total_ms.is_finite() || total_ms < 0.0 {
        return None;
    }
    // `as` saturates at u64::MAX for huge values.
    Some(total_ms.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn a_cut_stream_is_a_reset_after_a_successful_start() {
        let cut = Some("upstream_reset_after_response_started{connection_termination}");
        assert!(cut_after_response_started(200, cut));
        assert!(!cut_after_response_started(503, cut));
        assert!(!cut_after_response_started(
            200,
            Some("upstream_reset_before_response_started{connection_termination}")
        ));
        assert!(!cut_after_response_started(200, Some("via_upstream")));
        assert!(!cut_after_response_started(200, None));
    }

    #[test]
    fn classify_table() {
        let p = FailurePolicy::default();
        let f = Some(fail());
        let ok = Some(Outcome::Success);
        type Case<'a> = (u32, Option<&'a str>, Option<bool>, Option<Outcome>);
        let cases: Vec<Case> = vec![
            (500, None, None, f),
            (502, None, None, f),
            (503, Some("via_upstream"), None, f),
            (504, None, None, f),
            (429, None, None, f),
            (400, None, None, None),
            (401, None, None, None),
            (404, None, None, None),
            (200, None, Some(true), ok),
            (200, None, None, ok),
            (302, Some("-"), None, ok),
            (200, None, Some(false), f),
            (200, Some("via_upstream"), Some(false), f),
            (
                503,
                Some("upstream_reset_before_response_started{connection_failure}"),
                None,
                f,
            ),
            (
                503,
                Some("upstream_reset_before_response_started{remote_reset}"),
                None,
                f,
            ),
            (504, Some("upstream_response_timeout"), None, f),
            (503, Some("no_healthy_upstream"), None, f),
            (0, Some("UF,URX"), None, f),
            (504, Some("UT"), None, f),
            // Local replies not caused by the upstream count neither way.
            (429, Some("wasm_local_reply"), None, None),
            (503, Some("fault_filter_abort"), None, None),
            (200, Some("downstream_remote_disconnect"), Some(false), None),
            (0, Some("UFX"), None, None),
            (0, None, None, None),
        ];
        for (status, reason, done, want) in cases {
            assert_eq!(
                classify(status, reason, done, &p),
                want,
                "{status} {reason:?} {done:?}"
            );
        }
        let no429 = FailurePolicy {
            count_429: false,
            ..FailurePolicy::default()
        };
        assert_eq!(classify(429, None, None, &no429), None);
        let only_502_503 = FailurePolicy {
            failure_statuses: vec![(502, 503)],
            ..FailurePolicy::default()
        };
        assert_eq!(classify(500, None, None, &only_502_503), None);
        assert_eq!(classify(502, None, None, &only_502_503), f);
        assert_eq!(
            classify(504, Some("upstream_response_timeout"), None, &only_502_503),
            f
        );
    }

    #[test]
    fn retry_after_attaches_to_failures_only() {
        assert_eq!(fail().with_retry_after(Some(5)), fail_ra(5));
        assert_eq!(Outcome::Success.with_retry_after(Some(5)), Outcome::Success);
    }

    #[test]
    fn retry_after_ms_parsing() {
        assert_eq!(retry_after_ms(Some("7"), &[]), Some(7_000));
        assert_eq!(retry_after_ms(Some(" 7 "), &[]), Some(7_000));
        assert_eq!(retry_after_ms(Some("0"), &[]), Some(0));
        assert_eq!(retry_after_ms(Some("-1"), &[]), None);
        assert_eq!(retry_after_ms(Some("abc"), &[]), None);
        assert_eq!(retry_after_ms(Some("1.5"), &[]), None);
        assert_eq!(
            retry_after_ms(Some("Wed, 21 Oct 2015 07:28:00 GMT"), &[]),
            None
        );
        assert_eq!(
            retry_after_ms(Some("99999999999999999999999"), &[]),
            Some(u64::MAX)
        );
        assert_eq!(retry_after_ms(None, &["6m0s"]), Some(360_000));
        assert_eq!(retry_after_ms(None, &["1.5s"]), Some(1_500));
        assert_eq!(retry_after_ms(None, &["20ms"]), Some(20));
        assert_eq!(retry_after_ms(None, &["0.5s"]), Some(500));
        assert_eq!(retry_after_ms(None, &["1s"]), Some(1_000));
        assert_eq!(retry_after_ms(None, &["1h2m3s"]), Some(3_723_000));
        assert_eq!(retry_after_ms(None, &["100us"]), Some(1));
        assert_eq!(retry_after_ms(None, &["0.25"]), Some(250));
        for bad in [
            "",
            "s",
            "-1s",
            "1x",
            "1.2.3s",
            "inf",
            "1e3s",
            "2024-01-01T00:00:00Z",
            "5s3",
        ] {
            assert_eq!(retry_after_ms(None, &[bad]), None, "{bad:?}");
        }
        assert_eq!(
            retry_after_ms(Some("2"), &["20ms", "6m0s", "junk"]),
            Some(360_000)
        );
        assert_eq!(retry_after_ms(Some("120"), &["1s"]), Some(120_000));
        assert_eq!(retry_after_ms(None, &[]), None);
    }
}
