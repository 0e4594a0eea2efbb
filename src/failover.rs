//! Which upstream (cluster or model) a request goes to when circuit breakers are open: pure chain
//! walking over [`crate::breaker`] states, plus taking the admission (and probe permit) once the request
//! is certain to be sent.
//!
//! Two steps, so that a probe permit is never taken by a request that a bucket then rejects:
//! 1. [`peek_chain`] (read-only): starting from the primary, follow fallbacks while the breaker would
//!    reject now, at most `max_fallback_hops` times. Gives the target, or the primary's `reset_in` when the
//!    whole chain is open.
//! 2. [`admit`] (after the bucket admitted): one CAS on the target's breaker; this is what moves
//!    OPEN → HALF_OPEN and takes a probe permit. If it rejects (another worker took the last permit in
//!    between), the caller refunds the bucket and answers 503.
//!
//! Keys are `tg:cb:<scope>=<name>`; their number is bounded by `breaker.max_keys` through a shared
//! count (`tg:n:breakers`): a name beyond it is not tracked (admitted, counted).

use crate::admission::claim_slot;
use crate::admission::KeySet;
use crate::breaker::{self, Admission, State, Transition};
use crate::config::BreakerSettings;
use crate::store::{self, SharedStore};

/// Shared count of created breaker keys ([`crate::keys::BREAKER_COUNTER`]).
pub const BREAKER_KEY_COUNTER: &str = crate::keys::BREAKER_COUNTER;

/// Gives the fallback of a name and, for clusters, the route-header value that selects it.
pub type NextFn<'a> = &'a dyn Fn(&str) -> Option<(String, Option<String>)>;

/// The target chosen by [`peek_chain`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Cluster or model to use.
    pub target: String,
    /// The primary it replaces, when a fallback was taken.
    pub from: Option<String>,
    /// Route-header value for a cluster fallback.
    pub route: Option<String>,
    /// The target's breaker was read CLOSED: [`admit`] may take the admission without reading it again.
    pub closed: bool,
}

/// Follows fallbacks while breakers would reject. `next(name)` gives the fallback and its route value.
/// `Err(reset_in_ms)` of the primary when every candidate is open.
pub fn peek_chain(
    store: &dyn SharedStore,
    settings: &BreakerSettings,
    scope: &str,
    primary: &str,
    next: NextFn<'_>,
    now_ns: u64,
) -> Result<Choice, u64> {
    let mut name = primary.to_string();
    let mut route = None;
    let mut primary_reset = None;
    let mut seen = vec![name.clone()];
    for hop in 0..=settings.max_fallback_hops {
        let key = breaker::key(scope, &name);
        let (reset, closed) = match store::peek::<breaker::BreakerState>(store, &key) {
            Ok((Some(st), _)) => (
                breaker::peek_state(&st, &settings.cfg, now_ns).1,
                st.state() == State::Closed,
            ),
            // Missing, corrupt or unreadable: nothing says it is open.
            _ => (0, false),
        };
        if reset == 0 {
            return Ok(Choice {
                from: (hop > 0).then(|| primary.to_string()),
                target: name,
                route,
                closed,
            });
        }
        primary_reset.get_or_insert(reset);
        match next(&name) {
            Some((n, r)) if !seen.contains(&n) => {
                seen.push(n.clone());
                name = n;
                route = r;
            }
            _ => break,
        }
    }
    Err(primary_reset.unwrap_or(1))
}

/// The result of [`admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The breaker key, `None` when the name was beyond `max_keys` (untracked).
    pub key: Option<String>,
    /// This request holds a HALF_OPEN probe permit.
    pub probe: bool,
}

/// Takes the admission on `name`'s breaker. `Err(reset_in_ms)` when it rejects.
///
/// `seen_closed`: the caller read this breaker CLOSED a moment ago ([`Choice::closed`]). A CLOSED
/// breaker admits without a state change, so when its key is known to exist the admission is taken
/// without reading it again (one shared-data read less per request). A breaker that opened in between
/// lets this one request through, as if it had arrived a moment earlier.
#[allow(clippy::too_many_arguments)]
pub fn admit(
    store: &dyn SharedStore,
    settings: &BreakerSettings,
    scope: &str,
    name: &str,
    now_ns: u64,
    retries: u32,
    known: &mut KeySet,
    cache_limit: usize,
    seen_closed: bool,
) -> (Result<Admitted, u64>, Option<Transition>) {
    let key = breaker::key(scope, name);
    if seen_closed && known.contains(&key) {
        return (
            Ok(Admitted {
                key: Some(key),
                probe: false,
            }),
            None,
        );
    }
    if !claim_slot(
        store,
        BREAKER_KEY_COUNTER,
        settings.max_keys,
        retries,
        known,
        cache_limit,
        &key,
    ) {
        return (
            Ok(Admitted {
                key: None,
                probe: false,
            }),
            None,
        );
    }
    match breaker::admit_shared(store, &key, &settings.cfg, now_ns, retries) {
        Ok((Admission::Allowed, t, _)) => (
            Ok(Admitted {
                key: Some(key),
                probe: false,
            }),
            t,
        ),
        Ok((Admission::Probe, t, _)) => (
            Ok(Admitted {
                key: Some(key),
                probe: true,
            }),
            t,
        ),
        Ok((Admission::Rejected { reset_in_ms }, t, _)) => (Err(reset_in_ms.max(1)), t),
        // The store failed: the breaker cannot say no; let the request through untracked.
        Err(_) => (
            Ok(Admitted {
                key: None,
                probe: false,
            }),
            None,
        ),
    }
}

/// Gauge value of a state (0 closed, 1 open, 2 half-open).
pub fn gauge(state: State) -> u64 {
    state.as_gauge()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::Outcome;
    use crate::config;
    use crate::store::MemStore;

    const MS: u64 = 1_000_000;

    fn settings() -> BreakerSettings {
        config::parse(
            br#"{"breaker":{"failure_threshold":2,"recovery_ms":1000,"half_open_max_calls":2,
                "model_fallbacks":{"a":"b","b":"c"},"max_fallback_hops":1},
                "rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap()
        .breaker
        .unwrap()
    }

    fn open(s: &MemStore, st: &BreakerSettings, name: &str, now: u64) {
        let key = breaker::key("model", name);
        for _ in 0..2 {
            breaker::record_shared(
                s,
                &key,
                &st.cfg,
                Outcome::Failure {
                    retry_after_ms: None,
                },
                false,
                now,
                8,
            )
            .unwrap();
        }
    }

    fn next(st: &BreakerSettings) -> impl Fn(&str) -> Option<(String, Option<String>)> + '_ {
        move |m| st.model_fallback(m).map(|t| (t.to_string(), None))
    }

    #[test]
    fn closed_primary_is_chosen_without_fallback() {
        let s = MemStore::new();
        let st = settings();
        let c = peek_chain(&s, &st, "model", "a", &next(&st), 0).unwrap();
        assert_eq!(c.target, "a");
        assert_eq!(c.from, None);
        assert!(s.is_empty(), "peeking must not create keys");
    }

    #[test]
    fn open_primary_falls_back_one_hop_only() {
        let s = MemStore::new();
        let st = settings();
        open(&s, &st, "a", 0);
        let c = peek_chain(&s, &st, "model", "a", &next(&st), MS).unwrap();
        assert_eq!((c.target.as_str(), c.from.as_deref()), ("b", Some("a")));
        open(&s, &st, "b", 0);
        // b's own fallback c is two hops away: not followed with max_fallback_hops = 1
        let r = peek_chain(&s, &st, "model", "a", &next(&st), MS).unwrap_err();
        assert!(r > 900 && r <= 1000, "{r}");
    }

    #[test]
    fn a_breaker_seen_closed_admits_without_a_read_only_once_its_key_is_known() {
        let s = MemStore::new();
        let st = settings();
        let mut known = KeySet::default();
        // Missing key: peek does not call it closed; admit creates and caches the key.
        let c = peek_chain(&s, &st, "model", "a", &next(&st), 0).unwrap();
        assert!(!c.closed);
        let a = admit(&s, &st, "model", "a", 0, 8, &mut known, 100, c.closed)
            .0
            .unwrap();
        assert_eq!(a.key.as_deref(), Some(breaker::key("model", "a").as_str()));
        let c = peek_chain(&s, &st, "model", "a", &next(&st), 0).unwrap();
        assert!(c.closed);
        let reads = s.reads();
        let a = admit(&s, &st, "model", "a", 0, 8, &mut known, 100, c.closed)
            .0
            .unwrap();
        assert!(!a.probe);
        assert_eq!(
            s.reads(),
            reads,
            "no shared-data read for a breaker seen closed"
        );
        // An open breaker is never reported closed.
        open(&s, &st, "a", 0);
        let c = peek_chain(&s, &st, "model", "a", &next(&st), MS).unwrap();
        assert_eq!((c.target.as_str(), c.closed), ("b", false));
    }

    #[test]
    fn admit_after_recovery_takes_exactly_the_probe_permits() {
        let s = MemStore::new();
        let st = settings();
        open(&s, &st, "a", 0);
        let mut known = KeySet::default();
        let mut probes = 0;
        let mut rejected = 0;
        for _ in 0..5 {
            match admit(&s, &st, "model", "a", 1001 * MS, 8, &mut known, 100, false).0 {
                Ok(a) if a.probe => probes += 1,
                Ok(_) => panic!("half-open must only admit probes"),
                Err(_) => rejected += 1,
            }
        }
        assert_eq!((probes, rejected), (2, 3));
    }

    #[test]
    fn breaker_keys_beyond_the_bound_are_untracked() {
        let s = MemStore::new();
        let mut st = settings();
        st.max_keys = 1;
        let mut known = KeySet::default();
        let a = admit(&s, &st, "model", "x", 0, 8, &mut known, 100, false)
            .0
            .unwrap();
        assert!(a.key.is_some());
        let b = admit(&s, &st, "model", "y", 0, 8, &mut known, 100, false)
            .0
            .unwrap();
        assert_eq!(b.key, None);
    }
}
