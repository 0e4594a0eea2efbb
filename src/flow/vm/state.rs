//! What one VM keeps between callbacks ([`Worker`]): requests held by shaping, the caches that save host
//! calls, the log gate, and the state of each kind of per-VM work — the settlement sender, the global
//! credits, the quota and global-bucket lease calls, the start-up probes. The work itself is in the
//! sibling files (`tick.rs` calls them); the types are here, apart, so that every file that works with
//! a [`Cx`](crate::flow::cx::Cx) can name them without importing one another.

use crate::breaker::failover::VmBreakers;
use crate::flow::logs::LogGate;
use crate::identity::KeyCache;
use crate::quota::settlement::Job;
use crate::store::hash::FnvBuild;
use crate::store::registry::KeySet;
use std::collections::HashMap;

/// Most entries kept in [`Worker::known_keys`] before it is cleared.
pub const KNOWN_KEYS_CACHE: usize = 50_000;
/// Credits kept queued per VM; beyond, the oldest is dropped (counted).
pub const MAX_QUEUED_CREDITS: usize = 10_000;

/// For this long after this VM served a tenant's request from a lease, the headers phase does not read
/// the tenant's exhausted marker (see [`Leases::served_recently`]).
pub const SERVED_SKIPS_MARKER_NS: u64 = 100_000_000;
/// Tenants remembered as served from a lease, per VM (the map is cleared when it is full).
pub const MAX_SERVED: usize = 4096;
/// This VM's state.
#[derive(Default)]
pub struct Worker {
    /// Requests held by shaping: (context id, release time ns).
    pub held: Vec<(u32, u64)>,
    /// Shared-data keys known to exist (saves a read per request; bounded by
    /// [`KNOWN_KEYS_CACHE`]).
    pub known_keys: KeySet,
    /// Tenant ids of recently seen API keys.
    pub key_tenants: KeyCache,
    /// Redis has the quota scripts cached (EVALSHA works).
    pub quota_script_loaded: bool,
    /// Redis has the global bucket script cached.
    pub global_script_loaded: bool,
    /// Redis has the fair bucket script cached.
    pub fair_script_loaded: bool,
    /// The gauges of each fair limit as this VM last set them: (limit name, active members, share per
    /// unit of weight in whole tokens/s). A gauge is set only when its value changed.
    pub fair_gauges: Vec<(String, u64, u64)>,
    /// Log rate limiter.
    pub logs: LogGate,
    /// The start-up checks of the shim clusters.
    pub probes: Probes,
    /// The VM's part of the settlement journal.
    pub settle: Sender,
    /// The VM's quota lease calls.
    pub leases: Leases,
    /// The VM's global-bucket lease calls.
    pub gleases: GLeases,
    /// Successes of failure-rate breakers not written yet.
    pub breakers: VmBreakers,
    /// Global bucket credits queued and in flight.
    pub credits: Credits,
    /// Reservations of several requests sent as one call (`super::batch`).
    pub batch: Batcher,
}

impl Worker {
    /// Holds request `id` until `until_ns` (released by the tick).
    pub fn hold(&mut self, id: u32, until_ns: u64) {
        self.held.push((id, until_ns));
    }

    /// Forgets a context that went away (no harm if it was not held).
    pub fn forget(&mut self, id: u32) {
        self.held.retain(|(h, _)| *h != id);
    }
}

/// The shim clusters are checked once per VM, at its first tick.
#[derive(Default)]
pub struct Probes {
    /// The check was made.
    pub(in crate::flow) done: bool,
    /// Probes in flight: cluster names by probe order.
    pub(in crate::flow) inflight: Vec<String>,
}

/// A global bucket credit (negative: a debit).
#[derive(Debug, Clone, PartialEq)]
pub struct Credit {
    /// Redis key of the bucket.
    pub key: String,
    /// Rule index (for its bucket parameters).
    pub rule: usize,
    /// Tokens.
    pub amount: i64,
    /// A fair limit's record: the member the credit is for (`None`: a plain global bucket).
    pub member: Option<FairMember>,
}

/// A fair limit's member, owned (see [`crate::limits::fair::Member`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FairMember {
    /// The member's id (tenant, or group path).
    pub id: String,
    /// FNV-1a of the id.
    pub hash: u64,
    /// Its weight.
    pub weight: f64,
    /// Its priority level.
    pub level: u8,
}

impl FairMember {
    /// As the fair module takes it.
    pub fn as_member(&self) -> crate::limits::fair::Member<'_> {
        crate::limits::fair::Member {
            id: std::borrow::Cow::Borrowed(self.id.as_str()),
            hash: self.hash,
            weight: self.weight,
            level: self.level,
        }
    }
}

/// Global bucket credits waiting for the tick, and those sent.
#[derive(Default)]
pub struct Credits {
    pub(in crate::flow) queue: Vec<Credit>,
    pub(in crate::flow) inflight: HashMap<u64, Credit, FnvBuild>,
    pub(in crate::flow) next_id: u64,
}

impl Credits {
    /// Queues a credit (or debit); true when the oldest had to be dropped to make room.
    pub fn push(&mut self, credit: Credit) -> bool {
        if credit.amount == 0 {
            return false;
        }
        let dropped = self.queue.len() >= MAX_QUEUED_CREDITS;
        if dropped {
            self.queue.remove(0);
        }
        self.queue.push(credit);
        dropped
    }

    /// Credits waiting (queued, not in flight).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// Settlement entries sent and not answered yet.
pub(in crate::flow) struct Window {
    pub head: u64,
    pub end: u64,
    /// The calls in flight: each its tenant groups (one call for the whole window, or one per group
    /// behind a Redis Cluster), and whether it went as `EVAL`.
    pub batches: HashMap<u64, (Vec<Vec<Job>>, bool), FnvBuild>,
    /// A call failed because the shim was away (sent again after a backoff).
    pub unavailable: bool,
    /// A call or a group failed with an error Redis gave (counts towards `settle_max_attempts`).
    pub refused: Option<String>,
    /// Request ids of the settlements not taken (their call or group failed): what a retry sends.
    pub failed: Vec<String>,
}

/// What the retry of a window sends: the journal's entries from `head` to `end` whose request id is in
/// `ids` (the others were taken), and whatever came after `end`.
pub(in crate::flow) struct Retry {
    pub head: u64,
    pub end: u64,
    pub ids: Vec<String>,
}

/// The VM's part of the settlement journal.
#[derive(Default)]
pub struct Sender {
    pub(in crate::flow) owner: u64,
    pub(in crate::flow) window: Option<Window>,
    pub(in crate::flow) local: Vec<Job>,
    pub(in crate::flow) stalled: Option<(u64, u64)>,
    pub(in crate::flow) retry_at: u64,
    pub(in crate::flow) attempts: u32,
    pub(in crate::flow) next_id: u64,
    /// The journal's length this VM last reported (`tokengate_quota_settle_backlog`).
    pub(in crate::flow) backlog: Option<u64>,
    /// Redis answered the settlement batch script (`EVALSHA` from then on).
    pub(in crate::flow) loaded: bool,
    /// A Redis Cluster refused a call of several tenants (`CROSSSLOT`): one call per tenant group.
    pub(in crate::flow) per_tenant: bool,
    /// The part of the window still to send, after a call or group failed.
    pub(in crate::flow) retry: Option<Retry>,
    /// When this VM last sent a window (0: never).
    pub(in crate::flow) last_sent: u64,
}

impl Sender {
    /// Settlements waiting in this VM (the journal was busy).
    pub fn local(&self) -> usize {
        self.local.len()
    }
}

/// A quota lease sync in flight.
pub(in crate::flow) struct LeaseCall {
    pub tenant: String,
    pub model: Option<String>,
    pub key: String,
    pub typical: u64,
    /// The sync is the shim breaker's half-open probe.
    pub probe: bool,
}

/// The VM's quota lease state.
#[derive(Default)]
pub struct Leases {
    pub(in crate::flow) envoy: u64,
    pub(in crate::flow) owner: u64,
    pub(in crate::flow) cursor: u64,
    /// When this VM last walked the accounts as the leader (ns; [`crate::flow::vm::leases::WALK_MS`]).
    pub(in crate::flow) walked_at: u64,
    /// How many accounts were registered at this VM's last walk.
    pub(in crate::flow) registered: u64,
    /// Accounts this VM saw miss: (tenant, model, a request's cost).
    pub(in crate::flow) dirty: Vec<(String, Option<String>, u64)>,
    /// Lease calls in flight: the accounts of each (one: the lease script; more: the batch script).
    pub(in crate::flow) pending: HashMap<u64, Vec<LeaseCall>, FnvBuild>,
    pub(in crate::flow) next_id: u64,
    /// Redis has the lease script cached.
    pub loaded: bool,
    /// Redis has the lease batch script cached.
    pub(in crate::flow) batch_loaded: bool,
    /// A Redis Cluster refused a batch of several tenants (`CROSSSLOT`): from then on a batch carries
    /// one tenant's accounts.
    pub(in crate::flow) per_tenant: bool,
    /// Tenants whose token quota this VM last served from a lease, and when (ns).
    pub(in crate::flow) served: HashMap<String, u64, FnvBuild>,
    /// Leased requests that ended on this VM, by account key, not written into their account yet.
    pub(in crate::flow) unsettled: Vec<(String, crate::quota::lease::account::Settled)>,
    /// The provider's input/output tokens of leased requests that ended on this VM, by account key and
    /// month (`YYYYMM`), not written into the account's io record yet (written at the tick, before the
    /// accounts: [`crate::flow::vm::leases::flush`]).
    pub(in crate::flow) unsettled_io: Vec<(String, u32, u64, u64)>,
    /// The input/output totals this VM's lease calls in flight reported, by account key: (month,
    /// totals; month 0 when two calls of different months are in flight), to tell from an answer
    /// that the account's io record is behind Redis.
    pub(in crate::flow) io_sent: HashMap<String, (u32, (u64, u64)), FnvBuild>,
}

impl Leases {
    /// True when this VM served a request of `tenant`'s token quota from a lease less than
    /// [`SERVED_SKIPS_MARKER_NS`] before `now`. The headers phase then does not read the tenant's
    /// exhausted marker (a shared-data read per request): while a lease serves the tenant no marker is
    /// written (see the quota step, `request/steps/quota.rs`), and a request let through anyway meets the lease, or Redis, in the
    /// body phase — the marker only saves refused requests a callout, it never admits one. The cost of
    /// a tenant that becomes exhausted within that time: its requests on this VM are refused in the
    /// body phase (a reservation callout each) instead of the headers phase, for at most that time.
    pub fn served_recently(&self, tenant: &str, now: u64) -> bool {
        self.served
            .get(tenant)
            .is_some_and(|at| now.saturating_sub(*at) < SERVED_SKIPS_MARKER_NS)
    }

    /// Notes that `tenant`'s token quota was served from a lease at `now`.
    pub(in crate::flow) fn served(&mut self, tenant: &str, now: u64) {
        if let Some(at) = self.served.get_mut(tenant) {
            *at = now;
            return;
        }
        if self.served.len() >= MAX_SERVED {
            self.served.clear();
        }
        self.served.insert(tenant.to_string(), now);
    }
}

/// A global lease call in flight: a block (tokens, requests) asked alone, or one credited back.
pub(in crate::flow) enum GLeaseKind {
    /// A block (tokens, requests) asked alone.
    TopUp(u64, u64),
    /// A lease (tokens, requests) credited back.
    GiveBack(u64, u64),
}

/// A global lease call in flight.
pub(in crate::flow) struct GLeaseCall {
    pub rule: usize,
    pub key: String,
    pub kind: GLeaseKind,
}

/// The VM's global-lease state.
#[derive(Default)]
pub struct GLeases {
    pub(in crate::flow) owner: u64,
    pub(in crate::flow) cursor: u64,
    /// Accounts this VM saw run low: (rule index, Redis key).
    pub(in crate::flow) dirty: Vec<(usize, String)>,
    /// Tokens and requests to credit back to Redis: (rule, Redis key, tokens, requests).
    pub(in crate::flow) returns: Vec<(usize, String, u64, u64)>,
    pub(in crate::flow) pending: HashMap<u64, GLeaseCall, FnvBuild>,
    pub(in crate::flow) next_id: u64,
}

/// One reservation waiting in this VM's batcher, or sent in one of its calls.
pub(in crate::flow) struct Waiting {
    /// The request's context id.
    pub context: u32,
    /// The reservation.
    pub args: crate::quota::ReserveArgs,
    /// When it started to wait (ns).
    pub since: u64,
    /// Its request went (client gone) after it was sent: its answer is dropped.
    pub gone: bool,
}

/// A batch call in flight.
pub(in crate::flow) struct BatchCall {
    pub entries: Vec<Waiting>,
    /// Sent as `EVAL`.
    pub eval: bool,
    /// It is the shim breaker's half-open probe.
    pub probe: bool,
}

/// What a batched reservation's request reads when the root continues it.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::flow) struct BatchResult {
    /// Redis' decision, or why there is none.
    pub result: Result<crate::quota::ReserveReply, crate::shim::webdis::Failure>,
    /// When there is none: Redis may have run the reservation all the same.
    pub may_have_run: bool,
}

/// The VM's group commit of reservations (see `super::batch`).
#[derive(Default)]
pub struct Batcher {
    pub(in crate::flow) queue: Vec<Waiting>,
    pub(in crate::flow) inflight: HashMap<u64, BatchCall, FnvBuild>,
    /// Requests whose own reservation callout is in flight (sent alone), and since when (ns).
    pub(in crate::flow) singles: Vec<(u32, u64)>,
    pub(in crate::flow) results: HashMap<u32, BatchResult, FnvBuild>,
    /// Requests whose answer came, in order: the host continues each in its own context.
    pub ready: Vec<u32>,
    /// A wake of the root was asked and not seen yet.
    pub(in crate::flow) wake_asked: bool,
    /// Redis refused a batch of several tenants (`CROSSSLOT`: a Redis Cluster): from then on a call
    /// carries one tenant's reservations.
    pub(in crate::flow) per_tenant: bool,
    /// Redis has the batch script cached.
    pub(in crate::flow) loaded: bool,
    pub(in crate::flow) next_id: u64,
}

impl Batcher {
    /// Reservations waiting to be sent.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Drops what was kept for a request that is gone (its answer came after it went).
    pub fn discard(&mut self, context: u32) {
        self.results.remove(&context);
    }
}
