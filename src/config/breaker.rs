//! `breaker`: the circuit breakers on upstream clusters and models, what counts as a failure, and the
//! fallbacks taken while one is open:
//! `"breaker": {"keys": ["cluster", "model"], "recovery_ms": 30000,
//! "cluster_fallbacks": {"openai": {"cluster": "azure", "route": "azure"}},
//! "model_fallbacks": {"gpt-4.1": "gpt-4.1-mini"}}`.
//!
//! A breaker opens on a failure *rate* unless the section asks for a count ([`BreakerMode`]):
//!
//! | fields given | opens when |
//! |---|---|
//! | none of the two (`{}`) | 50 % of at least 20 outcomes in 30 s fail |
//! | `failure_rate_percent` (± `min_requests`, `window_ms`) | that rate (window 30 s unless given) |
//! | `failure_rate_percent` and `failure_threshold` | that rate, or that many failures |
//! | `failure_threshold` alone | that many failures in `window_ms` (60 s unless given): the count mode |
//!
//! (Before, a section without `failure_rate_percent` fell back to 5 failures in 60 s: at 30 % upstream
//! failures that refused nearly every request, healthy ones too. A `failure_threshold` given without a
//! rate keeps that meaning, so every section that loaded before loads, and means what it meant, except
//! one that gave neither — now the rate mode — or a rate without `window_ms` — now over 30 s, was 60 s.)

use super::fields::{exact_model, header_name, in_range, prefixed_err};
use super::shape::UniqueMap;
use super::{err, ConfigError};
use crate::breaker::{BreakerConfig, FailurePolicy};
use serde::Deserialize;

/// Which breaker keys are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerKeys {
    /// One breaker per upstream cluster (checked in the headers phase).
    pub cluster: bool,
    /// One breaker per model (checked once the body is read).
    pub model: bool,
}

/// A fallback cluster for when a cluster's breaker is open.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFallback {
    /// The cluster whose breaker is open.
    pub from: String,
    /// The cluster Envoy routes to when the route header carries `route`.
    pub to: String,
    /// Value written into the route header so Envoy's route table picks `to`.
    pub route: String,
}

/// Validated circuit-breaker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSettings {
    /// Which rule opens the breakers.
    pub mode: BreakerMode,
    /// State-machine tuning.
    pub cfg: BreakerConfig,
    /// What counts as a failure.
    pub policy: FailurePolicy,
    /// Count a stream that ends without its final event as a failure.
    pub count_incomplete_streams: bool,
    /// Which keys.
    pub keys: BreakerKeys,
    /// Request header the route table matches for cluster fallbacks.
    pub route_header: String,
    /// Cluster fallbacks.
    pub cluster_fallbacks: Vec<ClusterFallback>,
    /// Model fallbacks on the same cluster (body `model` rewritten).
    pub model_fallbacks: Vec<(String, String)>,
    /// Longest fallback chain followed (default 1).
    pub max_fallback_hops: u32,
    /// Most breaker keys created (bounded: shared data never evicts).
    pub max_keys: u32,
}

impl BreakerSettings {
    /// The fallback of a cluster.
    pub fn cluster_fallback(&self, from: &str) -> Option<&ClusterFallback> {
        self.cluster_fallbacks.iter().find(|f| f.from == from)
    }
    /// The fallback of a model.
    pub fn model_fallback(&self, from: &str) -> Option<&str> {
        self.model_fallbacks
            .iter()
            .find(|(f, _)| f == from)
            .map(|(_, t)| t.as_str())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
pub(super) struct RawBreaker {
    keys: Option<Vec<String>>,
    failure_threshold: Option<u32>,
    window_ms: Option<u64>,
    failure_rate_percent: Option<u32>,
    min_requests: Option<u32>,
    recovery_ms: Option<u64>,
    max_recovery_ms: Option<u64>,
    backoff_multiplier: Option<f64>,
    half_open_max_calls: Option<u32>,
    half_open_successes_to_close: Option<u32>,
    probe_timeout_ms: Option<u64>,
    failure_statuses: Option<Vec<[u32; 2]>>,
    count_429: Option<bool>,
    count_incomplete_streams: Option<bool>,
    route_header: Option<String>,
    #[serde(default)]
    cluster_fallbacks: UniqueMap<RawClusterFallback>,
    #[serde(default)]
    model_fallbacks: UniqueMap<String>,
    max_fallback_hops: Option<u32>,
    max_keys: Option<u32>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object {\"cluster\": …, \"route\": …}"
)]
struct RawClusterFallback {
    cluster: String,
    route: String,
}

/// `failure_rate_percent` of a `breaker` section in the rate mode that names none (the shipped threshold).
pub const DEFAULT_FAILURE_RATE_PERCENT: u32 = 50;
/// `window_ms` of a `breaker` section in the rate mode that names none.
pub const DEFAULT_RATE_WINDOW_MS: u64 = 30_000;

/// Which rule opens a breaker, from the fields a `breaker` section gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerMode {
    /// `failure_rate_percent` (default 50) of at least `min_requests` (20) in `window_ms` (30 000), and
    /// `failure_threshold` failures too when one is given: the default.
    Rate,
    /// `failure_threshold` failures in `window_ms` (60 000) only: asked for by a `failure_threshold`
    /// without a `failure_rate_percent`. Successes are never counted (no shared-data write for them).
    Count,
}

impl BreakerMode {
    /// The mode of a section with these fields: the count mode only when asked for.
    pub fn of(failure_threshold: Option<u32>, failure_rate_percent: Option<u32>) -> Self {
        match (failure_threshold, failure_rate_percent) {
            (Some(_), None) => BreakerMode::Count,
            _ => BreakerMode::Rate,
        }
    }
}

/// Validates the `breaker` section.
pub(super) fn breaker(raw: RawBreaker) -> Result<BreakerSettings, ConfigError> {
    let d = BreakerConfig::default();
    let mode = BreakerMode::of(raw.failure_threshold, raw.failure_rate_percent);
    let (failure_threshold, failure_rate_percent, window_ms) = match mode {
        // Only the rate opens the breaker (a busy upstream with a few failures in many requests stays
        // closed) unless a count is given too.
        BreakerMode::Rate => (
            raw.failure_threshold.unwrap_or(u32::MAX),
            Some(
                raw.failure_rate_percent
                    .unwrap_or(DEFAULT_FAILURE_RATE_PERCENT),
            ),
            raw.window_ms.unwrap_or(DEFAULT_RATE_WINDOW_MS),
        ),
        BreakerMode::Count => (
            raw.failure_threshold.unwrap_or(d.failure_threshold),
            None,
            raw.window_ms.unwrap_or(d.window_ms),
        ),
    };
    let cfg = BreakerConfig {
        failure_threshold,
        window_ms,
        failure_rate_percent,
        min_requests: raw.min_requests.unwrap_or(d.min_requests),
        recovery_ms: raw.recovery_ms.unwrap_or(d.recovery_ms),
        max_recovery_ms: raw
            .max_recovery_ms
            .unwrap_or(d.max_recovery_ms.max(raw.recovery_ms.unwrap_or(0))),
        backoff_multiplier: raw.backoff_multiplier.unwrap_or(d.backoff_multiplier),
        half_open_max_calls: raw.half_open_max_calls.unwrap_or(d.half_open_max_calls),
        half_open_successes_to_close: raw
            .half_open_successes_to_close
            .unwrap_or(d.half_open_successes_to_close),
        probe_timeout_ms: raw.probe_timeout_ms.unwrap_or(d.probe_timeout_ms),
    };
    cfg.validate().map_err(|e| prefixed_err("breaker", &e))?;
    let mut policy = FailurePolicy::default();
    if let Some(st) = raw.failure_statuses {
        policy.failure_statuses = st.into_iter().map(|[a, b]| (a, b)).collect();
    }
    policy.count_429 = raw.count_429.unwrap_or(true);
    policy.validate().map_err(|e| prefixed_err("breaker", &e))?;
    let keys = match raw.keys {
        None => BreakerKeys {
            cluster: true,
            model: true,
        },
        Some(list) => {
            let mut k = BreakerKeys {
                cluster: false,
                model: false,
            };
            for (i, s) in list.iter().enumerate() {
                match s.as_str() {
                    "cluster" => k.cluster = true,
                    "model" => k.model = true,
                    o => {
                        return Err(err(
                            format!("breaker.keys[{i}]"),
                            format!("'{o}' is not one of \"cluster\", \"model\""),
                        ))
                    }
                }
            }
            if !k.cluster && !k.model {
                return Err(err(
                    "breaker.keys",
                    "must name \"cluster\", \"model\" or both",
                ));
            }
            k
        }
    };
    let route_header = header_name("breaker.route_header", raw.route_header)?
        .unwrap_or_else(|| "x-tokengate-route".to_string());
    let mut cluster_fallbacks = Vec::new();
    for (from, f) in raw.cluster_fallbacks {
        if from.is_empty() || f.cluster.is_empty() || f.route.is_empty() || from == f.cluster {
            return Err(err(
                format!("breaker.cluster_fallbacks.{from}"),
                "needs a non-empty source, a different non-empty cluster and a route value",
            ));
        }
        if !f
            .route
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7F).contains(&b))
        {
            return Err(err(
                format!("breaker.cluster_fallbacks.{from}.route"),
                "must be a valid header value (visible ASCII, spaces and tabs)",
            ));
        }
        cluster_fallbacks.push(ClusterFallback {
            from,
            to: f.cluster,
            route: f.route,
        });
    }
    let mut model_fallbacks = Vec::new();
    for (from, to) in raw.model_fallbacks {
        if from.is_empty() || to.is_empty() || from == to {
            return Err(err(
                format!("breaker.model_fallbacks.{from}"),
                "needs a non-empty, different target model",
            ));
        }
        exact_model(&format!("breaker.model_fallbacks.{from}"), &from)?;
        exact_model(&format!("breaker.model_fallbacks.{from}"), &to)?;
        model_fallbacks.push((from, to));
    }
    let max_fallback_hops = in_range(
        "breaker.max_fallback_hops",
        raw.max_fallback_hops.unwrap_or(1),
        0,
        8,
    )?;
    let max_keys = in_range("breaker.max_keys", raw.max_keys.unwrap_or(1000), 1, 100_000)?;
    Ok(BreakerSettings {
        mode,
        cfg,
        policy,
        count_incomplete_streams: raw.count_incomplete_streams.unwrap_or(true),
        keys,
        route_header,
        cluster_fallbacks,
        model_fallbacks,
        max_fallback_hops,
        max_keys,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn breaker_section_is_validated_naming_the_field() {
        let base =
            |b: &str| format!(r#"{{"breaker":{b},"rules":[{{"tokens_per_second":1,"burst":1}}]}}"#);
        let c = parse_str(&base(
            r#"{"failure_threshold":2,"model_fallbacks":{"a":"b"},
            "cluster_fallbacks":{"p":{"cluster":"q","route":"fallback"}}}"#,
        ))
        .unwrap();
        let b = c.breaker.unwrap();
        assert_eq!(b.cfg.failure_threshold, 2);
        assert_eq!(b.model_fallback("a"), Some("b"));
        assert_eq!(b.cluster_fallback("p").unwrap().to, "q");
        assert!(b.keys.cluster && b.keys.model);
        let e = parse_str(&base(r#"{"half_open_max_calls":0}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.half_open_max_calls");
        let e = parse_str(&base(r#"{"failure_statuses":[[400,499]]}"#)).unwrap_err();
        assert!(e.field.starts_with("breaker.failure_statuses"), "{e}");
        let e = parse_str(&base(r#"{"keys":["route"]}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.keys[0]");
        let e = parse_str(&base(r#"{"model_fallbacks":{"a":"a"}}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.model_fallbacks.a");
        let e = parse_str(&base(r#"{"recovery_msec":1}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.recovery_msec");
    }

    fn section(b: &str) -> super::BreakerSettings {
        parse_str(&format!(
            r#"{{"breaker":{b},"rules":[{{"tokens_per_second":1,"burst":1}}]}}"#
        ))
        .unwrap()
        .breaker
        .unwrap()
    }

    #[test]
    fn a_section_without_thresholds_opens_on_half_of_at_least_twenty_in_thirty_seconds() {
        for b in [r#"{}"#, r#"{"keys":["model"],"recovery_ms":1000}"#] {
            let s = section(b);
            assert_eq!(s.mode, super::BreakerMode::Rate, "{b}");
            assert_eq!(s.cfg.failure_rate_percent, Some(50));
            assert_eq!(s.cfg.min_requests, 20);
            assert_eq!(s.cfg.window_ms, 30_000);
            assert_eq!(s.cfg.failure_threshold, u32::MAX, "no count opens it");
        }
        // The shipped block says the same in full.
        let shipped = section(r#"{"failure_rate_percent":50,"min_requests":20,"window_ms":30000}"#);
        assert_eq!(shipped.cfg, section("{}").cfg);
    }

    #[test]
    fn the_count_mode_is_a_failure_threshold_without_a_rate_and_keeps_its_old_meaning() {
        let s = section(r#"{"failure_threshold":5}"#);
        assert_eq!(s.mode, super::BreakerMode::Count);
        assert_eq!(s.cfg.failure_rate_percent, None);
        assert_eq!((s.cfg.failure_threshold, s.cfg.window_ms), (5, 60_000));
        let s = section(r#"{"failure_threshold":3,"window_ms":10000,"min_requests":4}"#);
        assert_eq!(s.mode, super::BreakerMode::Count);
        assert_eq!((s.cfg.failure_threshold, s.cfg.window_ms), (3, 10_000));
        // Both: the rate, and the count too.
        let s = section(r#"{"failure_threshold":7,"failure_rate_percent":30}"#);
        assert_eq!(s.mode, super::BreakerMode::Rate);
        assert_eq!(
            (s.cfg.failure_threshold, s.cfg.failure_rate_percent),
            (7, Some(30))
        );
        // A rate alone: only the rate, over 30 s unless told.
        let s = section(r#"{"failure_rate_percent":40,"min_requests":5}"#);
        assert_eq!(
            (s.cfg.failure_threshold, s.cfg.window_ms, s.cfg.min_requests),
            (u32::MAX, 30_000, 5)
        );
    }
}
