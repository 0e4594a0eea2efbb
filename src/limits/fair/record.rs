//! The record of a fair limit in shared data: its fixed-width layout (see [`super`]), the accessors, and
//! the share computation (water-filling level by level) that runs inside the CAS.

use super::Tuning;
use crate::limits::bucket::{BucketParams, BucketState};
use crate::store::{read_f64, read_u64, Codec};

/// Most priority levels a record holds.
pub const LEVELS: usize = 8;

pub(super) const VERSION: u8 = 1;
pub(super) const HEADER: usize = 72 + 16 * LEVELS;
pub(super) const SLOT: usize = 64;
/// The hash of the overflow member (a real member's hash is never this, nor 0: 0 marks a free slot).
pub(super) const OVERFLOW: u64 = u64::MAX;
/// Water level of a level whose members all get what they ask (a share there is the member's demand plus
/// its weight's part of what the level leaves over).
pub(super) const UNBOUNDED: f64 = f64::MAX;

// Header offsets.
pub(super) const H_LEVELS: usize = 1;
pub(super) const H_MEMBERS: usize = 2;
pub(super) const H_ACTIVE: usize = 4;
pub(super) const H_TOKENS: usize = 8;
pub(super) const H_REQUESTS: usize = 16;
pub(super) const H_UPDATED: usize = 24;
pub(super) const H_COMPUTED: usize = 32;
pub(super) const H_REFF: usize = 40;
pub(super) const H_AVG_COST: usize = 48;
pub(super) const H_RESERVE: usize = 56;
pub(super) const H_PROTECTED: usize = 64;
pub(super) const H_LAMBDA: usize = 72;
pub(super) const H_CAP: usize = 72 + 8 * LEVELS;
// Member offsets.
pub(super) const M_HASH: usize = 0;
pub(super) const M_LAST: usize = 8;
pub(super) const M_CREDITED: usize = 16;
pub(super) const M_DEMAND: usize = 24;
pub(super) const M_CREDIT: usize = 32;
pub(super) const M_NORM: usize = 40;
pub(super) const M_WEIGHT: usize = 48;
pub(super) const M_LARGEST: usize = 52;
pub(super) const M_LEVEL: usize = 56;

/// A fair limit's record in shared data (fixed width for its member count; see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Record(Vec<u8>);

impl Codec for Record {
    fn encode(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn decode(b: &[u8]) -> Option<Self> {
        let r = Record(b.to_vec());
        let levels = usize::from(*b.get(H_LEVELS)?);
        let ok = b.first() == Some(&VERSION)
            && (1..=LEVELS).contains(&levels)
            && b.len() == Record::len_for(r.members())
            && read_f64(b, H_TOKENS).is_some()
            && read_f64(b, H_REQUESTS).is_some();
        ok.then_some(r)
    }
}

impl Record {
    pub(super) fn len_for(members: u16) -> usize {
        HEADER + SLOT * (usize::from(members) + 1)
    }

    /// A record with a bucket at `bucket`, no members and shares never computed.
    pub fn fresh(members: u16, levels: u8, bucket: &BucketState) -> Record {
        let mut r = Record(vec![0; Record::len_for(members)]);
        r.put(0, &[VERSION]);
        r.put(H_LEVELS, &[levels.clamp(1, LEVELS as u8)]);
        r.put(H_MEMBERS, &members.to_le_bytes());
        r.set_bucket(bucket);
        r
    }

    pub(super) fn put(&mut self, at: usize, bytes: &[u8]) {
        if let Some(d) = at
            .checked_add(bytes.len())
            .and_then(|end| self.0.get_mut(at..end))
        {
            d.copy_from_slice(bytes);
        }
    }
    pub(super) fn u64_at(&self, at: usize) -> u64 {
        read_u64(&self.0, at).unwrap_or(0)
    }
    pub(super) fn f64_at(&self, at: usize) -> f64 {
        read_f64(&self.0, at).unwrap_or(0.0)
    }
    pub(super) fn set_u64(&mut self, at: usize, v: u64) {
        self.put(at, &v.to_le_bytes());
    }
    pub(super) fn set_f64(&mut self, at: usize, v: f64) {
        self.put(at, &(if v.is_finite() { v } else { 0.0 }).to_le_bytes());
    }
    pub(super) fn u16_at(&self, at: usize) -> u16 {
        let b = [self.byte(at), self.byte(at + 1)];
        u16::from_le_bytes(b)
    }
    pub(super) fn byte(&self, at: usize) -> u8 {
        self.0.get(at).copied().unwrap_or(0)
    }

    /// Members with a slot of their own (K; the overflow member is slot K).
    pub fn members(&self) -> u16 {
        self.u16_at(H_MEMBERS)
    }
    /// Priority levels.
    pub fn levels(&self) -> u8 {
        self.byte(H_LEVELS)
    }
    /// Members active at the last share computation.
    pub fn active(&self) -> u16 {
        self.u16_at(H_ACTIVE)
    }
    /// The bucket as stored.
    pub fn bucket(&self) -> BucketState {
        BucketState {
            tokens: self.f64_at(H_TOKENS),
            requests: self.f64_at(H_REQUESTS),
            updated_ns: self.u64_at(H_UPDATED),
        }
    }
    pub(super) fn set_bucket(&mut self, b: &BucketState) {
        self.set_f64(H_TOKENS, b.tokens);
        self.set_f64(H_REQUESTS, b.requests);
        self.set_u64(H_UPDATED, b.updated_ns);
    }
    /// The effective rate of the last share computation, tokens/s.
    pub fn r_eff(&self) -> f64 {
        self.f64_at(H_REFF)
    }
    /// The balance the shares aim at, tokens.
    pub fn reserve(&self) -> f64 {
        self.f64_at(H_RESERVE)
    }
    /// Water level of `level` (tokens/s per unit of weight; `None`: every member there gets what it asks).
    pub fn lambda(&self, level: usize) -> Option<f64> {
        let l = self.f64_at(H_LAMBDA + 8 * level.min(LEVELS - 1));
        (l < UNBOUNDED).then_some(l)
    }
    /// The share of a member of `weight` at `level` asking `demand` tokens/s, tokens/s: `λ × weight` (at
    /// most what the level gets) where the level binds; where every member of the level gets what it
    /// asks, its demand plus its weight's part of what the level leaves over.
    pub fn share(&self, level: u8, weight: f64, demand: f64) -> f64 {
        let l = usize::from(level).min(usize::from(self.levels().max(1)) - 1);
        let lam = self.f64_at(H_LAMBDA + 8 * l);
        let cap = self.f64_at(H_CAP + 8 * l);
        if lam < UNBOUNDED {
            (lam * weight).min(cap).max(0.0)
        } else {
            (demand + cap * weight).max(0.0)
        }
    }

    /// Every member with a slot (the overflow member last, hash `u64::MAX`), as of `now`:
    /// `(hash, demand tokens/s, credit tokens, share tokens/s, active)`.
    pub fn table(&self, t: &Tuning, now: u64) -> Vec<(u64, f64, f64, f64, bool)> {
        (0..=usize::from(self.members()))
            .filter_map(|i| {
                let at = Record::slot(i);
                let hash = self.u64_at(at + M_HASH);
                if hash == 0 {
                    return None;
                }
                let last = self.u64_at(at + M_LAST);
                let d = self.demand(i, now, t.tau_s);
                let rate = self.share(self.byte(at + M_LEVEL), self.slot_weight(i), d);
                let active = now.saturating_sub(last) <= t.idle_ns;
                Some((hash, d, self.f64_at(at + M_CREDIT), rate, active))
            })
            .collect()
    }

    pub(super) fn slot(i: usize) -> usize {
        HEADER + SLOT * i
    }
    pub(super) fn slot_weight(&self, i: usize) -> f64 {
        let at = Record::slot(i) + M_WEIGHT;
        let b = [
            self.byte(at),
            self.byte(at + 1),
            self.byte(at + 2),
            self.byte(at + 3),
        ];
        let w = f64::from(f32::from_le_bytes(b));
        if w.is_finite() && w > 0.0 {
            w
        } else {
            1.0
        }
    }
    fn f32_at(&self, at: usize) -> f64 {
        let b = [
            self.byte(at),
            self.byte(at + 1),
            self.byte(at + 2),
            self.byte(at + 3),
        ];
        let x = f64::from(f32::from_le_bytes(b));
        if x.is_finite() {
            x
        } else {
            0.0
        }
    }

    /// Slot `i`'s largest recent request, tokens (it fades over ten windows: see [`Record::recompute`]).
    fn largest(&self, i: usize) -> f64 {
        self.f32_at(Record::slot(i) + M_LARGEST)
    }

    pub(super) fn set_slot(&mut self, i: usize, hash: u64, weight: f64, level: u8) {
        let at = Record::slot(i);
        self.set_u64(at + M_HASH, hash);
        self.put(at + M_WEIGHT, &(weight as f32).to_le_bytes());
        self.put(at + M_LEVEL, &[level]);
    }

    /// Counts an ask of `cost` in the average request cost, and recomputes the shares when they are
    /// older than `t.recompute_ns` (the bucket holding `tokens` now).
    pub(super) fn refresh(
        &mut self,
        p: &BucketParams,
        t: &Tuning,
        tokens: f64,
        cost: f64,
        now: u64,
    ) {
        let avg = self.f64_at(H_AVG_COST);
        self.set_f64(
            H_AVG_COST,
            if avg > 0.0 {
                avg + (cost - avg) / 16.0
            } else {
                cost
            },
        );
        let computed = self.u64_at(H_COMPUTED);
        if computed == 0 || now.saturating_sub(computed) >= t.recompute_ns {
            self.recompute(p, t, tokens, now);
        }
    }

    /// The slot of member `m` at `now`, its credit brought up to now: its own (found or claimed), or
    /// the overflow slot (then `true`). A newcomer may send one request of `cost` at once (when it has
    /// any share), not a bank: banks handed to every newcomer would be spent first come, first served.
    pub(super) fn enter(&mut self, m: &super::Member, t: &Tuning, cost: f64, now: u64) -> Entered {
        let (i, new, overflow) = self.find(m.hash, now, t.idle_ns);
        let (hash, weight, level) = if overflow {
            (OVERFLOW, t.default_weight, t.default_level)
        } else {
            (m.hash, m.weight, m.level)
        };
        let at = Record::slot(i);
        if new {
            self.put(at, &[0; SLOT]);
            self.set_slot(i, hash, weight, level);
            let rate = self.share(level, weight, 0.0);
            self.set_f64(at + M_CREDIT, rate.min(cost));
            self.set_u64(at + M_CREDITED, now);
            self.set_u64(at + M_LAST, now);
            return Entered {
                slot: i,
                overflow,
                rate,
                credit: rate.min(cost),
                decay: 1.0,
            };
        }
        self.set_slot(i, hash, weight, level);
        // One decay factor for the demand, its weight and (below) the ask.
        let k = decay(self.u64_at(at + M_LAST), now, t.tau_s);
        let rate = self.share(level, weight, self.demand_with(i, k));
        let credit = self.accrue_at(i, rate, t, now);
        Entered {
            slot: i,
            overflow,
            rate,
            credit,
            decay: k,
        }
    }

    /// Records the ask of `cost` at `now` of the slot `e` entered (admitted or not: demand counts
    /// asks), and its credit after the decision.
    pub(super) fn asked(&mut self, e: &Entered, t: &Tuning, cost: f64, credit: f64, now: u64) {
        let at = Record::slot(e.slot);
        let last = self.u64_at(at + M_LAST);
        let demand = self.f64_at(at + M_DEMAND) * e.decay + cost / t.tau_s;
        let norm = self.f64_at(at + M_NORM) * e.decay + (1.0 - e.decay);
        let largest = self.largest(e.slot).max(cost);
        self.put(at + M_LARGEST, &(largest as f32).to_le_bytes());
        self.set_u64(at + M_LAST, now.max(last));
        self.set_f64(at + M_DEMAND, demand);
        self.set_f64(at + M_NORM, norm);
        self.set_f64(at + M_CREDIT, credit);
    }

    /// Adds `amount` to member `hash`'s credit (between −`limit` and `limit`), if it still has a slot.
    pub(super) fn give(&mut self, hash: u64, amount: f64, limit: f64) {
        let k = usize::from(self.members());
        if let Some(i) = (0..k).find(|&i| self.u64_at(Record::slot(i) + M_HASH) == hash) {
            let at = Record::slot(i) + M_CREDIT;
            let c = self.f64_at(at);
            self.set_f64(at, (c + amount).clamp(-limit, limit));
        }
    }

    /// Finds the slot of `hash`, else claims a free one (never used, or silent for `idle_ns`: the
    /// longest silent first), else the overflow slot. `(slot, new, overflow)`.
    pub(super) fn find(&self, hash: u64, now: u64, idle_ns: u64) -> (usize, bool, bool) {
        let k = usize::from(self.members());
        let mut free: Option<(usize, u64)> = None;
        for i in 0..k {
            let at = Record::slot(i);
            let h = self.u64_at(at + M_HASH);
            if h == hash {
                return (i, false, false);
            }
            let last = self.u64_at(at + M_LAST);
            let idle = h == 0 || now.saturating_sub(last) > idle_ns;
            if idle && free.is_none_or(|(_, l)| last < l) {
                free = Some((i, last));
            }
        }
        match free {
            Some((i, _)) => (i, true, false),
            None => (k, self.u64_at(Record::slot(k) + M_HASH) != OVERFLOW, true),
        }
    }

    /// Slot `i`'s demand as of `now`, tokens/s: the exponential average of its asks, divided by the
    /// average's weight since the member was first seen (`norm` = 1 − e^(−age/τ)), so that a newcomer's
    /// demand is not taken for a fraction of it while the average fills (at most ten times the average).
    pub(super) fn demand(&self, i: usize, now: u64, tau_s: f64) -> f64 {
        let last = self.u64_at(Record::slot(i) + M_LAST);
        self.demand_with(i, decay(last, now, tau_s))
    }

    /// [`Record::demand`] with the decay factor since the slot's last ask already known.
    fn demand_with(&self, i: usize, k: f64) -> f64 {
        let at = Record::slot(i);
        let norm = self.f64_at(at + M_NORM) * k + (1.0 - k);
        self.f64_at(at + M_DEMAND) * k / norm.max(0.1)
    }

    /// Brings slot `i`'s credit up to `now` at the shares in force (at most its bank).
    pub(super) fn accrue(&mut self, i: usize, t: &Tuning, now: u64) {
        let at = Record::slot(i);
        let level = self.byte(at + M_LEVEL);
        let demand = self.demand(i, now, t.tau_s);
        let rate = self.share(level, self.slot_weight(i), demand);
        self.accrue_at(i, rate, t, now);
    }

    /// Brings slot `i`'s credit up to `now` at `rate` (at most `rate × bank_s`, or what it holds);
    /// returns it.
    fn accrue_at(&mut self, i: usize, rate: f64, t: &Tuning, now: u64) -> f64 {
        let at = Record::slot(i);
        let since = self.u64_at(at + M_CREDITED);
        let dt = now.saturating_sub(since) as f64 / 1e9;
        let credit = self.f64_at(at + M_CREDIT);
        let credit = (credit + rate * dt).min((rate * t.bank_s).max(credit));
        self.set_f64(at + M_CREDIT, credit);
        self.set_u64(at + M_CREDITED, now.max(since));
        credit
    }

    /// Recomputes the water levels at `now`, with the bucket holding `tokens`; every active member's
    /// credit is first brought up to `now` at the old shares, so that each share counts exactly while in
    /// force.
    pub(super) fn recompute(&mut self, p: &BucketParams, t: &Tuning, tokens: f64, now: u64) {
        // Every active member: (level, demand / weight, demand, weight). The reserve covers the
        // largest recent request of each member under its share at the last computation (it must find
        // the bucket holding it), and four average requests (newcomers).
        let levels = usize::from(self.levels().clamp(1, LEVELS as u8));
        let mut active: Vec<(u8, f64, f64, f64)> = Vec::new();
        let mut protected = 0.0;
        let fade = decay(self.u64_at(H_COMPUTED), now, 20.0 * t.tau_s);
        for i in 0..=usize::from(self.members()) {
            let at = Record::slot(i);
            let last = self.u64_at(at + M_LAST);
            if self.u64_at(at + M_HASH) == 0 {
                continue;
            }
            let d = self.demand(i, now, t.tau_s);
            let w = self.slot_weight(i);
            let level = self.byte(at + M_LEVEL).min(levels as u8 - 1);
            // Members silent for a while keep their claim until their slot is taken (their largest
            // request fades over ten windows).
            let largest = self.largest(i) * fade;
            self.put(at + M_LARGEST, &(largest as f32).to_le_bytes());
            if self
                .lambda(usize::from(level))
                .is_none_or(|lam| d <= lam * w)
            {
                protected += largest;
            }
            if now.saturating_sub(last) > t.idle_ns {
                continue;
            }
            self.accrue(i, t, now);
            active.push((level, d / w, d, w));
        }
        let reserve = t.reserve(p, self.f64_at(H_AVG_COST), protected);
        let r_eff = (p.tokens_per_second + (tokens - reserve) / t.steer_s)
            .clamp(0.0, p.tokens_per_second + p.burst / t.steer_s);
        active.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let mut avail = r_eff;
        let mut rest = active.as_slice();
        for level in 0..levels {
            let n = rest
                .iter()
                .take_while(|e| usize::from(e.0) == level)
                .count();
            let (here, later) = rest.split_at(n.min(rest.len()));
            rest = later;
            let mut wsum: f64 = here.iter().map(|e| e.3).sum();
            let mut left = avail;
            let mut lam = UNBOUNDED;
            for &(_, ratio, d, w) in here {
                if wsum > 0.0 && ratio * wsum <= left {
                    left -= d;
                    wsum -= w;
                } else {
                    lam = if wsum > 0.0 { left / wsum } else { 0.0 };
                    break;
                }
            }
            self.set_f64(H_LAMBDA + 8 * level, lam);
            if lam < UNBOUNDED {
                self.set_f64(H_CAP + 8 * level, avail);
                avail = 0.0;
            } else {
                // What the level leaves over, per unit of its weight (lower levels get it too: a share
                // is a cap, the bucket decides the total).
                let weights: f64 = here.iter().map(|e| e.3).sum();
                let over = left.max(0.0);
                self.set_f64(
                    H_CAP + 8 * level,
                    if weights > 0.0 { over / weights } else { over },
                );
                avail = over;
            }
        }
        self.set_u64(H_COMPUTED, now);
        self.set_f64(H_REFF, r_eff);
        self.set_f64(H_RESERVE, reserve);
        self.set_f64(H_PROTECTED, protected);
        self.put(
            H_ACTIVE,
            &u16::try_from(active.len())
                .unwrap_or(u16::MAX)
                .to_le_bytes(),
        );
    }
}

/// What [`Record::enter`] found: the slot, whether it is the overflow one, the member's share
/// (tokens/s) and credit (tokens) now, and the decay factor of its demand since its last ask.
pub(super) struct Entered {
    pub slot: usize,
    pub overflow: bool,
    pub rate: f64,
    pub credit: f64,
    pub decay: f64,
}

/// The decay factor from `since` to `now` with time constant `tau_s` (1 when the clock went back).
pub(super) fn decay(since: u64, now: u64, tau_s: f64) -> f64 {
    let dt = now.saturating_sub(since) as f64 / 1e9;
    if dt <= 0.0 {
        1.0
    } else {
        (-dt / tau_s).exp()
    }
}
