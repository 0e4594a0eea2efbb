//! Quota leases, the VM's side (the accounts are [`crate::quota::lease::account`], the Redis side
//! [`crate::quota::lease::redis`]): a request whose account holds enough is reserved from it in shared
//! data — no callout ([`take`]) — and settles into it ([`settle`]); any other request takes the
//! per-request path (a reservation callout) and asks for a sync. Syncs are sent by the tick of the VM
//! that saw the miss, and by the VM holding the leader claim, which walks every account to report
//! usage, renew, return idle leases and settle last month's ([`tick`]).

use super::state::LeaseCall;
use crate::config::{LeaseSettings, QuotaSettings};
use crate::flow::cx::Cx;
use crate::flow::effect::{Callout, CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::shim;
use crate::quota::calendar;
use crate::quota::lease::account::{self, Account, Miss, Settled, Synced, Take};
use crate::quota::lease::io;
use crate::quota::{self, LeaseArgs, LeaseReply, QuotaKeys};
use crate::shim::webdis::ShimError;

/// Syncs started per tick for accounts this VM saw miss.
pub const DIRTY_PER_TICK: usize = 16;
/// Accounts the leader looks at per 20 ms tick, on average: it walks every [`WALK_MS`], this many
/// for each 20 ms.
pub const SCAN_PER_TICK: u64 = 32;
/// The leader walks the accounts at most this often (ms): a walk reads its claim, the registry's count
/// and slots; walking at every 20 ms tick cost a VM with nothing to sync six shared-data reads and a
/// write 50 times a second.
pub const WALK_MS: u64 = 100;
/// Accounts the leader looks at per walk: [`SCAN_PER_TICK`] for each 20 ms tick of [`WALK_MS`], at least
/// (more accounts than that are walked faster: [`walk_size`]).
pub const SCAN_PER_WALK: u64 = SCAN_PER_TICK * WALK_MS / 20;
/// The most accounts the leader looks at in one walk (about 6 M instructions of shared-data reads).
pub const MAX_SCAN_PER_WALK: u64 = 1024;
/// With more accounts than [`SCAN_PER_WALK`], the leader walks at every 20 ms tick, a smaller slice each.
pub const BUSY_WALK_MS: u64 = 20;
/// Most accounts synced in one script call (the lease batch script, `quota::lease::batch`): with
/// [`SCAN_PER_WALK`] and [`DIRTY_PER_TICK`], a walk and a tick each send one to three calls.
pub const MAX_SYNC_BATCH: usize = 64;
/// Accounts remembered as needing a sync, per VM.
pub const MAX_DIRTY: usize = 1024;
/// Accounts with ended leased requests not written yet, per VM (all are written when it is full).
pub const MAX_UNSETTLED: usize = 64;

fn month_label(code: u32) -> String {
    format!("{:04}-{:02}", code / 100, code % 100)
}

/// What a reservation asks of a lease: the account (`tenant` × `model`), its month label, its cost, and
/// whether it is a tenant's token quota (not a budget).
pub struct Ask<'a> {
    /// The account's tenant (or a budget's account).
    pub tenant: &'a str,
    /// The model of a per-model account.
    pub model: Option<&'a str>,
    /// The reservation's month (`2026-11`).
    pub month: &'a str,
    /// Weighted cost.
    pub cost: u64,
    /// A tenant's token quota (budgets are not remembered as served).
    pub tokens: bool,
}

/// Reserves `ask` from its account's lease. `Some((account, key))` when it was (`key`: the account's
/// shared-data key, where the request settles); otherwise the request takes the per-request path and
/// the account asks for a sync.
pub fn take(cx: &mut Cx, ask: &Ask) -> Option<(Account, String)> {
    let (tenant, model, cost) = (ask.tenant, ask.model, ask.cost);
    let key = account::account_key(tenant, model);
    let month = account::month_code(ask.month);
    let now = cx.now();
    // This VM's ended requests of the account are written in the same CAS.
    let unsettled = &cx.worker.leases.unsettled;
    // Not when the split of ended requests of another month waits for the tick: the account keeps
    // them in flight until [`flush`] wrote their split first, so the sync that gives that month's
    // lease back (it waits for nothing in flight) reports their tokens too.
    let other_month = cx
        .worker
        .leases
        .unsettled_io
        .iter()
        .any(|(k, m, _, _)| *k == key && *m != month);
    let at = unsettled
        .iter()
        .position(|(k, _)| *k == key)
        .filter(|_| !other_month);
    let done = at
        .and_then(|i| unsettled.get(i))
        .map_or(Settled::default(), |(_, d)| *d);
    let (took, written) = account::take_after(
        cx.store(),
        &key,
        done,
        cost,
        month,
        now,
        0,
        cx.cfg.cas_max_retries,
    );
    if let Some(i) = at.filter(|_| written) {
        cx.worker.leases.unsettled.swap_remove(i);
    }
    match took {
        Take::Hit(a) => {
            cx.inc(Metric::QuotaLeased);
            if ask.tokens {
                cx.worker.leases.served(tenant, now);
            }
            if a.wants_sync() {
                mark(cx, tenant, model, cost);
            }
            Some((a, key))
        }
        Take::Miss(why) => {
            if why == Miss::Cold {
                let entry = format!("{tenant}\n{}", model.unwrap_or(""));
                if !account::REGISTRY.register(
                    cx.store(),
                    &entry,
                    cx.cfg.max_tenants,
                    cx.cfg.cas_max_retries,
                ) {
                    // Every account slot is taken: this one is never leased (its lease could not be
                    // renewed or given back by the leader).
                    account::forbid(cx.store(), &key, cx.cfg.cas_max_retries);
                    return None;
                }
            }
            if why != Miss::Spent && why != Miss::Store {
                mark(cx, tenant, model, cost);
            }
            None
        }
    }
}

fn mark(cx: &mut Cx, tenant: &str, model: Option<&str>, cost: u64) {
    let d = &mut cx.worker.leases.dirty;
    if d.iter()
        .any(|(t, m, _)| t == tenant && m.as_deref() == model)
    {
        return;
    }
    if d.len() >= MAX_DIRTY {
        d.remove(0);
    }
    d.push((tenant.to_string(), model.map(str::to_string), cost));
}

/// A leased request ended: its reservation is to be replaced by its usage in the account at `key`.
/// Kept by the VM and written with the next request this VM reserves from that account (in the same
/// CAS, [`account::take_after`]) or at the VM's next tick ([`flush`]), whichever comes first: one
/// shared-data read and write less per leased request. Until then the account counts the reservation
/// as in flight (other workers see less available, never more) and a sync reports the usage a tick
/// later.
pub fn settle(cx: &mut Cx, key: &str, reserved: u64, actual: u64) {
    let unsettled = &mut cx.worker.leases.unsettled;
    if let Some((_, d)) = unsettled.iter_mut().find(|(k, _)| k == key) {
        d.add(reserved, actual);
        return;
    }
    if unsettled.len() >= MAX_UNSETTLED {
        flush(cx);
    }
    let mut d = Settled::default();
    d.add(reserved, actual);
    cx.worker.leases.unsettled.push((key.to_string(), d));
}

/// A leased request of month `month` (`2026-11`) ended with the provider's `tokens_in`/`tokens_out`:
/// added to its account's io record at the VM's next tick ([`flush`]; one CAS per account and tick,
/// none per request), reported with the account's next sync.
pub fn settle_io(cx: &mut Cx, key: &str, month: &str, tokens_in: u64, tokens_out: u64) {
    if tokens_in == 0 && tokens_out == 0 {
        return;
    }
    let month = account::month_code(month);
    let pending = &mut cx.worker.leases.unsettled_io;
    if let Some((_, _, i, o)) = pending
        .iter_mut()
        .find(|(k, m, _, _)| k == key && *m == month)
    {
        *i = i.saturating_add(tokens_in);
        *o = o.saturating_add(tokens_out);
        return;
    }
    if pending.len() >= MAX_UNSETTLED {
        flush(cx);
    }
    cx.worker
        .leases
        .unsettled_io
        .push((key.to_string(), month, tokens_in, tokens_out));
}

/// Writes every ended leased request this VM keeps into its account (the tick, and [`settle`] when
/// [`MAX_UNSETTLED`] accounts wait). One the store refuses is kept for the next tick.
pub fn flush(cx: &mut Cx) {
    let retries = cx.cfg.cas_max_retries;
    // The split first: a sync that reads an account's usage then finds its requests' tokens (one the
    // store refuses keeps its account's requests in flight too, written together at a later tick).
    let mut io_kept = 0;
    for (key, month, i, o) in std::mem::take(&mut cx.worker.leases.unsettled_io) {
        if io::add(cx.store(), &io::io_key(&key), month, i, o, retries) {
            continue;
        }
        write_failed(
            cx,
            format!("cannot add leased requests' input/output tokens to {key}"),
        );
        if cx.worker.leases.unsettled_io.len() < MAX_UNSETTLED {
            cx.worker.leases.unsettled_io.push((key, month, i, o));
        }
        io_kept += 1;
    }
    for (key, d) in std::mem::take(&mut cx.worker.leases.unsettled) {
        if io_kept > 0
            && cx
                .worker
                .leases
                .unsettled_io
                .iter()
                .any(|(k, _, _, _)| *k == key)
        {
            cx.worker.leases.unsettled.push((key, d));
            continue;
        }
        if account::settle(cx.store(), &key, d.reserved, d.actual, retries) {
            continue;
        }
        write_failed(cx, format!("cannot settle leased requests into {key}"));
        if cx.worker.leases.unsettled.len() < MAX_UNSETTLED {
            cx.worker.leases.unsettled.push((key, d));
        }
    }
}

/// A shared-data write of [`flush`] the store refused (`what`): counted, logged; kept for the next tick.
fn write_failed(cx: &mut Cx, what: String) {
    cx.inc(Metric::StoreErrors);
    cx.log_failure(
        Level::Warn,
        "lease_store",
        format!("{what}: tried again at the next tick"),
    );
}

/// The root's tick: writes this VM's ended leased requests ([`flush`]), then syncs of accounts this VM
/// saw miss, then (on the leader) a slice of all accounts — all of them sent together, up to
/// [`MAX_SYNC_BATCH`] accounts per script call ([`send`]).
pub fn tick(cx: &mut Cx, q: &QuotaSettings, l: &LeaseSettings) {
    // Before any sync reads the accounts: this VM's usage is in what they report.
    flush(cx);
    let Some(probe) = shim::admit_background(cx, &q.cluster, &q.shim_breaker) else {
        return;
    };
    let now = cx.now();
    if cx.worker.leases.envoy == 0 {
        cx.worker.leases.envoy = account::envoy_id(cx.store(), now);
    }
    if probe {
        // Half-open: one sync only, the probe, sent alone; its failure opens the breaker again.
        while !cx.worker.leases.dirty.is_empty() {
            let (tenant, model, cost) = cx.worker.leases.dirty.remove(0);
            if let Some(one) = prepare(cx, q, l, &tenant, model.as_deref(), cost, true) {
                send(cx, q, vec![one]);
                return;
            }
        }
        let mut one = Vec::new();
        leader_slice(cx, q, l, true, &mut one);
        if one.is_empty() {
            // Nothing to sync now: the permit is given back.
            shim::release_probe(cx, &q.cluster);
        } else {
            send(cx, q, one);
        }
        return;
    }
    let n = cx.worker.leases.dirty.len().min(DIRTY_PER_TICK);
    let dirty: Vec<_> = cx.worker.leases.dirty.drain(..n).collect();
    let mut syncs = Vec::new();
    for (tenant, model, cost) in dirty {
        syncs.extend(prepare(cx, q, l, &tenant, model.as_deref(), cost, false));
    }
    leader_slice(cx, q, l, false, &mut syncs);
    send(cx, q, syncs);
}

/// On the leader, the syncs of a slice of all accounts that need one, into `out`; with `probe`, only
/// the first.
fn leader_slice(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    probe: bool,
    out: &mut Vec<Sync>,
) {
    // A probe goes at once; otherwise a walk every WALK_MS (every tick with many accounts).
    let now = cx.now();
    let elapsed_ms = now.saturating_sub(cx.worker.leases.walked_at) / 1_000_000;
    let every = if cx.worker.leases.registered > SCAN_PER_WALK {
        BUSY_WALK_MS
    } else {
        WALK_MS
    };
    if !probe && elapsed_ms < every {
        return;
    }
    cx.worker.leases.walked_at = now;
    let retries = cx.cfg.cas_max_retries;
    if cx.worker.leases.owner == 0 {
        cx.worker.leases.owner = crate::store::claim::owner_id(cx.store(), retries).unwrap_or(0);
    }
    let owner = cx.worker.leases.owner;
    if owner == 0 || !crate::store::claim::hold(cx.store(), account::LEADER, owner, now, retries) {
        return;
    }
    let total = account::REGISTRY.registered(cx.store());
    cx.worker.leases.registered = total;
    if total == 0 {
        return;
    }
    for _ in 0..walk_size(total, elapsed_ms, l.policy.refresh_ns / 1_000_000) {
        let i = cx.worker.leases.cursor % total;
        cx.worker.leases.cursor = cx.worker.leases.cursor.wrapping_add(1);
        let Some(entry) = account::REGISTRY.slot(cx.store(), i) else {
            continue;
        };
        let (tenant, model) = match entry.split_once('\n') {
            Some((t, "")) => (t.to_string(), None),
            Some((t, m)) => (t.to_string(), Some(m.to_string())),
            None => continue,
        };
        if let Some(s) = prepare(cx, q, l, &tenant, model.as_deref(), 0, probe) {
            out.push(s);
            if probe {
                return;
            }
        }
    }
}

/// How many of `total` accounts a walk `elapsed_ms` after the last one looks at: every account once per
/// `refresh_ms` (so each account's usage is reported at least that often, whatever their number), and
/// never fewer than [`SCAN_PER_TICK`] per 20 ms; at most [`MAX_SCAN_PER_WALK`] and `total`.
pub fn walk_size(total: u64, elapsed_ms: u64, refresh_ms: u64) -> u64 {
    let floor = SCAN_PER_TICK.saturating_mul(elapsed_ms) / 20;
    let cover = total.saturating_mul(elapsed_ms).div_ceil(refresh_ms.max(1));
    floor.max(cover).clamp(1, MAX_SCAN_PER_WALK).min(total)
}

/// One account's sync, begun in its account and not sent yet.
struct Sync {
    call: LeaseCall,
    args: LeaseArgs,
}

/// Begins a sync of one account if it needs one (`probe`: it is the shim breaker's probe).
fn prepare(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    tenant: &str,
    model: Option<&str>,
    typical: u64,
    probe: bool,
) -> Option<Sync> {
    let key = account::account_key(tenant, model);
    let sc = sync_ctx(cx, q, l, typical);
    let (plan, _) = account::begin_sync(cx.store(), &key, &sc)?;
    let args = call_args(cx, q, l, tenant, model, &plan);
    Some(Sync {
        call: LeaseCall {
            tenant: tenant.to_string(),
            model: model.map(str::to_string),
            key,
            typical,
            probe,
        },
        args,
    })
}

/// Sends `syncs`: one script call per [`MAX_SYNC_BATCH`] accounts (behind a Redis Cluster that refused
/// a batch of several tenants, per tenant), the lease script itself for a call of one account.
fn send(cx: &mut Cx, q: &QuotaSettings, syncs: Vec<Sync>) {
    let groups = if cx.worker.leases.per_tenant {
        let mut groups: Vec<Vec<Sync>> = Vec::new();
        for s in syncs {
            match groups
                .iter_mut()
                .find(|g| g.first().is_some_and(|f| f.call.tenant == s.call.tenant))
            {
                Some(g) => g.push(s),
                None => groups.push(vec![s]),
            }
        }
        groups
    } else {
        vec![syncs]
    };
    for mut group in groups {
        while !group.is_empty() {
            let rest = group.split_off(group.len().min(MAX_SYNC_BATCH));
            send_one_call(cx, q, group);
            group = rest;
        }
    }
}

/// Sends the syncs of `group` (1 ..= [`MAX_SYNC_BATCH`] accounts) in one script call.
fn send_one_call(cx: &mut Cx, q: &QuotaSettings, group: Vec<Sync>) {
    let s = &cx.worker.leases;
    let body = match group.as_slice() {
        [] => return,
        [one] => quota::lease_request(&one.args, shim::script_call(s.loaded)),
        many => {
            let refs: Vec<&LeaseArgs> = many.iter().map(|x| &x.args).collect();
            quota::lease_batch_request(&refs, shim::script_call(s.batch_loaded))
        }
    };
    let s = &mut cx.worker.leases;
    s.next_id = s.next_id.wrapping_add(1);
    let id = s.next_id;
    s.pending
        .insert(id, group.into_iter().map(|x| x.call).collect());
    dispatch(cx, q, Purpose::Lease(id), body);
}

/// Sends a lease call.
fn dispatch(cx: &mut Cx, q: &QuotaSettings, purpose: Purpose, body: String) {
    let c = callout(cx, q, purpose, body);
    cx.fx.push(Effect::Dispatch(c));
}

/// A lease call (counted as sent).
fn callout(cx: &mut Cx, q: &QuotaSettings, purpose: Purpose, body: String) -> Callout {
    cx.inc(Metric::QuotaLeaseSyncs);
    shim::callout(purpose, &q.cluster, &q.authority, q.timeout_ms, body)
}

/// The lease call of `plan` for the account of `tenant` (× `model`), as a Webdis body.
fn call_body(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    tenant: &str,
    model: Option<&str>,
    plan: &account::SyncPlan,
) -> String {
    let args = call_args(cx, q, l, tenant, model, plan);
    quota::lease_request(&args, shim::script_call(cx.worker.leases.loaded))
}

/// The lease call of `plan` for the account of `tenant` (× `model`), with the input/output totals of
/// its month in the account's io record (remembered to check the answer against, [`io_answered`]).
fn call_args(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    tenant: &str,
    model: Option<&str>,
    plan: &account::SyncPlan,
) -> LeaseArgs {
    let label = month_label(plan.month);
    let keys = QuotaKeys::new(tenant, model, &label, "-");
    let akey = account::account_key(tenant, model);
    let sent = io::totals(cx.store(), &io::io_key(&akey), plan.month);
    remember_sent(cx, akey, plan.month, sent);
    let tq = q.tenant(tenant);
    let default_model_limit = model
        .and_then(|md| tq.model_limits.iter().find(|(x, _)| x == md))
        .map_or(0, |(_, v)| *v);
    let expire = calendar::end_of_month(
        i32::try_from(plan.month / 100).unwrap_or(0),
        plan.month % 100,
        q.month_offset_minutes,
    )
    .saturating_add(i64::try_from(q.grace_seconds).unwrap_or(0));
    LeaseArgs {
        keys,
        lease_id: quota::lease_id(cx.worker.leases.envoy, model, &label),
        reported_total: plan.reported_total,
        want: plan.want,
        target: plan.target,
        // A budget's account (`~b:…`) has its own limit, in micro-units.
        default_limit: q.account_limit(tenant),
        default_model_limit,
        expire_at_unix: expire,
        ttl_s: l.ttl_s,
        max_grant: plan.want,
        max_share_percent: (l.policy.max_share * 100.0).round().clamp(1.0, 100.0) as u32,
        tokens_in: sent.0,
        tokens_out: sent.1,
    }
}

/// Lease calls whose reported input/output totals a VM remembers until they answer.
pub const MAX_IO_SENT: usize = 4096;

/// Remembers the input/output totals a lease call of the account at `key` reports (bounded: all are
/// forgotten when [`MAX_IO_SENT`] wait; two calls of different months in flight: neither is checked).
fn remember_sent(cx: &mut Cx, key: String, month: u32, sent: (u64, u64)) {
    let v = &mut cx.worker.leases.io_sent;
    if let Some(e) = v.get_mut(&key) {
        if e.0 != month {
            e.0 = 0;
        }
        e.1 = sent;
        return;
    }
    if v.len() >= MAX_IO_SENT {
        // Answers that never came (timed out): forgotten, their checks skipped.
        v.clear();
    }
    v.insert(key, (month, sent));
}

/// A lease call of the account at `key` answered that Redis holds `redis` (input, output) for the
/// lease: when that is more than the call reported, the account's io record lost what it had
/// reported, and is raised so that its next report adds what it counted since ([`io::synced`]; one
/// CAS, only then).
fn io_answered(cx: &mut Cx, key: &str, redis: (u64, u64)) {
    let Some((month, sent)) = cx.worker.leases.io_sent.remove(key) else {
        return;
    };
    if month == 0 {
        return;
    }
    let retries = cx.cfg.cas_max_retries;
    if io::synced(cx.store(), &io::io_key(key), month, sent, redis, retries) {
        cx.log_failure(
            Level::Warn,
            "lease_io_behind",
            format!(
                "the input/output record of {key} was behind Redis: raised to count what it adds"
            ),
        );
    }
}

/// The sync context of now (the quota's month) for `typical`.
fn sync_ctx<'a>(
    cx: &Cx,
    q: &QuotaSettings,
    l: &'a LeaseSettings,
    typical: u64,
) -> account::SyncCtx<'a> {
    let now_s = q.now_s(cx.now());
    let (y, m) = calendar::month_of(now_s, q.month_offset_minutes);
    account::SyncCtx {
        month: u32::try_from(y)
            .unwrap_or(0)
            .saturating_mul(100)
            .saturating_add(m),
        now: cx.now(),
        policy: &l.policy,
        typical_cost: typical,
        retries: cx.cfg.cas_max_retries,
        give_back: false,
    }
}

/// This Envoy's lease field prefix in Redis (`-` before it ever took a lease), for a reservation:
/// its own leases are not counted as held elsewhere.
pub fn owner(cx: &Cx) -> String {
    let leases = cx.cfg.quota.as_ref().is_some_and(|q| q.lease.is_some());
    let id = match cx.worker.leases.envoy {
        0 if leases => account::known_envoy_id(cx.store()).unwrap_or(0),
        id => id,
    };
    quota::lease_owner(id)
}

/// This Envoy's lease of the account of `tenant` (× `model`), if it has one for `month`.
pub fn account(cx: &Cx, tenant: &str, model: Option<&str>, month: &str) -> Option<Account> {
    let key = account::account_key(tenant, model);
    crate::store::peek::<Account>(cx.store(), &key)
        .ok()
        .and_then(|(a, _)| a)
        .filter(|a| a.month == account::month_code(month))
}

/// Redis refused a reservation of the account of `tenant` (× `model`), and what this Envoy's lease of
/// it holds unspent would cover the difference: gives that back — the callout to send, by the request
/// ([`Purpose::LeaseGiveBack`]) — so that the reservation, sent again once it answered
/// ([`given_back`]), finds it in Redis. `None` when there is nothing to give back or another give-back
/// of the account is in flight (the refusal stands).
pub fn give_back(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    tenant: &str,
    model: Option<&str>,
) -> Option<Callout> {
    let key = account::account_key(tenant, model);
    let sc = sync_ctx(cx, q, l, 0);
    let (plan, _) = account::begin_give_back(cx.store(), &key, &sc)?;
    let body = call_body(cx, q, l, tenant, model, &plan);
    Some(callout(cx, q, Purpose::LeaseGiveBack, body))
}

/// The give-back of [`give_back`] answered NOSCRIPT (Redis restarted since the script was loaded): the
/// callout that sends it again as `EVAL`, the account still given back (its flag set, nothing
/// spendable). `None` when the account is no longer being given back.
pub fn give_back_again(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    tenant: &str,
    model: Option<&str>,
) -> Option<Callout> {
    cx.worker.leases.loaded = false;
    let key = account::account_key(tenant, model);
    let sc = sync_ctx(cx, q, l, 0);
    let plan = crate::store::peek::<Account>(cx.store(), &key)
        .ok()
        .and_then(|(a, _)| a)
        .and_then(|a| account::give_back_plan(&a, &sc))?;
    let body = call_body(cx, q, l, tenant, model, &plan);
    Some(callout(cx, q, Purpose::LeaseGiveBack, body))
}

/// The give-back of [`give_back`] answered: applied to the account as any sync. True when Redis
/// took it.
pub fn given_back(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    tenant: &str,
    model: Option<&str>,
    reply: CalloutReply,
) -> bool {
    let p = LeaseCall {
        tenant: tenant.to_string(),
        model: model.map(str::to_string),
        key: account::account_key(tenant, model),
        typical: 0,
        probe: false,
    };
    apply_one(cx, q, l, &p, &reply, true)
}

/// A lease call answered (or its dispatch was refused).
pub fn on_reply(cx: &mut Cx, q: &QuotaSettings, l: &LeaseSettings, id: u64, reply: CalloutReply) {
    let Some(calls) = cx.worker.leases.pending.remove(&id) else {
        return;
    };
    if let [one] = calls.as_slice() {
        apply_one(cx, q, l, one, &reply, false);
        return;
    }
    let n = calls.len();
    match shim::read(&q.cluster, &reply, |s, b| {
        quota::parse_lease_batch_reply(s, b, n)
    }) {
        Ok(results) => {
            cx.worker.leases.batch_loaded = true;
            for (p, r) in calls.iter().zip(results) {
                let r = r.map_err(|e| shim::Failure {
                    why: format!("{e} (cluster '{}')", q.cluster),
                    error: e,
                });
                apply(cx, q, l, p, r.as_ref(), false);
            }
        }
        Err(f) => {
            // Nothing of the call is known to have run: every account is asked again at the next
            // tick (a sync reports totals, so one that did run counts nothing twice).
            if f.error == ShimError::NoScript {
                cx.worker.leases.batch_loaded = false;
            } else if is_crossslot(&f.error) {
                // A Redis Cluster: nothing ran. Each tenant's accounts go apart from now on.
                cx.worker.leases.per_tenant = true;
            } else {
                fail(cx, q, &f, calls.len());
            }
            let sc = sync_ctx(cx, q, l, 0);
            for p in &calls {
                account::finish_sync(cx.store(), &p.key, None, &sc);
                mark(cx, &p.tenant, p.model.as_deref(), p.typical);
            }
        }
    }
}

fn is_crossslot(e: &ShimError) -> bool {
    matches!(e, ShimError::RedisError(m) if m.starts_with("CROSSSLOT"))
}

/// A lease call failed (not `NOSCRIPT`): counted, the shim's breaker told when it was unreachable,
/// logged.
fn fail(cx: &mut Cx, q: &QuotaSettings, f: &shim::Failure, accounts: usize) {
    cx.inc(Metric::QuotaShimErrors);
    if f.error == ShimError::Unavailable {
        shim::record(cx, &q.cluster, &q.shim_breaker, false, false);
    }
    cx.log_failure(
        Level::Warn,
        "lease_sync",
        format!(
            "lease sync of {accounts} account(s) failed ({}); sent again later",
            f.why
        ),
    );
}

/// The answer of a call of the lease script alone (one account) applied: to the account, the shim's
/// breaker and the script cache flag. True when Redis answered it.
fn apply_one(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    p: &LeaseCall,
    reply: &CalloutReply,
    give_back: bool,
) -> bool {
    let parsed = shim::read(&q.cluster, reply, quota::parse_lease_reply);
    if p.probe {
        // The shim answered unless it was unreachable: that closes or re-opens its breaker.
        let up = !matches!(&parsed, Err(f) if f.error == ShimError::Unavailable);
        shim::record(cx, &q.cluster, &q.shim_breaker, up, true);
    }
    match &parsed {
        Ok(_) => cx.worker.leases.loaded = true,
        Err(f) if f.error == ShimError::NoScript => cx.worker.leases.loaded = false,
        Err(f) if f.error == ShimError::Unavailable && !p.probe => {
            shim::record(cx, &q.cluster, &q.shim_breaker, false, false);
        }
        Err(_) => {}
    }
    apply(cx, q, l, p, parsed.as_ref(), give_back)
}

/// One account's answer applied to its account; `give_back`: the call of [`give_back`]. A failure is
/// counted and logged (but `NOSCRIPT`) and the account asked again at the next tick. True when Redis
/// answered it.
fn apply(
    cx: &mut Cx,
    q: &QuotaSettings,
    l: &LeaseSettings,
    p: &LeaseCall,
    parsed: Result<&LeaseReply, &shim::Failure>,
    give_back: bool,
) -> bool {
    let sc = account::SyncCtx {
        give_back,
        ..sync_ctx(cx, q, l, p.typical)
    };
    match parsed {
        Ok(r) => {
            io_answered(cx, &p.key, r.tokens_io);
            let synced = Synced {
                held: r.held,
                reported_total: r.reported_total,
                version: r.version,
                remaining: r.remaining(),
                limit: r.binding_limit(),
            };
            account::finish_sync(cx.store(), &p.key, Some(synced), &sc);
            true
        }
        Err(shim::Failure { error: e, why }) => {
            if *e != ShimError::NoScript {
                cx.inc(Metric::QuotaShimErrors);
                cx.log_failure(
                    Level::Warn,
                    "lease_sync",
                    format!(
                        "lease sync for tenant {} failed ({why}); sent again later",
                        p.tenant
                    ),
                );
            }
            account::finish_sync(cx.store(), &p.key, None, &sc);
            // Asked again on the next tick.
            mark(cx, &p.tenant, p.model.as_deref(), p.typical);
            false
        }
    }
}
