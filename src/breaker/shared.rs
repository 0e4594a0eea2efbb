//! The breaker in Envoy shared data: [`admit`](super::admit), [`record`](super::record) and
//! [`release_probe`](super::release_probe) as one bounded CAS read-modify-write of a key each, a corrupt
//! value repaired once, and the key names (`tg:cb:<scope>=<name>`).

use super::codec::{add_successes_in_place, InPlace};
use super::machine::{
    admit, record, record_successes, release_probe, Admission, BreakerConfig, BreakerState,
    Outcome, State, Transition,
};
use crate::store::{self, SharedStore, StoreError, UpdateError, UpdateStats};

/// Longest breaker name kept in a key, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest scope kept in a key, in bytes.
pub const MAX_SCOPE_BYTES: usize = 32;

/// [`release_probe`] as one bounded CAS read-modify-write of `key` (nothing is created).
pub fn release_probe_shared(
    store: &dyn SharedStore,
    key: &str,
    max_retries: u32,
) -> Result<(), UpdateError> {
    if !matches!(store.get(key), Ok(Some(_))) {
        return Ok(());
    }
    store::update(store, key, max_retries, &BreakerState::default(), |s| {
        ((), release_probe(s))
    })
    .map(|_| ())
}

/// A corrupt value was replaced by a fresh state in memory; make sure the key holds valid bytes so the
/// corruption is reported once, not on every request. A failure here is harmless: the next call retries.
fn repair_if_corrupt(store: &dyn SharedStore, key: &str, stats: &UpdateStats, max_retries: u32) {
    if stats.corrupt {
        let _ = store::update(store, key, max_retries, &BreakerState::default(), |s| {
            ((), Some(*s))
        });
    }
}

/// [`admit`] as one bounded CAS read-modify-write of `key` (created CLOSED when missing).
pub fn admit_shared(
    store: &dyn SharedStore,
    key: &str,
    cfg: &BreakerConfig,
    now_ns: u64,
    max_retries: u32,
) -> Result<(Admission, Option<Transition>, UpdateStats), UpdateError> {
    let ((admission, transition), stats) =
        store::update(store, key, max_retries, &BreakerState::default(), |s| {
            let (a, next, t) = admit(s, cfg, now_ns);
            ((a, t), next)
        })?;
    repair_if_corrupt(store, key, &stats, max_retries);
    Ok((admission, transition, stats))
}

/// Whether [`record`] leaves every state unchanged for this outcome: a success that was not a probe,
/// without a failure-rate threshold (CLOSED counts no successes then, OPEN ignores them, and only probes
/// count in HALF_OPEN).
pub fn record_is_noop(cfg: &BreakerConfig, outcome: Outcome, was_probe: bool) -> bool {
    matches!(outcome, Outcome::Success) && !was_probe && cfg.failure_rate_percent.is_none()
}

/// [`record`] as one bounded CAS read-modify-write of `key` (created CLOSED when missing); no host call
/// at all when [`record_is_noop`].
pub fn record_shared(
    store: &dyn SharedStore,
    key: &str,
    cfg: &BreakerConfig,
    outcome: Outcome,
    was_probe: bool,
    now_ns: u64,
    max_retries: u32,
) -> Result<(Option<Transition>, UpdateStats), UpdateError> {
    if record_is_noop(cfg, outcome, was_probe) {
        return Ok((None, UpdateStats::default()));
    }
    let (transition, stats) =
        store::update(store, key, max_retries, &BreakerState::default(), |s| {
            let (next, t) = record(s, cfg, outcome, was_probe, now_ns);
            (t, next)
        })?;
    repair_if_corrupt(store, key, &stats, max_retries);
    Ok((transition, stats))
}

/// What [`record_batch_shared`] left in the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The transition the outcome caused.
    pub transition: Option<Transition>,
    /// The state the key holds afterwards.
    pub state: State,
    /// Outcomes (successes and failures) its window holds afterwards while CLOSED; 0 otherwise.
    pub window_total: u64,
}

/// `successes` plain successes ([`record_successes`]), then the outcome of one request if given
/// (`(outcome, was_probe)`, [`record`]), as one bounded CAS read-modify-write of `key` (created CLOSED
/// when missing). Returns what the key holds afterwards and the CAS statistics.
pub fn record_batch_shared(
    store: &dyn SharedStore,
    key: &str,
    cfg: &BreakerConfig,
    successes: u32,
    outcome: Option<(Outcome, bool)>,
    now_ns: u64,
    max_retries: u32,
) -> Result<(Written, UpdateStats), UpdateError> {
    let (written, stats) = store::update(store, key, max_retries, &BreakerState::default(), |s| {
        let counted = record_successes(s, cfg, successes, now_ns);
        let base = counted.unwrap_or(*s);
        let (next, t) = match outcome {
            Some((o, probe)) => record(&base, cfg, o, probe, now_ns),
            None => (None, None),
        };
        let next = next.or(counted);
        let after = next.as_ref().unwrap_or(s);
        let window_total = match after.state() {
            State::Closed => {
                let (ok, failed) = after.window_counts(cfg, now_ns);
                ok.saturating_add(failed)
            }
            _ => 0,
        };
        let written = Written {
            transition: t,
            state: after.state(),
            window_total,
        };
        (written, next)
    })?;
    repair_if_corrupt(store, key, &stats, max_retries);
    Ok((written, stats))
}

/// `successes` plain successes gathered by one worker, as one bounded CAS read-modify-write of `key`
/// that touches their sub-window only ([`add_successes_in_place`]): the same outcome as
/// [`record_batch_shared`] with no request outcome, without decoding and encoding the whole record. A
/// missing key, a corrupt value or a window counted with another width goes the whole way
/// ([`record_batch_shared`]: created, repaired or reset).
pub fn add_successes_shared(
    store: &dyn SharedStore,
    key: &str,
    cfg: &BreakerConfig,
    successes: u32,
    now_ns: u64,
    max_retries: u32,
) -> Result<(Written, UpdateStats), UpdateError> {
    let mut stats = UpdateStats::default();
    // A missing key is created the whole way (below).
    while let Some((mut bytes, cas)) = store.get(key).map_err(|_| UpdateError::Host)? {
        let window_total = match add_successes_in_place(&mut bytes, cfg, successes, now_ns) {
            InPlace::Added { window_total } => window_total,
            InPlace::Unchanged(state) => {
                let written = Written {
                    transition: None,
                    state,
                    window_total: 0,
                };
                return Ok((written, stats));
            }
            InPlace::Whole => break,
        };
        match store.set(key, &bytes, cas) {
            Ok(()) => {
                let written = Written {
                    transition: None,
                    state: State::Closed,
                    window_total,
                };
                return Ok((written, stats));
            }
            Err(StoreError::CasMismatch) => {
                stats.retries += 1;
                if stats.retries > max_retries {
                    return Err(UpdateError::CasExhausted);
                }
            }
            Err(StoreError::Host) => return Err(UpdateError::Host),
        }
    }
    let (written, whole) =
        record_batch_shared(store, key, cfg, successes, None, now_ns, max_retries)?;
    stats.retries += whole.retries;
    stats.corrupt |= whole.corrupt;
    stats.created |= whole.created;
    Ok((written, stats))
}

/// Shared-data key of a breaker: `tg:cb:<scope>=<name>`. Bytes other than ASCII letters, digits and
/// `-._:/@+` become `_`; the scope is cut to [`MAX_SCOPE_BYTES`] and the name to [`MAX_NAME_BYTES`]
/// (two names equal in their first 128 characters share a breaker).
pub fn key(scope: &str, name: &str) -> String {
    let mut k = String::with_capacity(6 + MAX_SCOPE_BYTES + 1 + MAX_NAME_BYTES);
    k.push_str(crate::store::keys::BREAKER);
    push_sanitized(&mut k, scope, MAX_SCOPE_BYTES);
    k.push('=');
    push_sanitized(&mut k, name, MAX_NAME_BYTES);
    k
}

/// Length of the prefix every breaker key starts with (`tg:cb:`).
pub(super) const KEY_PREFIX_LEN: usize = crate::store::keys::BREAKER.len();

/// The characters of `s` as a key keeps them: at most `max`, unsafe ones as `_`.
fn sanitized_chars(s: &str, max: usize) -> impl Iterator<Item = char> + '_ {
    s.chars().take(max).map(|c| {
        let keep =
            c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':' | '/' | '@' | '+');
        if keep {
            c
        } else {
            '_'
        }
    })
}

fn push_sanitized(out: &mut String, s: &str, max: usize) {
    out.extend(sanitized_chars(s, max));
}

/// Whether `tail` is what follows `tg:cb:` in [`key`]`(scope, name)`, without building the key.
pub fn key_tail_matches(tail: &str, scope: &str, name: &str) -> bool {
    sanitized_chars(scope, MAX_SCOPE_BYTES)
        .chain(std::iter::once('='))
        .chain(sanitized_chars(name, MAX_NAME_BYTES))
        .eq(tail.chars())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::store::{Codec, MemStore};
    use std::cell::{Cell, RefCell};

    /// Puts a breaker into HALF_OPEN with no permit taken yet: OPEN whose recovery ended at `T0 + 30 s`.
    fn store_with_breaker_ready_to_probe(store: &MemStore, k: &str, c: &BreakerConfig) {
        for _ in 0..c.failure_threshold {
            record_shared(store, k, c, fail(), false, T0, 8).unwrap();
        }
        let (s, corrupt) = store::peek::<BreakerState>(store, k).unwrap();
        assert!(!corrupt);
        assert_eq!(s.map(|s| s.state()), Some(State::Open));
    }

    type OtherWorker<'a> = Box<dyn FnMut(&MemStore) + 'a>;

    /// A store that lets "the other worker" run right after each of our reads, before our write.
    struct Racing<'a> {
        inner: &'a MemStore,
        other: RefCell<OtherWorker<'a>>,
        armed: Cell<u32>,
    }

    impl SharedStore for Racing<'_> {
        fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, store::StoreError> {
            let r = self.inner.get(key);
            if self.armed.get() > 0 {
                self.armed.set(self.armed.get() - 1);
                (self.other.borrow_mut())(self.inner);
            }
            r
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), store::StoreError> {
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn corrupt_value_in_store_is_reported_once_and_repaired() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        store.set(&k, b"junk", 0).unwrap();
        let (a, _, st) = admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        assert_eq!(a, Admission::Allowed);
        assert!(st.corrupt);
        let (_, _, st) = admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        assert!(!st.corrupt);
    }

    #[test]
    fn a_plain_success_is_recorded_without_touching_shared_data_when_it_changes_nothing() {
        let c = cfg();
        assert!(c.failure_rate_percent.is_none());
        let t = T0;
        // record() agrees: no state changes on a non-probe success, whatever the state.
        for s in [
            BreakerState::default(),
            opened(&c),
            half_open_at(&c, t + 30 * S),
        ] {
            assert_eq!(
                record(&s, &c, Outcome::Success, false, t + 31 * S),
                (None, None)
            );
        }
        let store = MemStore::new();
        record_shared(&store, "tg:cb:model=x", &c, Outcome::Success, false, t, 8).unwrap();
        assert_eq!(store.reads(), 0);
        assert!(store.is_empty());
        // A probe's success, a failure, or a failure-rate threshold still read and write.
        record_shared(&store, "tg:cb:model=x", &c, Outcome::Success, true, t, 8).unwrap();
        assert!(store.reads() > 0);
        let rate = BreakerConfig {
            failure_rate_percent: Some(50),
            ..cfg()
        };
        assert!(!record_is_noop(&rate, Outcome::Success, false));
        assert!(!record_is_noop(
            &c,
            Outcome::Failure {
                retry_after_ms: None
            },
            false
        ));
    }

    #[test]
    fn key_is_prefixed_sanitized_and_bounded() {
        assert_eq!(key("model", "gpt-4.1"), "tg:cb:model=gpt-4.1");
        assert_eq!(key("cluster", "a b=c\n\u{e9}"), "tg:cb:cluster=a_b_c__");
        let long = "x".repeat(500);
        let k = key("model", &long);
        assert_eq!(k.len(), "tg:cb:model=".len() + MAX_NAME_BYTES);
        let wide = "\u{1F600}".repeat(300);
        assert!(key("model", &wide).len() <= "tg:cb:model=".len() + MAX_NAME_BYTES);
    }

    #[test]
    fn two_workers_alternating_admit_exactly_three_probes() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        let c = cfg();
        store_with_breaker_ready_to_probe(&store, &k, &c);
        let mut probes = 0;
        for i in 0..10u64 {
            // Worker A on even attempts, worker B on odd ones, each with its own clock read.
            let now = T0 + 30 * S + i * 1_000 + (i % 2) * 7;
            let (a, _, _) = admit_shared(&store, &k, &c, now, 8).unwrap();
            if a == Admission::Probe {
                probes += 1;
            }
        }
        assert_eq!(probes, 3);
    }

    #[test]
    fn two_workers_racing_inside_the_cas_admit_exactly_three_probes() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        let c = cfg();
        store_with_breaker_ready_to_probe(&store, &k, &c);
        let now = T0 + 30 * S;
        let b_probes = Cell::new(0u32);
        let racing = Racing {
            inner: &store,
            other: RefCell::new(Box::new(|s: &MemStore| {
                // Worker B admits between worker A's read and write.
                let (a, _, _) = admit_shared(s, &k, &c, now, 8).unwrap();
                if a == Admission::Probe {
                    b_probes.set(b_probes.get() + 1);
                }
            })),
            armed: Cell::new(u32::MAX),
        };
        let mut a_probes = 0;
        let mut a_retries = 0;
        for _ in 0..5 {
            let (a, _, st) = admit_shared(&racing, &k, &c, now, 8).unwrap();
            a_retries += st.retries;
            if a == Admission::Probe {
                a_probes += 1;
            }
        }
        // 5 attempts by A, each read followed by one of B's: 10+ attempts in all, 3 probes in all.
        assert_eq!(a_probes + b_probes.get(), 3);
        assert!(b_probes.get() >= 1);
        assert!(a_retries >= 1, "A's stale writes must have been retried");
    }

    #[test]
    fn cas_conflict_mid_record_is_retried_and_both_failures_count() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        let c = cfg();
        for _ in 0..3 {
            record_shared(&store, &k, &c, fail(), false, T0, 8).unwrap();
        }
        let racing = Racing {
            inner: &store,
            other: RefCell::new(Box::new(|s: &MemStore| {
                // Worker B records a failure between A's read and write.
                let (t, _) = record_shared(s, &k, &c, fail(), false, T0, 8).unwrap();
                assert_eq!(t, None);
            })),
            armed: Cell::new(1),
        };
        let (t, st) = record_shared(&racing, &k, &c, fail(), false, T0, 8).unwrap();
        assert_eq!(st.retries, 1);
        // 3 + B's + A's = 5: A's retried write is the one that trips the breaker.
        assert_eq!(t.map(|t| t.reason), Some("failure_threshold"));
        let (s, _) = store::peek::<BreakerState>(&store, &k).unwrap();
        assert_eq!(s.map(|s| s.state()), Some(State::Open));
    }

    #[test]
    fn successes_written_in_place_race_like_any_update_and_a_bad_record_goes_the_whole_way() {
        let rate = BreakerConfig {
            failure_threshold: u32::MAX,
            failure_rate_percent: Some(50),
            ..cfg()
        };
        let store = MemStore::new();
        let k = key("model", "m");
        // Missing: created the whole way.
        let (w, st) = add_successes_shared(&store, &k, &rate, 3, T0, 8).unwrap();
        assert!(st.created);
        assert_eq!((w.state, w.window_total), (State::Closed, 3));
        // Another worker writes between our read and our write: retried, both counted.
        let racing = Racing {
            inner: &store,
            other: RefCell::new(Box::new(|s: &MemStore| {
                add_successes_shared(s, &k, &rate, 5, T0, 8).unwrap();
            })),
            armed: Cell::new(1),
        };
        let (w, st) = add_successes_shared(&racing, &k, &rate, 2, T0, 8).unwrap();
        assert_eq!((st.retries, w.window_total), (1, 10));
        let (s, _) = store::peek::<BreakerState>(&store, &k).unwrap();
        assert_eq!(s.unwrap().window_counts(&rate, T0), (10, 0));
        // Corrupt: repaired the whole way, and counted from a fresh window.
        store.set(&k, b"junk", 0).unwrap();
        let (w, st) = add_successes_shared(&store, &k, &rate, 4, T0, 8).unwrap();
        assert!(st.corrupt);
        assert_eq!(w.window_total, 4);
        assert!(!store::peek::<BreakerState>(&store, &k).unwrap().1);
        // Open: nothing counted, nothing written.
        let open = opened(&cfg());
        store.set(&k, &open.encode(), 0).unwrap();
        let cas = store.get(&k).unwrap().unwrap().1;
        let (w, _) = add_successes_shared(&store, &k, &rate, 4, T0, 8).unwrap();
        assert_eq!((w.state, w.window_total), (State::Open, 0));
        assert_eq!(store.get(&k).unwrap().unwrap().1, cas);
    }

    #[test]
    fn closed_admission_on_an_existing_key_writes_nothing() {
        let store = MemStore::new();
        let k = key("model", "m");
        admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        let (_, cas0) = store.get(&k).unwrap().unwrap();
        let (a, t, st) = admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        assert_eq!((a, t, st.created), (Admission::Allowed, None, false));
        assert_eq!(store.get(&k).unwrap().unwrap().1, cas0);
        assert_eq!(store.len(), 1);
    }
}
