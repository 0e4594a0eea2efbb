//! The request breakers (one per upstream cluster, one per model) as a request meets them: which upstream
//! it goes to when breakers are open, the admissions it holds, and the outcome it reports — built so that
//! a request through closed breakers costs one cheap shared-data read and nothing else.
//!
//! # One read while every breaker is closed
//! [`view`] reads the set of breakers that are not CLOSED ([`crate::breaker::open_set`]): one value,
//! empty while all are closed, which the host returns without handing over any bytes. The flow reads it in
//! the headers phase (cluster breaker) and the model breaker's check reuses that read when the body
//! arrives within [`crate::flow::vm::breakers::OPEN_SET_REUSE_MS`] (reads it again otherwise). A breaker the set
//! does not name is CLOSED: the request is admitted on it with no read of its key, no key built, and no
//! key created (a breaker key is created by the first outcome recorded on it). Only breakers the set
//! names (or every breaker, when the set cannot be read) go the exact way below. The cluster breaker
//! needs the cluster's name (`xds.cluster_name`, a property read) only when the set names a cluster;
//! otherwise the flow reads it at the end, and only when there is an outcome to record.
//!
//! A breaker that opens is seen by the next request whose read of the set comes after the opening
//! worker's two CAS writes (the breaker's, then the set's): a few microseconds, as when a request read
//! the breaker key just before the CAS that opened it. No worker keeps a copy of the set. (As before, a
//! cluster breaker seen CLOSED in the headers phase is taken without another read when the body follows
//! within 1 s.)
//!
//! # The exact way, for breakers the set names
//! 1. [`peek_chain`] (read-only): starting from the primary, follow fallbacks while the breaker would
//!    reject now, at most `max_fallback_hops` times. Gives the target, or the primary's `reset_in` when
//!    the whole chain is open.
//! 2. [`admit`] (after the bucket admitted): one CAS on the target's breaker; this is what moves
//!    OPEN → HALF_OPEN and takes a probe permit. If it rejects (another worker took the last permit in
//!    between), the caller refunds the bucket and answers 503.
//!
//! # Outcomes
//! [`record`]: a failure or a probe's outcome is one CAS on the breaker key (then the set is kept
//! true: see [`crate::breaker::open_set`]). A plain success changes nothing without a failure-rate
//! threshold and is not written at all; with `failure_rate_percent` it must be counted. To keep most of
//! that off the request path, each worker VM gathers its successes per breaker ([`Pending`]) and adds them
//! in one write: with the next failure or probe outcome it records on that breaker (in the same CAS,
//! before it); once they reach 1/[`SUCCESS_BATCH_DIVISOR`] of the outcomes the breaker's window held at
//! this VM's last write to it; once the oldest has waited [`SUCCESS_FLUSH_MS`] (checked as each request
//! ends, against the last time any callback of the VM read the clock: a success is gathered without a
//! clock read of its own); and at every tick of the VM ([`flush`]). A window that held fewer than 2 ×
//! [`SUCCESS_BATCH_DIVISOR`] (128) outcomes, one this VM has not written to, or one it last wrote longer
//! ago than [`SUCCESS_FLUSH_MS`] (or one sub-window of a shorter window) gets every success at once: a
//! CAS on the request path, about 128 + 64 writes per window and at most ten a second per VM after that.
//! Counting a success is a look-up of the breaker's scope and name among this VM's entries (no key
//! built) and an add; whether any are due is one comparison with the oldest; a write of gathered
//! successes adds them to their sub-window's 16 bytes of the record
//! ([`crate::breaker::add_successes_shared`]).
//!
//! **Bound:** a failure recorded by one worker sees a failure rate that lacks, per other worker, the
//! successes that worker gathered since its last write: fewer than 1/[`SUCCESS_BATCH_DIVISOR`] of the
//! window it last saw (so with N workers at most (N − 1)/64 of the successes; none while the window holds
//! fewer than 128 outcomes, so a breaker with `min_requests` ≤ 128 judges a burst that starts a window,
//! spread over many workers, on its exact counts), and only those of the last [`SUCCESS_FLUSH_MS`] while
//! it serves requests (of its last tick period otherwise: 1 s without shaping, quota or global buckets).
//! The rate read can only be higher than the exact one, never lower. Successes gathered by a VM that
//! restarts are lost.
//!
//! Keys are `tg:cb:<scope>=<name>`; their number is bounded by `breaker.max_keys` through a shared count
//! (`tg:n:breakers`): a name beyond it is not tracked (admitted, never recorded).

use crate::breaker::{self, open_set, Admission, Outcome, State, Transition, View};
use crate::config::BreakerSettings;
use crate::store::registry::{claim_slot, KeySet};
use crate::store::{self, SharedStore, UpdateError};

/// Shared count of created breaker keys ([`crate::store::keys::BREAKER_COUNTER`]).
pub const BREAKER_KEY_COUNTER: &str = crate::store::keys::BREAKER_COUNTER;

/// Longest a success waits in its VM before it is written while the VM serves requests (ms).
pub const SUCCESS_FLUSH_MS: u64 = 100;
/// Breakers with successes waiting in one VM before all of them are written at once.
pub const MAX_PENDING_KEYS: usize = 64;
/// A VM writes the successes it gathered for a breaker once they reach 1/this of the outcomes the
/// breaker's window held at the VM's last write to it (at once while that is under 2 × this).
pub const SUCCESS_BATCH_DIVISOR: u64 = 64;
/// Breakers one VM remembers the window size of (beyond it, a forgotten one starts again at batches of 1).
const MAX_REMEMBERED_KEYS: usize = 256;

const NS_PER_MS: u64 = 1_000_000;

/// Gives the fallback of a name and, for clusters, the route-header value that selects it.
pub type NextFn<'a> = &'a dyn Fn(&str) -> Option<(String, Option<String>)>;

/// Reads the set of breakers that are not CLOSED (one host call; no bytes while all are closed).
pub fn view(store: &dyn SharedStore) -> View {
    open_set::read(store)
}

/// The target chosen by [`peek_chain`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Cluster or model to use.
    pub target: String,
    /// The primary it replaces, when a fallback was taken.
    pub from: Option<String>,
    /// Route-header value for a cluster fallback.
    pub route: Option<String>,
    /// The target's breaker was seen CLOSED (not named by the set, or its key read CLOSED): [`admit`]
    /// is not needed for it.
    pub closed: bool,
}

/// Follows fallbacks while breakers would reject. `next(name)` gives the fallback and its route value.
/// Reads only the keys of breakers `view` names; a key it names that reads CLOSED (or missing) is taken
/// out of the set (a removal that was lost). `Err(reset_in_ms)` of the primary when every candidate is
/// open.
#[allow(clippy::too_many_arguments)]
pub fn peek_chain(
    store: &dyn SharedStore,
    settings: &BreakerSettings,
    view: &View,
    scope: &str,
    primary: &str,
    next: NextFn<'_>,
    now_ns: u64,
    retries: u32,
) -> Result<Choice, u64> {
    if !view.may_be_open(scope, primary) {
        return Ok(Choice {
            target: primary.to_string(),
            from: None,
            route: None,
            closed: true,
        });
    }
    let mut name = primary.to_string();
    let mut route = None;
    let mut primary_reset = None;
    let mut seen = vec![name.clone()];
    for hop in 0..=settings.max_fallback_hops {
        let (reset, closed) = if view.may_be_open(scope, &name) {
            let key = breaker::key(scope, &name);
            match store::peek::<breaker::BreakerState>(store, &key) {
                Ok((Some(st), _)) => {
                    let closed = st.state() == State::Closed;
                    if closed && matches!(view, View::Known(_)) {
                        let _ = open_set::unmark(store, &key, retries);
                    }
                    (breaker::peek_state(&st, &settings.cfg, now_ns).1, closed)
                }
                Ok((None, false)) => {
                    if matches!(view, View::Known(_)) {
                        let _ = open_set::unmark(store, &key, retries);
                    }
                    (0, true)
                }
                // Corrupt or unreadable: nothing says it is open; `admit` reads (and repairs) it.
                _ => (0, false),
            }
        } else {
            (0, true)
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

/// What a request holds on one breaker until its outcome is reported ([`record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// `cluster` or `model`.
    pub scope: &'static str,
    /// The breaker's name; `None` when it is named at the end (the cluster by its `xds.cluster_name`,
    /// the model by the request's model): a breaker seen CLOSED without reading its key.
    pub name: Option<String>,
    /// This request holds a HALF_OPEN probe permit.
    pub probe: bool,
}

impl Held {
    /// A breaker seen CLOSED, named at the end.
    pub fn closed(scope: &'static str) -> Self {
        Held {
            scope,
            name: None,
            probe: false,
        }
    }
}

/// Takes the admission on `name`'s breaker the exact way (its key is read in one CAS, and created when
/// missing). `Err(reset_in_ms)` when it rejects. `Ok(None)`: the name is beyond `max_keys`, or the store
/// failed (the breaker cannot say no): the request goes untracked.
#[allow(clippy::too_many_arguments)]
pub fn admit(
    store: &dyn SharedStore,
    settings: &BreakerSettings,
    scope: &'static str,
    name: &str,
    now_ns: u64,
    retries: u32,
    known: &mut KeySet,
    cache_limit: usize,
) -> (Result<Option<Held>, u64>, Option<Transition>) {
    let key = breaker::key(scope, name);
    if !claim_slot(
        store,
        BREAKER_KEY_COUNTER,
        settings.max_keys,
        retries,
        known,
        cache_limit,
        &key,
    ) {
        return (Ok(None), None);
    }
    let held = |probe| {
        Ok(Some(Held {
            scope,
            name: Some(name.to_string()),
            probe,
        }))
    };
    match breaker::admit_shared(store, &key, &settings.cfg, now_ns, retries) {
        Ok((Admission::Allowed, t, _)) => (held(false), t),
        Ok((Admission::Probe, t, _)) => (held(true), t),
        Ok((Admission::Rejected { reset_in_ms }, t, _)) => (Err(reset_in_ms.max(1)), t),
        Err(_) => (Ok(None), None),
    }
}

/// Gives back the probe permit of a request that was not sent after all.
pub fn release(store: &dyn SharedStore, held: &Held, retries: u32) {
    if let (true, Some(name)) = (held.probe, held.name.as_deref()) {
        let key = breaker::key(held.scope, name);
        let _ = breaker::release_probe_shared(store, &key, retries);
    }
}

/// Plain successes one VM gathered per breaker, not written yet, and how many it may gather for each
/// before it writes them (see the module docs). Counting one is a look-up by the breaker's scope and
/// name as the request has them (no key built) and an add; whether any are due is one comparison.
#[derive(Debug, Default)]
pub struct Pending {
    entries: Vec<PendingEntry>,
    /// Entries with successes waiting.
    waiting: usize,
    /// No success has waited since before this (a lower bound: `flush` makes it exact again); `None`:
    /// nothing waits.
    oldest_ns: Option<u64>,
}

#[derive(Debug)]
struct PendingEntry {
    /// Scope and name as the requests give them (several names may share a key: see [`breaker::key`]).
    scope: String,
    name: String,
    key: String,
    /// Successes not written yet (0: nothing waits; the entry keeps `batch`).
    successes: u32,
    /// When the oldest of `successes` was counted.
    since_ns: u64,
    /// `successes` reaching this are written at once (from the window's size at the last write).
    batch: u32,
    /// When that write was (a batch learnt longer ago than [`fresh_ns`] is 1 again: the window may have
    /// emptied since).
    seen_ns: u64,
}

impl PendingEntry {
    fn waits(&self) -> bool {
        self.successes > 0
    }

    fn fresh(&self, now_ns: u64, fresh_ns: u64) -> bool {
        now_ns.saturating_sub(self.seen_ns) <= fresh_ns
    }

    fn full(&self, now_ns: u64, fresh_ns: u64) -> bool {
        self.successes
            >= if self.fresh(now_ns, fresh_ns) {
                self.batch
            } else {
                1
            }
    }
}

/// How long what a write told a VM about a window holds: [`SUCCESS_FLUSH_MS`], or one sub-window of a
/// shorter window (no window can roll over within it).
fn fresh_ns(window_ms: u64) -> u64 {
    (SUCCESS_FLUSH_MS.min(window_ms / breaker::BUCKETS as u64)).saturating_mul(NS_PER_MS)
}

/// Successes a VM gathers before it writes them, for a window that held `window_total` outcomes.
fn batch_for(window_total: u64) -> u32 {
    u32::try_from(window_total / SUCCESS_BATCH_DIVISOR)
        .unwrap_or(u32::MAX)
        .max(1)
}

impl Pending {
    /// Counts one success of breaker `key(scope, name)`; returns its index when the successes waiting
    /// for it reached its batch (to be written now).
    fn add(&mut self, scope: &str, name: &str, now_ns: u64, fresh_ns: u64) -> Option<usize> {
        let found = self
            .entries
            .iter()
            .position(|e| e.name == name && e.scope == scope);
        let i = match found {
            Some(i) => i,
            None => {
                if self.entries.len() >= MAX_REMEMBERED_KEYS {
                    // Forget the stalest that waits for nothing (its next success is written at once).
                    let idle = self
                        .entries
                        .iter()
                        .enumerate()
                        .filter(|(_, e)| !e.waits())
                        .min_by_key(|(_, e)| e.seen_ns)
                        .map(|(i, _)| i);
                    if let Some(idle) = idle {
                        self.entries.swap_remove(idle);
                    }
                }
                self.entries.push(PendingEntry {
                    scope: scope.to_string(),
                    name: name.to_string(),
                    key: breaker::key(scope, name),
                    successes: 0,
                    since_ns: now_ns,
                    batch: 1,
                    seen_ns: 0,
                });
                self.entries.len() - 1
            }
        };
        let e = self.entries.get_mut(i)?;
        if !e.waits() {
            e.since_ns = now_ns;
            self.waiting += 1;
            self.oldest_ns = Some(self.oldest_ns.map_or(now_ns, |o| o.min(now_ns)));
        }
        e.successes = e.successes.saturating_add(1);
        e.full(now_ns, fresh_ns).then_some(i)
    }

    /// Takes the successes waiting in entry `i`, with its key.
    fn take_at(&mut self, i: usize) -> Option<(String, u32)> {
        let e = self.entries.get_mut(i)?;
        let n = std::mem::take(&mut e.successes);
        let key = e.key.clone();
        if n > 0 {
            self.taken_one();
        }
        Some((key, n))
    }

    /// Takes the successes waiting for `key`.
    fn take(&mut self, key: &str) -> u32 {
        let mut n = 0u32;
        for e in self.entries.iter_mut().filter(|e| e.key == key) {
            if e.successes > 0 {
                n = n.saturating_add(std::mem::take(&mut e.successes));
                self.waiting = self.waiting.saturating_sub(1);
            }
        }
        if self.waiting == 0 {
            self.oldest_ns = None;
        }
        n
    }

    /// One entry stopped waiting.
    fn taken_one(&mut self) {
        self.waiting = self.waiting.saturating_sub(1);
        if self.waiting == 0 {
            self.oldest_ns = None;
        }
    }

    /// Remembers the size of `key`'s window after a write to it at `now_ns`.
    fn saw(&mut self, key: &str, window_total: u64, now_ns: u64) {
        self.set_batch(key, batch_for(window_total), now_ns);
    }

    fn set_batch(&mut self, key: &str, batch: u32, now_ns: u64) {
        for e in self.entries.iter_mut().filter(|e| e.key == key) {
            e.batch = batch;
            e.seen_ns = now_ns;
        }
    }

    /// Forgets the entries that wait for nothing and hold no fresh batch (they act as missing ones),
    /// and makes `oldest_ns` exact.
    fn prune(&mut self, now_ns: u64, fresh_ns: u64) {
        self.entries
            .retain(|e| e.waits() || e.fresh(now_ns, fresh_ns));
        self.oldest_ns = self
            .entries
            .iter()
            .filter(|e| e.waits())
            .map(|e| e.since_ns)
            .min();
    }

    /// True when successes wait in this VM.
    pub fn any(&self) -> bool {
        self.waiting > 0
    }

    /// Successes waiting in this VM, over every breaker.
    pub fn total(&self) -> u64 {
        self.entries.iter().map(|e| u64::from(e.successes)).sum()
    }

    /// True when something may wait for `now_ns` (or must be written anyway: too many breakers
    /// waiting). May say so when nothing is due any more ([`flush`] then finds nothing to write).
    pub fn due(&self, now_ns: u64) -> bool {
        self.waiting >= MAX_PENDING_KEYS
            || self
                .oldest_ns
                .is_some_and(|t| now_ns.saturating_sub(t) >= SUCCESS_FLUSH_MS * NS_PER_MS)
    }
}

/// Per-VM breaker state.
#[derive(Debug, Default)]
pub struct VmBreakers {
    /// Plain successes not written yet (failure-rate breakers only).
    pub pending: Pending,
}

/// What [`record`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The breaker key written, when one was.
    pub key: Option<String>,
    /// The transition the outcome caused.
    pub transition: Option<Transition>,
    /// A shared-data update failed (the outcome, or the set of open breakers).
    pub error: Option<UpdateError>,
}

/// Where [`record`] and [`flush`] keep their per-VM state and key cache.
pub struct Ctx<'a> {
    /// Shared data.
    pub store: &'a dyn SharedStore,
    /// Breaker settings.
    pub settings: &'a BreakerSettings,
    /// This VM's breaker state.
    pub vm: &'a mut VmBreakers,
    /// Keys known to exist (for the `max_keys` bound).
    pub known: &'a mut KeySet,
    /// Bound of `known`.
    pub cache_limit: usize,
    /// CAS retries.
    pub retries: u32,
}

/// Reports one request's `outcome` to breaker `key(scope, name)`: nothing for a plain success without
/// a failure-rate threshold; gathered in this VM for a plain success with one; otherwise one CAS on the
/// key carrying the successes gathered for it first, then the set of open breakers kept true.
pub fn record(
    cx: &mut Ctx<'_>,
    scope: &str,
    name: &str,
    outcome: Outcome,
    probe: bool,
    now_ns: u64,
) -> Recorded {
    if breaker::record_is_noop(&cx.settings.cfg, outcome, probe) {
        return Recorded::default();
    }
    if outcome == Outcome::Success && !probe {
        let fresh = fresh_ns(cx.settings.cfg.window_ms);
        let Some(i) = cx.vm.pending.add(scope, name, now_ns, fresh) else {
            return Recorded::default();
        };
        // Its batch is full: written now.
        let Some((key, successes)) = cx.vm.pending.take_at(i) else {
            return Recorded::default();
        };
        let error = write_successes(cx, &key, successes, now_ns).err();
        return Recorded {
            key: Some(key),
            transition: None,
            error,
        };
    }
    let key = breaker::key(scope, name);
    let successes = cx.vm.pending.take(&key);
    if !claim_slot(
        cx.store,
        BREAKER_KEY_COUNTER,
        cx.settings.max_keys,
        cx.retries,
        cx.known,
        cx.cache_limit,
        &key,
    ) {
        return Recorded::default();
    }
    let mut out = Recorded::default();
    match breaker::record_batch_shared(
        cx.store,
        &key,
        &cx.settings.cfg,
        successes,
        Some((outcome, probe)),
        now_ns,
        cx.retries,
    ) {
        Ok((w, _)) => {
            let (t, after) = (w.transition, w.state);
            cx.vm.pending.saw(&key, w.window_total, now_ns);
            out.transition = t;
            let kept = if after != State::Closed {
                // Opened, or still not closed (its entry may have been lost): make sure it is named.
                open_set::mark(cx.store, &key, cx.retries)
            } else if t.is_some_and(|t| t.to == State::Closed) {
                open_set::unmark(cx.store, &key, cx.retries)
            } else {
                Ok(())
            };
            out.error = kept.err();
        }
        Err(e) => out.error = Some(e),
    }
    out.key = Some(key);
    out
}

/// Writes `successes` gathered for `key` (counted only if the key may be created or exists) and
/// remembers the size of its window.
fn write_successes(
    cx: &mut Ctx<'_>,
    key: &str,
    successes: u32,
    now_ns: u64,
) -> Result<(), UpdateError> {
    if !claim_slot(
        cx.store,
        BREAKER_KEY_COUNTER,
        cx.settings.max_keys,
        cx.retries,
        cx.known,
        cx.cache_limit,
        key,
    ) {
        // Not tracked (beyond `max_keys`): its successes are gathered and dropped at the next flush,
        // as before this VM knew it, instead of asking again at every success.
        cx.vm.pending.set_batch(key, u32::MAX, now_ns);
        return Ok(());
    }
    let (w, _) = breaker::add_successes_shared(
        cx.store,
        key,
        &cx.settings.cfg,
        successes,
        now_ns,
        cx.retries,
    )?;
    cx.vm.pending.saw(key, w.window_total, now_ns);
    Ok(())
}

/// Writes the successes this VM gathered: those waiting [`SUCCESS_FLUSH_MS`] or more (or all of them
/// when too many breakers wait), or everything with `all` (the VM's tick). Returns the failed writes.
pub fn flush(cx: &mut Ctx<'_>, now_ns: u64, all: bool) -> Vec<(String, UpdateError)> {
    let mut failed = Vec::new();
    if !all && !cx.vm.pending.due(now_ns) {
        return failed;
    }
    let everything = all || cx.vm.pending.waiting >= MAX_PENDING_KEYS;
    let due_ns = SUCCESS_FLUSH_MS * NS_PER_MS;
    for i in 0..cx.vm.pending.entries.len() {
        let Some(e) = cx.vm.pending.entries.get(i) else {
            break;
        };
        if !e.waits() || (!everything && now_ns.saturating_sub(e.since_ns) < due_ns) {
            continue;
        }
        let Some((key, successes)) = cx.vm.pending.take_at(i) else {
            break;
        };
        if let Err(err) = write_successes(cx, &key, successes, now_ns) {
            failed.push((key, err));
        }
    }
    cx.vm
        .pending
        .prune(now_ns, fresh_ns(cx.settings.cfg.window_ms));
    failed
}

/// Gauge value of a state (0 closed, 1 open, 2 half-open).
pub fn gauge(state: State) -> u64 {
    state.as_gauge()
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn rate_settings() -> BreakerSettings {
        config::parse(
            br#"{"breaker":{"failure_rate_percent":50,"min_requests":4,"window_ms":60000},
                "rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap()
        .breaker
        .unwrap()
    }

    fn fail() -> Outcome {
        Outcome::Failure {
            retry_after_ms: None,
        }
    }

    struct Vm {
        vm: VmBreakers,
        known: KeySet,
    }

    impl Vm {
        fn new() -> Self {
            Vm {
                vm: VmBreakers::default(),
                known: KeySet::default(),
            }
        }
        fn cx<'a>(&'a mut self, store: &'a MemStore, st: &'a BreakerSettings) -> Ctx<'a> {
            Ctx {
                store,
                settings: st,
                vm: &mut self.vm,
                known: &mut self.known,
                cache_limit: 100,
                retries: 8,
            }
        }
        /// A plain success (not a probe) of breaker `key(scope, name)` at `t`.
        fn success(
            &mut self,
            store: &MemStore,
            st: &BreakerSettings,
            scope: &str,
            name: &str,
            t: u64,
        ) -> Recorded {
            record(
                &mut self.cx(store, st),
                scope,
                name,
                Outcome::Success,
                false,
                t,
            )
        }
    }

    fn open(s: &MemStore, st: &BreakerSettings, name: &str, now: u64) {
        let mut vm = Vm::new();
        for _ in 0..2 {
            record(&mut vm.cx(s, st), "model", name, fail(), false, now);
        }
    }

    fn next(st: &BreakerSettings) -> impl Fn(&str) -> Option<(String, Option<String>)> + '_ {
        move |m| st.model_fallback(m).map(|t| (t.to_string(), None))
    }

    fn chain(s: &MemStore, st: &BreakerSettings, now: u64) -> Result<Choice, u64> {
        peek_chain(s, st, &view(s), "model", "a", &next(st), now, 8)
    }

    #[test]
    fn closed_breakers_cost_one_read_of_an_empty_value_and_create_nothing() {
        let s = MemStore::new();
        let st = settings();
        let c = chain(&s, &st, 0).unwrap();
        assert_eq!((c.target.as_str(), c.from, c.closed), ("a", None, true));
        assert_eq!(s.reads(), 1, "only the set was read");
        assert!(s.is_empty(), "peeking must not create keys");
        // Another breaker open: the set names it, this one still needs no read of its own.
        open(&s, &st, "z", 0);
        let reads = s.reads();
        assert!(chain(&s, &st, 0).unwrap().closed);
        assert_eq!(s.reads(), reads + 1);
    }

    #[test]
    fn open_primary_falls_back_one_hop_only() {
        let s = MemStore::new();
        let st = settings();
        open(&s, &st, "a", 0);
        let c = chain(&s, &st, MS).unwrap();
        assert_eq!((c.target.as_str(), c.from.as_deref()), ("b", Some("a")));
        open(&s, &st, "b", 0);
        // b's own fallback c is two hops away: not followed with max_fallback_hops = 1
        let r = chain(&s, &st, MS).unwrap_err();
        assert!(r > 900 && r <= 1000, "{r}");
    }

    #[test]
    fn opening_names_the_breaker_in_the_set_and_a_probe_success_takes_it_out() {
        let s = MemStore::new();
        let st = settings();
        let mut vm = Vm::new();
        let r = record(&mut vm.cx(&s, &st), "model", "a", fail(), false, 0);
        assert_eq!(r.transition, None);
        assert!(!view(&s).may_be_open("model", "a"));
        let r = record(&mut vm.cx(&s, &st), "model", "a", fail(), false, 0);
        assert_eq!(r.transition.map(|t| t.to), Some(State::Open));
        assert!(view(&s).may_be_open("model", "a"));
        // Recovery over: the probe is taken the exact way, and its success closes and unnames it.
        let (held, t) = admit(&s, &st, "model", "a", 1001 * MS, 8, &mut vm.known, 100);
        assert_eq!(t.map(|t| t.to), Some(State::HalfOpen));
        assert!(held.unwrap().unwrap().probe);
        let r = record(
            &mut vm.cx(&s, &st),
            "model",
            "a",
            Outcome::Success,
            true,
            1002 * MS,
        );
        assert_eq!(r.transition.map(|t| t.to), Some(State::Closed));
        assert_eq!(view(&s), View::Known(breaker::OpenSet::default()));
        assert!(s.get(breaker::OPEN_SET_KEY).unwrap().unwrap().0.is_empty());
    }

    #[test]
    fn a_lost_add_is_put_back_by_the_next_outcome_and_a_lost_removal_by_the_next_reader() {
        let s = MemStore::new();
        let st = settings();
        open(&s, &st, "a", 0);
        // The set is lost (an older build, a failed write): the open breaker is hidden…
        s.set(breaker::OPEN_SET_KEY, &[], 0).unwrap();
        assert!(chain(&s, &st, MS).unwrap().closed);
        // …until the next outcome recorded on it.
        let mut vm = Vm::new();
        record(&mut vm.cx(&s, &st), "model", "a", fail(), false, MS);
        assert_eq!(chain(&s, &st, MS).unwrap().target, "b");
        // A stale entry for a closed breaker: the reader reads its key, finds it closed, takes it out.
        let k = breaker::key("model", "q");
        open_set::mark(&s, &k, 8).unwrap();
        let c = peek_chain(&s, &st, &view(&s), "model", "q", &next(&st), MS, 8).unwrap();
        assert!(c.closed);
        assert!(!view(&s).may_be_open("model", "q"));
        assert!(view(&s).may_be_open("model", "a"));
    }

    #[test]
    fn an_unreadable_set_means_every_key_is_read() {
        let s = MemStore::new();
        let st = settings();
        s.set(breaker::OPEN_SET_KEY, b"junk", 0).unwrap();
        let v = view(&s);
        assert_eq!(v, View::Unknown { corrupt: true });
        let reads = s.reads();
        let c = peek_chain(&s, &st, &v, "model", "a", &next(&st), 0, 8).unwrap();
        assert_eq!(s.reads(), reads + 1, "the key itself was read");
        assert!(c.closed, "a breaker never recorded is closed");
        open(&s, &st, "a", 0);
        s.set(breaker::OPEN_SET_KEY, b"junk", 0).unwrap();
        let c = peek_chain(&s, &st, &view(&s), "model", "a", &next(&st), MS, 8).unwrap();
        assert_eq!(c.target, "b", "an open breaker is still seen");
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
            match admit(&s, &st, "model", "a", 1001 * MS, 8, &mut known, 100).0 {
                Ok(Some(a)) if a.probe => probes += 1,
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
        let a = admit(&s, &st, "model", "x", 0, 8, &mut known, 100)
            .0
            .unwrap();
        assert!(a.is_some());
        let b = admit(&s, &st, "model", "y", 0, 8, &mut known, 100)
            .0
            .unwrap();
        assert_eq!(b, None);
        // Outcomes of an untracked name are not recorded either.
        let mut vm = Vm::new();
        for _ in 0..3 {
            let r = record(&mut vm.cx(&s, &st), "model", "y", fail(), false, 0);
            assert_eq!(r, Recorded::default());
        }
        assert!(s.get(&breaker::key("model", "y")).unwrap().is_none());
    }

    #[test]
    fn plain_successes_are_written_only_with_a_rate_rule_and_then_in_batches() {
        let s = MemStore::new();
        let count = settings();
        let mut vm = Vm::new();
        vm.success(&s, &count, "model", "a", 0);
        assert_eq!(
            vm.vm.pending.total(),
            0,
            "nothing to count without a rate rule"
        );
        assert_eq!(s.reads(), 0);

        let st = rate_settings();
        let key = breaker::key("model", "a");
        // An old window (640 outcomes): the VM's first success is written at once and tells it the
        // size, so it gathers the next ones up to 641 / 64 = 10.
        breaker::record_batch_shared(&s, &key, &st.cfg, 640, None, 0, 8).unwrap();
        vm.success(&s, &st, "model", "a", 0);
        assert_eq!(vm.vm.pending.total(), 0);
        let reads = s.reads();
        for i in 0..9 {
            vm.success(&s, &st, "model", "a", i * MS);
            assert!(flush(&mut vm.cx(&s, &st), i * MS, false).is_empty());
        }
        assert_eq!(s.reads(), reads, "gathered in the VM");
        assert_eq!(vm.vm.pending.total(), 9);
        // Due once the oldest waited SUCCESS_FLUSH_MS: one write for all nine.
        assert!(flush(&mut vm.cx(&s, &st), SUCCESS_FLUSH_MS * MS, false).is_empty());
        assert_eq!(vm.vm.pending.total(), 0);
        let (b, _) = store::peek::<breaker::BreakerState>(&s, &key).unwrap();
        assert_eq!(
            b.unwrap().window_counts(&st.cfg, SUCCESS_FLUSH_MS * MS),
            (650, 0)
        );
    }

    #[test]
    fn a_name_beyond_max_keys_is_asked_about_once_per_flush_interval_not_per_success() {
        let s = MemStore::new();
        let mut st = rate_settings();
        st.max_keys = 1;
        let mut vm = Vm::new();
        vm.success(&s, &st, "model", "x", 0);
        assert!(s.get(&breaker::key("model", "x")).unwrap().is_some());
        vm.success(&s, &st, "model", "y", 0);
        let reads = s.reads();
        for i in 1..10 {
            vm.success(&s, &st, "model", "y", i * MS);
        }
        assert_eq!(s.reads(), reads, "gathered, not asked again");
        // Once they waited SUCCESS_FLUSH_MS they are dropped by the flush (still untracked).
        assert!(flush(&mut vm.cx(&s, &st), (SUCCESS_FLUSH_MS + 1) * MS, false).is_empty());
        assert_eq!(vm.vm.pending.total(), 0);
        assert!(s.get(&breaker::key("model", "y")).unwrap().is_none());
    }

    #[test]
    fn what_a_vm_knows_of_idle_breakers_is_forgotten_at_its_tick() {
        let s = MemStore::new();
        let st = rate_settings();
        let mut vm = Vm::new();
        for name in ["a", "b", "c"] {
            vm.success(&s, &st, "model", name, 0);
        }
        assert_eq!(vm.vm.pending.entries.len(), 3);
        assert!(flush(&mut vm.cx(&s, &st), SUCCESS_FLUSH_MS * MS, true).is_empty());
        assert_eq!(vm.vm.pending.entries.len(), 3, "still fresh");
        assert!(flush(&mut vm.cx(&s, &st), (SUCCESS_FLUSH_MS + 1) * MS, true).is_empty());
        assert!(vm.vm.pending.entries.is_empty());
    }

    #[test]
    fn a_short_window_keeps_what_a_write_said_for_one_sub_window() {
        assert_eq!(fresh_ns(60_000), SUCCESS_FLUSH_MS * MS);
        assert_eq!(fresh_ns(600), 50 * MS);
        assert_eq!(fresh_ns(12), MS);
    }

    #[test]
    fn batches_follow_the_size_of_the_window() {
        assert_eq!(
            [0, 1, 127, 128, 640, 6400].map(batch_for),
            [1, 1, 1, 2, 10, 100]
        );
        assert_eq!(batch_for(u64::MAX), u32::MAX);
    }

    #[test]
    fn a_failure_carries_the_successes_its_vm_gathered_before_it() {
        let s = MemStore::new();
        let st = rate_settings();
        let mut vm = Vm::new();
        // 3 successes then 2 failures: 40 % < 50 %, stays closed although 2 failures ≥ min 4 requests
        // would be 100 % without the successes.
        for _ in 0..3 {
            vm.success(&s, &st, "model", "a", 0);
        }
        for _ in 0..2 {
            let r = record(&mut vm.cx(&s, &st), "model", "a", fail(), false, MS);
            assert_eq!(r.transition, None);
        }
        let (b, _) = store::peek::<breaker::BreakerState>(&s, &breaker::key("model", "a")).unwrap();
        assert_eq!(b.unwrap().window_counts(&st.cfg, MS), (3, 2));
        // One more failure: 3 of 6 = 50 % opens it.
        let r = record(&mut vm.cx(&s, &st), "model", "a", fail(), false, MS);
        assert_eq!(r.transition.map(|t| t.reason), Some("failure_rate"));
    }

    #[test]
    fn names_that_share_a_key_gather_apart_and_a_failure_carries_them_all() {
        let s = MemStore::new();
        let st = rate_settings();
        let mut vm = Vm::new();
        // "a b" and "a_b" are both `tg:cb:model=a_b`, whose window is old (640 outcomes).
        let key = breaker::key("model", "a_b");
        breaker::record_batch_shared(&s, &key, &st.cfg, 640, None, 0, 8).unwrap();
        // The first success of each is written at once (the VM learns the batch: 10); then gathered.
        vm.success(&s, &st, "model", "a b", 0);
        vm.success(&s, &st, "model", "a_b", 0);
        assert_eq!(vm.vm.pending.entries.len(), 2);
        for _ in 0..2 {
            vm.success(&s, &st, "model", "a b", MS);
            vm.success(&s, &st, "model", "a_b", MS);
        }
        assert_eq!(vm.vm.pending.total(), 4);
        let r = record(&mut vm.cx(&s, &st), "model", "a_b", fail(), false, 2 * MS);
        assert_eq!(r.key.as_deref(), Some(key.as_str()));
        assert_eq!(vm.vm.pending.total(), 0);
        assert!(!vm.vm.pending.any());
        let (b, _) = store::peek::<breaker::BreakerState>(&s, &key).unwrap();
        assert_eq!(b.unwrap().window_counts(&st.cfg, 2 * MS), (646, 1));
    }

    #[test]
    fn the_check_for_due_successes_is_one_comparison_and_never_misses_one() {
        let s = MemStore::new();
        let st = rate_settings();
        let mut vm = Vm::new();
        // An old window, so that successes are gathered (batch 10).
        let key = breaker::key("model", "a");
        breaker::record_batch_shared(&s, &key, &st.cfg, 640, None, 0, 8).unwrap();
        vm.success(&s, &st, "model", "a", 0);
        vm.success(&s, &st, "model", "a", MS);
        assert!(vm.vm.pending.any());
        assert!(!vm.vm.pending.due(MS));
        assert!(!vm.vm.pending.due((SUCCESS_FLUSH_MS + 1) * MS - 1));
        assert!(vm.vm.pending.due((SUCCESS_FLUSH_MS + 1) * MS));
        // Taken by a failure: `due` may still say so; the flush finds nothing and makes it exact.
        record(&mut vm.cx(&s, &st), "model", "a", fail(), false, 2 * MS);
        assert!(!vm.vm.pending.any());
        let reads = s.reads();
        assert!(flush(&mut vm.cx(&s, &st), (SUCCESS_FLUSH_MS + 1) * MS, false).is_empty());
        assert_eq!(s.reads(), reads, "nothing was written");
        assert!(!vm.vm.pending.due(u64::MAX));
        // A success gathered after that is due SUCCESS_FLUSH_MS after it, not after the first one.
        vm.success(&s, &st, "model", "a", 50 * MS);
        assert!(vm.vm.pending.any());
        assert!(!vm.vm.pending.due(149 * MS));
        assert!(vm.vm.pending.due(150 * MS));
    }

    #[test]
    fn the_tick_writes_every_success_whatever_its_age() {
        let s = MemStore::new();
        let st = rate_settings();
        let mut vm = Vm::new();
        vm.success(&s, &st, "cluster", "p", 0);
        vm.success(&s, &st, "model", "a", 0);
        assert!(flush(&mut vm.cx(&s, &st), MS, true).is_empty());
        assert_eq!(vm.vm.pending.total(), 0);
        for k in [breaker::key("cluster", "p"), breaker::key("model", "a")] {
            let (b, _) = store::peek::<breaker::BreakerState>(&s, &k).unwrap();
            assert_eq!(b.unwrap().window_counts(&st.cfg, MS), (1, 0), "{k}");
        }
    }
}
