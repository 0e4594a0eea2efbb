//! Monthly token quotas kept in Redis behind Webdis: calendar months, key names, the two Lua scripts,
//! the Webdis request encoding and the reply parsing. Pure: no `proxy_wasm`, time comes in as a parameter.
//!
//! # Why
//! Token buckets live in Envoy's shared data (one process); a monthly quota must hold across every Envoy,
//! so it lives in Redis. One request costs one callout: a single Lua script checks and charges all keys
//! atomically (all or nothing), and a second script settles the difference once the provider reports
//! the real usage.
//!
//! # Months
//! A month is the calendar month in UTC or in a fixed offset (minutes, ±14 h): [`month_of`],
//! [`month_label`] (`"2026-11"`), [`month_end_unix`] (first instant of the next month) and
//! [`seconds_to_reset`]. Counters expire at a *fixed* instant (`EXPIREAT month_end + grace`), so repeated
//! calls never push the expiry forward.
//!
//! # Keys (one Redis Cluster slot per tenant thanks to the `{tenant}` hash tag)
//! ```text
//! tg:q:{acme}:2026-11                  tenant used this month
//! tg:q:{acme}:2026-11:m:gpt-4.1        tenant x model used this month
//! tg:q:{acme}:limit                    optional operator override of the tenant limit (integer)
//! tg:q:{acme}:limit:m:gpt-4.1          optional operator override of the tenant x model limit
//! tg:q:{acme}:idem:<idempotency-key>   client idempotency: the first admitted request's decision,
//!                                      bound to its body fingerprint (EX window; see RESERVE_SCRIPT)
//! tg:q:{acme}:settled:<request-id>     settlement done (EX ttl)
//! tg:q:{acme}:none                     placeholder key when no model is tracked (never read or written)
//! ```
//! Tenant, model and keys are sanitized by [`sanitize`]: `[A-Za-z0-9._:-]` kept, other bytes as `%XX`,
//! long values cut and suffixed with `~` and a 64-bit FNV-1a hash of the whole raw value.
//!
//! # Webdis request
//! `POST /` with the command path as the body (no content-type needed), every segment percent-encoded
//! with only `[A-Za-z0-9_-]` left as is, so `/`, `+`, `%`, space and `.` never reach Webdis raw (a last
//! segment ending in `.json`/`.raw` would otherwise be taken as a format suffix; the last argument is
//! also always the protocol tag `tg1`):
//! ```text
//! EVALSHA/<sha1>/6/tg%3Aq%3A%7Bacme%7D%3A2026-11/…/120/1024/1000000/0/1798761600/0/req-1/0/0/1/<fp>/3/tg1
//! ```
//! The host should send [`ScriptCall::EvalSha`] (≈ 300 bytes) and, when the reply parses as
//! [`ShimError::NoScript`] (Redis restarted or `SCRIPT FLUSH`), resend the same arguments with
//! [`ScriptCall::Eval`] (≈ 3.9 KiB, which also loads the script into Redis' cache for the next calls).
//! Callout headers: `:method POST`, `:path /`, `:authority webdis`; no content-type needed. Do not send
//! `connection: close`: Webdis 0.1.9 then never answers a request whose body arrives in a later read
//! than its headers (measured; keep-alive requests, which Envoy sends, are fine).
//!
//! # Replies
//! Webdis answers `{"EVAL": <value>}` / `{"EVALSHA": <value>}`; the scripts return flat arrays of
//! integers (Webdis turns nested tables into `null`). See [`parse_reserve_reply`] and
//! [`parse_settle_reply`]; failures are classified by [`ShimError`] so the host can apply its failure mode
//! and feed its circuit breaker.
//!
//! # Example
//! ```
//! # use tokengate::quota::*;
//! let now = 1_795_000_000; // 2026-11-18T…Z
//! let args = ReserveArgs {
//!     tenant: "acme".into(), model: Some("gpt-4.1".into()), month: month_label(now, 0),
//!     idempotency_key: None, body_fingerprint: body_fingerprint(b"{}"), request_id: "req-1".into(),
//!     prompt_cost: 120, output_cost: 1024, default_limit: 1_000_000, default_model_limit: 0,
//!     expire_at_unix: month_end_unix(now, 0) + 7 * 86_400, idem_window_s: 0,
//!     clamp_output: false, min_output_cost: 0,
//! };
//! let body = reserve_request(&args, ScriptCall::EvalSha);
//! assert!(body.starts_with("EVALSHA/"));
//! let reply = parse_reserve_reply(200, br#"{"EVALSHA":[1,1144,1000000,1144,-1,0,1024,0]}"#).unwrap();
//! assert!(reply.allowed && reply.model_limit.is_none());
//! ```

use crate::store::{read_u64, Codec};

// ---------------------------------------------------------------------------------------------------
// Calendar months
// ---------------------------------------------------------------------------------------------------

/// Largest accepted `now`: 9999-12-31T23:59:59Z. Inputs are clamped to `[0, MAX_UNIX_S]` so the
/// arithmetic below can never overflow.
pub const MAX_UNIX_S: i64 = 253_402_300_799;
/// Largest accepted offset magnitude in minutes (±14 h, the widest real-world offset).
pub const MAX_OFFSET_MIN: i32 = 14 * 60;

fn local_seconds(now_unix_s: i64, offset_min: i32) -> i64 {
    let off = i64::from(offset_min.clamp(-MAX_OFFSET_MIN, MAX_OFFSET_MIN)) * 60;
    now_unix_s.clamp(0, MAX_UNIX_S) + off
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31). Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (y, m as u32, d as u32)
}

/// (year, month 1..=12, day) → days since 1970-01-01. Howard Hinnant's `days_from_civil`.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let (m, d) = (i64::from(m), i64::from(d));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The calendar month `(year, month 1..=12)` containing `now_unix_s` in the fixed offset `offset_min`
/// (minutes east of UTC, clamped to ±14 h; `now` clamped to 1970..=9999).
pub fn month_of(now_unix_s: i64, offset_min: i32) -> (i32, u32) {
    let (y, m, _) = civil_from_days(local_seconds(now_unix_s, offset_min).div_euclid(86_400));
    (i32::try_from(y).unwrap_or(i32::MAX), m)
}

/// The month as used in key names: `"2026-11"`.
pub fn month_label(now_unix_s: i64, offset_min: i32) -> String {
    let (y, m) = month_of(now_unix_s, offset_min);
    format!("{y:04}-{m:02}")
}

/// The first instant of the next month in that offset, as unix seconds (when the quota resets).
pub fn month_end_unix(now_unix_s: i64, offset_min: i32) -> i64 {
    let off = i64::from(offset_min.clamp(-MAX_OFFSET_MIN, MAX_OFFSET_MIN)) * 60;
    let (y, m) = month_of(now_unix_s, offset_min);
    let (ny, nm) = if m >= 12 {
        (i64::from(y) + 1, 1)
    } else {
        (i64::from(y), m + 1)
    };
    days_from_civil(ny, nm, 1) * 86_400 - off
}

/// Seconds from `now` until the quota resets (always ≥ 1).
pub fn seconds_to_reset(now_unix_s: i64, offset_min: i32) -> u64 {
    let left = month_end_unix(now_unix_s, offset_min) - now_unix_s.clamp(0, MAX_UNIX_S);
    u64::try_from(left).unwrap_or(0).max(1)
}

// ---------------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------------

/// Longest sanitized tenant/model/key part; longer values are cut and suffixed with `~<16 hex>`.
pub const MAX_PART_LEN: usize = 128;

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn hex_digit(n: u8) -> char {
    char::from(HEX.get(usize::from(n & 0x0f)).copied().unwrap_or(b'0'))
}

/// [`sanitize`] without a copy when `raw` is already safe and short enough (the usual model name).
pub fn sanitized(raw: &str) -> std::borrow::Cow<'_, str> {
    if !raw.is_empty() && raw.len() <= MAX_PART_LEN && raw.bytes().all(is_key_safe) {
        std::borrow::Cow::Borrowed(raw)
    } else {
        std::borrow::Cow::Owned(sanitize(raw))
    }
}

/// Makes `raw` safe inside a key: `[A-Za-z0-9._:-]` kept, any other byte as `%XX` (so `{`, `}` and `%`
/// can never appear raw and the hash tag stays the tenant). The result is at most [`MAX_PART_LEN`]
/// bytes: a longer one keeps its first bytes and ends with `~` plus the FNV-1a-64 of the whole raw value
/// (`~` never appears otherwise, so cut values cannot collide with short ones). Empty → `~`.
pub fn sanitize(raw: &str) -> String {
    if raw.is_empty() {
        return "~".to_string();
    }
    let full = encode_key_part(raw, usize::MAX);
    if full.len() <= MAX_PART_LEN {
        return full;
    }
    let mut short = encode_key_part(raw, MAX_PART_LEN - 17);
    short.push('~');
    short.push_str(&format!(
        "{:016x}",
        crate::hash::fnv1a(crate::hash::FNV_OFFSET, raw.as_bytes())
    ));
    short
}

/// Encodes `raw` for a key, stopping before the output would exceed `max` bytes (never splitting `%XX`).
fn encode_key_part(raw: &str, max: usize) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_PART_LEN));
    for b in raw.bytes() {
        let safe = is_key_safe(b);
        if out.len().saturating_add(if safe { 1 } else { 3 }) > max {
            break;
        }
        if safe {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b));
        }
    }
    out
}

fn is_key_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

/// `tg:q:{<tenant>}` — the prefix (with hash tag) every key of one tenant shares.
pub fn tenant_prefix(tenant: &str) -> String {
    format!("tg:q:{{{}}}", sanitize(tenant))
}

/// The Redis keys one request touches. Built once per request (at reservation time) and reused for the
/// settlement, so a request reserved on the last second of a month settles into that same month.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKeys {
    /// `tg:q:{t}:<month>` — tenant used this month.
    pub used_total: String,
    /// `tg:q:{t}:<month>:m:<model>`, or the `tg:q:{t}:none` placeholder when no model is tracked.
    pub used_model: String,
    /// `tg:q:{t}:limit` — optional operator override of the tenant limit.
    pub limit_override: String,
    /// `tg:q:{t}:limit:m:<model>`, or the placeholder.
    pub limit_model_override: String,
    /// `tg:q:{t}:idem:<key>`, or the placeholder when the request has no idempotency key.
    pub idem: String,
    /// `tg:q:{t}:settled:<request-id>` — settlement done marker.
    pub settled: String,
    /// `tg:q:{t}:req:<request-id>` — what this request reserved (`<cost>`), or `C` once reconciled:
    /// a reservation that reaches Redis after that does nothing.
    pub request: String,
    /// The sanitized request id (as stored in an idempotency record this request wrote).
    pub request_id: String,
    /// True when a model is tracked (the model keys are real).
    pub has_model: bool,
    /// True when the request carries an idempotency key (`idem` is real, not the placeholder).
    pub has_idem: bool,
}

impl QuotaKeys {
    /// Keys for `tenant` (and `model` when given) in month `month` (a [`month_label`]).
    pub fn new(
        tenant: &str,
        model: Option<&str>,
        month: &str,
        idempotency_key: Option<&str>,
        request_id: &str,
    ) -> Self {
        let p = tenant_prefix(tenant);
        let month = sanitize(month);
        let none = format!("{p}:none");
        let (used_model, limit_model_override) = match model {
            Some(m) => {
                let m = sanitize(m);
                (format!("{p}:{month}:m:{m}"), format!("{p}:limit:m:{m}"))
            }
            None => (none.clone(), none.clone()),
        };
        let rid = sanitize(request_id);
        Self {
            used_total: format!("{p}:{month}"),
            used_model,
            limit_override: format!("{p}:limit"),
            limit_model_override,
            idem: idempotency_key
                .map(|k| format!("{p}:idem:{}", sanitize(k)))
                .unwrap_or_else(|| none.clone()),
            settled: format!("{p}:settled:{rid}"),
            request: format!("{p}:req:{rid}"),
            request_id: rid,
            has_model: model.is_some(),
            has_idem: idempotency_key.is_some(),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Scripts
// ---------------------------------------------------------------------------------------------------

/// Protocol tag passed as the last argument of every script; a script receiving anything else refuses to
/// run (host and script out of sync). It also guarantees the last path segment never ends in `.json`.
/// The tag sits at a fixed position per script (and the batch script checks its key/argument counts),
/// so a call laid out for another version of a script is refused too, not misread.
pub const PROTOCOL_TAG: &str = "tg1";

/// Free repeats per idempotency key: after the first admitted request, at most this many later
/// requests with the same key *and the same body* are admitted without a charge (as duplicates of the
/// first) within `idempotency_window_s`; any further repeat is reserved and settled like a new request.
///
/// Why 3: the OpenAI and Anthropic SDKs (generated by Stainless) resend a failed or timed-out request
/// with the same `Idempotency-Key` up to `max_retries` = 2 times by default; 3 covers those plus one
/// retry by the application itself. Each free repeat is upstream work nobody is charged for, so the
/// bound is what a client can get for free per charged request (at most 3 × its cost, and only by
/// resending the byte-identical body); a retry after a failed (fully refunded) original is charged
/// anyway (see [`SETTLE_SCRIPT`]).
pub const IDEMPOTENT_FREE_REPEATS: u64 = 3;

/// The reservation script (all or nothing).
///
/// KEYS: `used_total, used_model, limit_override, limit_model_override, idem, request`.
/// ARGV: `prompt_cost, output_cost, default_limit, default_model_limit (0 = none), expire_at_unix,
/// idem_window_s (0 = none), request_id, clamp (1/0), min_output_cost, has_model (1/0),
/// body_fingerprint ([A-Za-z0-9]+), max_free_repeats, "tg1"`.
/// Reply: `[allowed, used_after, limit, model_used_after, model_limit (-1 = none), duplicate,
/// granted_output, reason]` with reason 0 admitted, 1 tenant limit, 2 model limit, 3 admitted clamped.
///
/// Idempotency (window > 0): the first admitted request with a key stores
/// `2 <body fingerprint> <free repeats served> <request id> <its reply, comma-separated>` at `idem`
/// (`EX window`, never extended). A later request with the same key is a duplicate (the stored reply
/// with `duplicate` = 1, nothing charged, the counter of free repeats + 1) only when its fingerprint is
/// the stored one and fewer than `max_free_repeats` were served; otherwise it is reserved like any
/// request and the record is left as it is (the first request keeps it). A record in another format
/// (e.g. written by an older version) is left alone and never makes a request a duplicate.
pub const RESERVE_SCRIPT: &str = r#"-- tokengate reserve v2
if ARGV[13] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local p, o = tonumber(ARGV[1]), tonumber(ARGV[2])
local dl, dml = tonumber(ARGV[3]), tonumber(ARGV[4])
local win, mino = tonumber(ARGV[6]), tonumber(ARGV[9])
local clamp, hasm = ARGV[8] == '1', ARGV[10] == '1'
local fp, maxrep = ARGV[11], tonumber(ARGV[12])
if not (p and o and dl and dml and win and mino and maxrep) or not string.match(fp, '^%w+$') then
  return redis.error_reply('ERR tokengate: bad argument')
end
if redis.call('GET', KEYS[6]) == 'C' then return redis.error_reply('ERR tokengate: request already reconciled') end
local function num(k, dflt)
  local v = redis.call('GET', k)
  if not v then return dflt end
  local n = tonumber(v)
  if not n or n < 0 or n ~= math.floor(n) then return nil end
  return n
end
local owned = false
if win > 0 then
  local prev = redis.call('GET', KEYS[5])
  if prev then
    owned = true
    local pf, pn, pr, pd = string.match(prev, '^2 (%w+) (%d+) (%S+) ([-,%d]+)$')
    if pf == fp and tonumber(pn) < maxrep then
      local r = {}
      for v in string.gmatch(pd, '%-?%d+') do r[#r + 1] = tonumber(v) end
      if #r == 8 then
        local ttl = redis.call('PTTL', KEYS[5])
        if ttl < 1 then ttl = win * 1000 end
        redis.call('SET', KEYS[5], string.format('2 %s %d %s %s', pf, tonumber(pn) + 1, pr, pd), 'PX', ttl)
        r[6] = 1
        -- The first decision, with today's usage (the headers must not show a stale remaining).
        r[2] = tonumber(redis.call('GET', KEYS[1]) or '0') or r[2]
        if hasm then r[4] = tonumber(redis.call('GET', KEYS[2]) or '0') or r[4] end
        return r
      end
    end
  end
end
local lim = num(KEYS[3], dl)
local used = num(KEYS[1], 0)
if not lim or not used then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[1] .. ' or ' .. KEYS[3]) end
local mlim, mused = -1, 0
if hasm then
  if dml > 0 then mlim = dml end
  mlim = num(KEYS[4], mlim)
  mused = num(KEYS[2], 0)
  if not mlim or not mused then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[2] .. ' or ' .. KEYS[4]) end
end
local avail, why = lim - used, 1
if mlim >= 0 and mlim - mused < avail then avail, why = mlim - mused, 2 end
local grant, reason = o, 0
if p + o > avail then
  if clamp and avail - p >= mino and avail - p > 0 then
    grant, reason = avail - p, 3
  else
    return {0, used, lim, mused, mlim, 0, 0, why}
  end
end
local cost = string.format('%d', p + grant)
local ua = redis.call('INCRBY', KEYS[1], cost)
redis.call('EXPIREAT', KEYS[1], ARGV[5])
local ma = 0
if hasm then
  ma = redis.call('INCRBY', KEYS[2], cost)
  redis.call('EXPIREAT', KEYS[2], ARGV[5])
end
redis.call('SET', KEYS[6], cost, 'EX', 172800)
local r = {1, ua, lim, ma, mlim, 0, grant, reason}
if win > 0 and not owned then
  local f = string.format('2 %s 0 %s %d,%d,%d,%d,%d,0,%d,%d', fp, ARGV[7], 1, ua, lim, ma, mlim, grant, reason)
  redis.call('SET', KEYS[5], f, 'EX', ARGV[6])
end
return r
"#;

/// SHA-1 of [`RESERVE_SCRIPT`] (what `SCRIPT LOAD` returns; checked against a real Redis in the tests).
pub const RESERVE_SHA1: &str = "c58b7253819975f3abedd063a0f5ac55471232b8";

/// The settlement script (once per request id).
///
/// KEYS: `used_total, used_model, settled_marker, idem`.
/// ARGV: `delta (signed: actual − reserved), expire_at_unix, marker_ttl_s, has_model (1/0),
/// release ("-" or the request id), "tg1"`.
/// Reply: `[applied (0 = already settled), used_after, model_used_after]`; counters never go below 0.
///
/// `release` is the request id when this settlement refunds the whole reservation (the provider did
/// not serve it) and the request had an idempotency key: the record at `idem` is then deleted if that
/// request wrote it, so a retry with the same key is charged like a new request instead of riding
/// free on a request that cost nothing.
pub const SETTLE_SCRIPT: &str = r#"-- tokengate settle v2
if ARGV[6] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local d, ttl, hasm = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4] == '1'
if not d or not ttl or ttl < 1 then return redis.error_reply('ERR tokengate: bad argument') end
local u, m = tonumber(redis.call('GET', KEYS[1]) or '0'), 0
if hasm then m = tonumber(redis.call('GET', KEYS[2]) or '0') end
if not u or not m then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[1] .. ' or ' .. KEYS[2]) end
if redis.call('EXISTS', KEYS[3]) == 1 then return {0, u, m} end
local function apply(k, v)
  local n = v + d
  if n < 0 then n = 0 end
  if n ~= v then redis.call('SET', k, string.format('%d', n)) end
  redis.call('EXPIREAT', k, ARGV[2])
  return n
end
if ARGV[5] ~= '-' and redis.call('TYPE', KEYS[4]).ok == 'string' then
  local reps, rid = string.match(redis.call('GET', KEYS[4]), '^2 %w+ (%d+) (%S+) ')
  if rid == ARGV[5] then
    redis.call('DEL', KEYS[4])
    -- Repeats served free while this request ran are not duplicates of a charge any more: each is
    -- charged what this request had reserved (the refund, -d).
    local n = tonumber(reps) or 0
    if n > 0 and d < 0 then d = d - d * n end
  end
end
u = apply(KEYS[1], u)
if hasm then m = apply(KEYS[2], m) end
redis.call('SET', KEYS[3], '1', 'EX', ARGV[3])
return {1, u, m}
"#;

/// SHA-1 of [`SETTLE_SCRIPT`] (checked against a real Redis in the tests).
pub const SETTLE_SHA1: &str = "34278f8aedf5b221a2a88fbd47c57ff11bc6e792";

/// The reconciliation script, for a request whose reservation outcome is unknown (the callout timed out
/// or answered garbage): charges `actual` minus whatever this request had reserved (0 if the
/// reservation never arrived) and leaves a tombstone so a reservation arriving later does nothing.
///
/// KEYS: `used_total, used_model, request, settled_marker, idem`. ARGV: `actual, expire_at_unix, ttl_s,
/// has_model (1/0), release ("-" or the request id, as in [`SETTLE_SCRIPT`]: sent when `actual` is 0),
/// "tg1"`. Reply: `[applied, used_after, model_used_after]` (as settlement).
pub const RECONCILE_SCRIPT: &str = r#"-- tokengate reconcile v2
if ARGV[6] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local a, ttl, hasm = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4] == '1'
if not a or a < 0 or not ttl or ttl < 1 then return redis.error_reply('ERR tokengate: bad argument') end
local u, m = tonumber(redis.call('GET', KEYS[1]) or '0'), 0
if hasm then m = tonumber(redis.call('GET', KEYS[2]) or '0') end
if not u or not m then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[1] .. ' or ' .. KEYS[2]) end
if redis.call('EXISTS', KEYS[4]) == 1 then return {0, u, m} end
local rec = redis.call('GET', KEYS[3])
local r = 0
if rec and rec ~= 'C' then r = tonumber(rec) or 0 end
local d = a - r
local function apply(k, v)
  local n = v + d
  if n < 0 then n = 0 end
  if n ~= v then redis.call('SET', k, string.format('%d', n)) end
  redis.call('EXPIREAT', k, ARGV[2])
  return n
end
if ARGV[5] ~= '-' and redis.call('TYPE', KEYS[5]).ok == 'string' then
  local reps, rid = string.match(redis.call('GET', KEYS[5]), '^2 %w+ (%d+) (%S+) ')
  if rid == ARGV[5] then
    redis.call('DEL', KEYS[5])
    -- Free repeats of a request that charged nothing: each is charged this request's reservation.
    local n = tonumber(reps) or 0
    if n > 0 then d = d + n * r end
  end
end
if d ~= 0 then
  u = apply(KEYS[1], u)
  if hasm then m = apply(KEYS[2], m) end
end
redis.call('SET', KEYS[3], 'C', 'EX', ARGV[3])
redis.call('SET', KEYS[4], '1', 'EX', ARGV[3])
return {1, u, m}
"#;

/// SHA-1 of [`RECONCILE_SCRIPT`].
pub const RECONCILE_SHA1: &str = "70db30e5eae05f70de28a993586dfe76e0418fe7";

/// Several settlements of ONE tenant in one call (their keys share the tenant's hash tag, so the batch
/// stays on one Redis Cluster slot). Same rules as [`SETTLE_SCRIPT`] per entry.
///
/// KEYS: `used_total, used_model, settled_marker, idem` per entry. ARGV: `delta, expire_at_unix, ttl_s,
/// has_model (1/0), release ("-" or the request id)` per entry, then `"tg1"`. Reply: one integer per
/// entry: 1 applied, 0 already settled, −1 a counter in Redis is not a number (that entry is skipped).
pub const SETTLE_BATCH_SCRIPT: &str = r#"-- tokengate settle batch v2
local n = (#ARGV - 1) / 5
if ARGV[#ARGV] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
if n < 1 or n ~= math.floor(n) or #KEYS ~= 4 * n then return redis.error_reply('ERR tokengate: bad argument') end
local out = {}
for i = 0, n - 1 do
  local ku, km, ks, ki = KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4]
  local d, exp, ttl, hasm, rel = tonumber(ARGV[5 * i + 1]), ARGV[5 * i + 2], tonumber(ARGV[5 * i + 3]), ARGV[5 * i + 4] == '1', ARGV[5 * i + 5]
  local u, m = tonumber(redis.call('GET', ku) or '0'), 0
  if hasm then m = tonumber(redis.call('GET', km) or '0') end
  if not d or not ttl or ttl < 1 or not u or not m then
    out[#out + 1] = -1
  elseif redis.call('EXISTS', ks) == 1 then
    out[#out + 1] = 0
  else
    local function apply(k, v)
      local x = v + d
      if x < 0 then x = 0 end
      if x ~= v then redis.call('SET', k, string.format('%d', x)) end
      redis.call('EXPIREAT', k, exp)
    end
    if rel ~= '-' and redis.call('TYPE', ki).ok == 'string' then
      local reps, rid = string.match(redis.call('GET', ki), '^2 %w+ (%d+) (%S+) ')
      if rid == rel then
        redis.call('DEL', ki)
        local nr = tonumber(reps) or 0
        if nr > 0 and d < 0 then d = d - d * nr end
      end
    end
    apply(ku, u)
    if hasm then apply(km, m) end
    redis.call('SET', ks, '1', 'EX', ttl)
    out[#out + 1] = 1
  end
end
return out
"#;

/// SHA-1 of [`SETTLE_BATCH_SCRIPT`] (checked against a real Redis in the tests).
pub const SETTLE_BATCH_SHA1: &str = "f9e36c33b8a7c589e1dedfe85ba6d32940ba12a4";

/// How the host names the script to Webdis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptCall {
    /// `EVAL/<script>/…`: always works, ≈ 3 KiB body; also (re)loads the script into Redis' cache.
    Eval,
    /// `EVALSHA/<sha1>/…`: ≈ 300 bytes; fails with [`ShimError::NoScript`] when Redis lost its cache.
    EvalSha,
}

/// The Webdis path the host posts to; the command goes in the body.
pub const WEBDIS_PATH: &str = "/";

/// Largest integer sent to or expected from Lua (its numbers are doubles: exact up to 2^53).
pub const MAX_LUA_INT: u64 = (1 << 53) - 1;

/// Percent-encodes one path segment for Webdis: only `[A-Za-z0-9_-]` stay raw.
pub fn webdis_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len() * 3);
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b));
        }
    }
    out
}

pub(crate) fn command_body(
    call: ScriptCall,
    script: &str,
    sha: &str,
    keys: &[&str],
    args: &[String],
) -> String {
    let mut body = String::with_capacity(script.len() * 2 + 256);
    match call {
        ScriptCall::Eval => {
            body.push_str("EVAL/");
            body.push_str(&webdis_encode(script));
        }
        ScriptCall::EvalSha => {
            body.push_str("EVALSHA/");
            body.push_str(sha);
        }
    }
    body.push('/');
    body.push_str(&keys.len().to_string());
    for k in keys {
        body.push('/');
        body.push_str(&webdis_encode(k));
    }
    for a in args {
        body.push('/');
        body.push_str(&webdis_encode(a));
    }
    body
}

fn lua_int(v: u64) -> String {
    v.min(MAX_LUA_INT).to_string()
}

/// Everything one reservation needs. Costs are weighted tokens (see [`weighted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveArgs {
    /// Tenant id (sanitized into the keys).
    pub tenant: String,
    /// Model to meter per tenant x model; `None` = only the tenant total.
    pub model: Option<String>,
    /// Month label from [`month_label`] at reservation time.
    pub month: String,
    /// Client idempotency key (e.g. `Idempotency-Key` header); used only when `idem_window_s > 0`.
    pub idempotency_key: Option<String>,
    /// [`body_fingerprint`] of the request body as the client sent it: a repeat of an idempotency key
    /// is a duplicate only with the same fingerprint.
    pub body_fingerprint: u64,
    /// Request id (stored with the idempotent decision, and names the settlement marker).
    pub request_id: String,
    /// Weighted cost of the prompt.
    pub prompt_cost: u64,
    /// Weighted cost of the reserved output (max tokens).
    pub output_cost: u64,
    /// Tenant limit per month when no `tg:q:{t}:limit` override exists.
    pub default_limit: u64,
    /// Tenant x model limit when no override exists; 0 = no model limit.
    pub default_model_limit: u64,
    /// Fixed expiry of the counters: [`month_end_unix`] plus a grace period for late settlements.
    pub expire_at_unix: i64,
    /// How long an idempotency key remembers its admitted decision; 0 = idempotency off.
    pub idem_window_s: u64,
    /// When the prompt fits but prompt + output does not, reserve what is left for the output.
    pub clamp_output: bool,
    /// Smallest output cost worth admitting when clamping (below it the request is rejected).
    pub min_output_cost: u64,
}

impl ReserveArgs {
    /// The keys this reservation touches (reuse them for the settlement).
    pub fn keys(&self) -> QuotaKeys {
        QuotaKeys::new(
            &self.tenant,
            self.model.as_deref(),
            &self.month,
            self.idempotency_key
                .as_deref()
                .filter(|_| self.idem_window_s > 0),
            &self.request_id,
        )
    }
}

/// The Webdis body (`POST /`) that runs the reservation script.
pub fn reserve_request(args: &ReserveArgs, call: ScriptCall) -> String {
    let k = args.keys();
    let keys = [
        k.used_total.as_str(),
        k.used_model.as_str(),
        k.limit_override.as_str(),
        k.limit_model_override.as_str(),
        k.idem.as_str(),
        k.request.as_str(),
    ];
    let argv = [
        lua_int(args.prompt_cost),
        lua_int(args.output_cost),
        lua_int(args.default_limit),
        lua_int(args.default_model_limit),
        args.expire_at_unix.clamp(0, MAX_UNIX_S).to_string(),
        // Without a client key there is nothing to deduplicate: window 0 turns the idempotency step off
        // (the placeholder key must never be read or written as one).
        lua_int(if args.idempotency_key.is_some() {
            args.idem_window_s
        } else {
            0
        }),
        sanitize(&args.request_id),
        if args.clamp_output { "1" } else { "0" }.to_string(),
        lua_int(args.min_output_cost),
        if k.has_model { "1" } else { "0" }.to_string(),
        format!("{:016x}", args.body_fingerprint),
        lua_int(IDEMPOTENT_FREE_REPEATS),
        PROTOCOL_TAG.to_string(),
    ];
    command_body(call, RESERVE_SCRIPT, RESERVE_SHA1, &keys, &argv)
}

/// The fingerprint that binds an idempotency key to one request: FNV-1a-64 of the raw body bytes.
pub fn body_fingerprint(body: &[u8]) -> u64 {
    crate::hash::fnv1a(crate::hash::FNV_OFFSET, body)
}

/// Everything one settlement needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleArgs {
    /// The keys from the reservation ([`ReserveArgs::keys`]).
    pub keys: QuotaKeys,
    /// Actual weighted cost minus the reserved one (`prompt_cost + granted_output` of the reply;
    /// negative = refund). Counters stop at 0.
    pub delta: i64,
    /// Same fixed expiry as the reservation.
    pub expire_at_unix: i64,
    /// How long the settled marker lives (≥ 1 s; e.g. a day).
    pub marker_ttl_s: u64,
    /// The settlement refunds the whole reservation (nothing was charged in the end): delete the
    /// request's idempotency record if it wrote it (see [`SETTLE_SCRIPT`]). Ignored without a key.
    pub release_idempotency: bool,
}

/// The Webdis body (`POST /`) that runs the settlement script.
pub fn settle_request(args: &SettleArgs, call: ScriptCall) -> String {
    let k = &args.keys;
    let keys = [
        k.used_total.as_str(),
        k.used_model.as_str(),
        k.settled.as_str(),
        k.idem.as_str(),
    ];
    let mut argv = settle_argv(args).to_vec();
    argv.push(PROTOCOL_TAG.to_string());
    command_body(call, SETTLE_SCRIPT, SETTLE_SHA1, &keys, &argv)
}

/// The per-entry arguments shared by settlement and reconciliation scripts:
/// `amount, expire_at_unix, ttl_s, has_model, release`. `release` is the request id when `release`
/// is asked and the request has an idempotency key, else `-` (sanitized ids are never `-` alone:
/// empty ones become `~`, and the host's ids are `<id>-<context>-<ns>`).
fn counter_argv(
    amount: String,
    keys: &QuotaKeys,
    expire_at_unix: i64,
    ttl_s: u64,
    release: bool,
) -> [String; 5] {
    [
        amount,
        expire_at_unix.clamp(0, MAX_UNIX_S).to_string(),
        lua_int(ttl_s.max(1)),
        if keys.has_model { "1" } else { "0" }.to_string(),
        if release && keys.has_idem {
            keys.request_id.clone()
        } else {
            "-".to_string()
        },
    ]
}

fn settle_argv(a: &SettleArgs) -> [String; 5] {
    let lim = MAX_LUA_INT as i64;
    counter_argv(
        a.delta.clamp(-lim, lim).to_string(),
        &a.keys,
        a.expire_at_unix,
        a.marker_ttl_s,
        a.release_idempotency,
    )
}

/// The hash-tag prefix of a settlement's keys (`tg:q:{tenant}`): settlements may be batched per prefix.
pub fn tenant_tag(keys: &QuotaKeys) -> &str {
    match keys.used_total.find("}:") {
        Some(i) => keys.used_total.get(..=i).unwrap_or(&keys.used_total),
        None => &keys.used_total,
    }
}

/// The Webdis body that runs several settlements of one tenant (see [`SETTLE_BATCH_SCRIPT`]).
pub fn settle_batch_request(batch: &[&SettleArgs], call: ScriptCall) -> String {
    let mut keys: Vec<&str> = Vec::with_capacity(batch.len() * 4);
    let mut argv: Vec<String> = Vec::with_capacity(batch.len() * 5 + 1);
    for a in batch {
        keys.extend([
            a.keys.used_total.as_str(),
            a.keys.used_model.as_str(),
            a.keys.settled.as_str(),
            a.keys.idem.as_str(),
        ]);
        argv.extend(settle_argv(a));
    }
    argv.push(PROTOCOL_TAG.to_string());
    command_body(call, SETTLE_BATCH_SCRIPT, SETTLE_BATCH_SHA1, &keys, &argv)
}

/// Parses a batch settlement reply: one of 1 / 0 / −1 per entry, `n` entries.
pub fn parse_settle_batch_reply(
    http_status: u32,
    body: &[u8],
    n: usize,
) -> Result<Vec<i64>, ShimError> {
    let v = parse_int_array(http_status, body, n)?;
    if v.iter().any(|x| !(-1..=1).contains(x)) {
        return Err(ShimError::Garbage("batch entry out of range".into()));
    }
    Ok(v)
}

/// Everything one reconciliation needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileArgs {
    /// The keys from the reservation attempt.
    pub keys: QuotaKeys,
    /// Weighted tokens the request really cost (0 when it was not served; 0 also releases the request's
    /// idempotency record, as a full refund does in [`SETTLE_SCRIPT`]).
    pub actual: u64,
    /// Same fixed expiry as the reservation.
    pub expire_at_unix: i64,
    /// How long the tombstone and the settled marker live.
    pub marker_ttl_s: u64,
}

/// The Webdis body (`POST /`) that runs the reconciliation script.
pub fn reconcile_request(args: &ReconcileArgs, call: ScriptCall) -> String {
    let k = &args.keys;
    let keys = [
        k.used_total.as_str(),
        k.used_model.as_str(),
        k.request.as_str(),
        k.settled.as_str(),
        k.idem.as_str(),
    ];
    let mut argv = counter_argv(
        lua_int(args.actual),
        k,
        args.expire_at_unix,
        args.marker_ttl_s,
        args.actual == 0,
    )
    .to_vec();
    argv.push(PROTOCOL_TAG.to_string());
    command_body(call, RECONCILE_SCRIPT, RECONCILE_SHA1, &keys, &argv)
}

// ---------------------------------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------------------------------

/// Why a quota callout gave no usable answer. The host maps each to its failure mode and breaker event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimError {
    /// Redis or Webdis down, or the callout timed out: status 0/5xx, or an empty body.
    Unavailable,
    /// Webdis refused the command (ACL): status 403.
    Forbidden,
    /// `EVALSHA` of a script Redis does not know: resend with [`ScriptCall::Eval`].
    NoScript,
    /// Redis (or the script) answered an error, e.g. `ERR tokengate: not a count at …`.
    RedisError(String),
    /// Anything else malformed: other statuses, not JSON, wrong shape, types, length or ranges.
    Garbage(String),
}

impl std::fmt::Display for ShimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShimError::Unavailable => write!(f, "quota store unavailable"),
            ShimError::Forbidden => write!(f, "quota store refused the command (403)"),
            ShimError::NoScript => write!(f, "quota script not loaded (NOSCRIPT)"),
            ShimError::RedisError(e) => write!(f, "quota store error: {e}"),
            ShimError::Garbage(e) => write!(f, "malformed quota reply: {e}"),
        }
    }
}

/// Why a reservation was admitted or rejected (last reply element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Admitted in full.
    Admitted,
    /// Rejected: the tenant's monthly limit.
    TenantLimit,
    /// Rejected: the tenant x model monthly limit.
    ModelLimit,
    /// Admitted with less output than asked ([`ReserveReply::granted_output`]); rewrite max tokens.
    Clamped,
}

/// The parsed reservation decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReserveReply {
    /// Admitted (and charged, unless `duplicate`).
    pub allowed: bool,
    /// Tenant used this month after this call (unchanged when rejected).
    pub used_after: u64,
    /// Effective tenant limit (override or default).
    pub limit: u64,
    /// Tenant x model used after this call (0 when no model is tracked).
    pub model_used_after: u64,
    /// Effective tenant x model limit; `None` = no model limit.
    pub model_limit: Option<u64>,
    /// A free repeat: the idempotency key had already been admitted for the same body (fingerprint) and
    /// fewer than [`IDEMPOTENT_FREE_REPEATS`] repeats were served. This is the stored decision, nothing
    /// was charged (and the host should not settle this request: the first one owns the reservation).
    /// Only admitted decisions are remembered, so a retry after a rejection is evaluated afresh; a
    /// different body, a repeat beyond the bound, or a retry after a fully refunded first request is
    /// not a duplicate (it is reserved and settled like any request).
    pub duplicate: bool,
    /// Output cost reserved (equals `output_cost` unless clamped; 0 when rejected).
    pub granted_output: u64,
    /// Why.
    pub reason: Reason,
}

impl ReserveReply {
    /// Weighted tokens left for the tenant this month (after this call), floor 0.
    pub fn remaining(&self) -> u64 {
        self.binding().1
    }

    /// The limit that binds this decision and what is left of it, `(limit, remaining)`: for a
    /// rejection the limit it names ([`Reason::ModelLimit`] → the tenant × model limit), otherwise the
    /// limit with less left (the tenant's on a tie). Headers and messages show this pair together.
    pub fn binding(&self) -> (u64, u64) {
        let tenant = (self.limit, self.limit.saturating_sub(self.used_after));
        let Some(ml) = self.model_limit else {
            return tenant;
        };
        let model = (ml, ml.saturating_sub(self.model_used_after));
        match self.reason {
            Reason::ModelLimit => model,
            Reason::TenantLimit => tenant,
            Reason::Admitted | Reason::Clamped if model.1 < tenant.1 => model,
            Reason::Admitted | Reason::Clamped => tenant,
        }
    }
}

/// The parsed settlement answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettleReply {
    /// False when this request id had already been settled (nothing changed).
    pub applied: bool,
    /// Tenant used this month after settlement.
    pub used_after: u64,
    /// Tenant x model used after settlement (0 when no model is tracked).
    pub model_used_after: u64,
}

/// Checks the status and envelope and returns the array of integers the script answered.
pub(crate) fn parse_int_array(
    http_status: u32,
    body: &[u8],
    len: usize,
) -> Result<Vec<i64>, ShimError> {
    match http_status {
        200 => {}
        0 | 500..=599 => return Err(ShimError::Unavailable),
        403 => return Err(ShimError::Forbidden),
        s => return Err(ShimError::Garbage(format!("http status {s}"))),
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ShimError::Unavailable);
    }
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ShimError::Garbage(format!("not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| ShimError::Garbage("not a JSON object".into()))?;
    let value = match (obj.len(), obj.get("EVAL").or_else(|| obj.get("EVALSHA"))) {
        (1, Some(value)) => value,
        _ => return Err(ShimError::Garbage("expected {\"EVAL\": …}".into())),
    };
    let arr = value
        .as_array()
        .ok_or_else(|| ShimError::Garbage(format!("not an array: {value}")))?;
    // Redis errors: [false, "ERR …"].
    if let (Some(serde_json::Value::Bool(false)), Some(msg)) = (arr.first(), arr.get(1)) {
        let msg = msg.as_str().unwrap_or_default().to_string();
        if msg.starts_with("NOSCRIPT") {
            return Err(ShimError::NoScript);
        }
        return Err(ShimError::RedisError(msg));
    }
    if arr.len() != len {
        return Err(ShimError::Garbage(format!(
            "expected {len} integers, got {}",
            arr.len()
        )));
    }
    arr.iter()
        .map(|x| {
            x.as_i64()
                .filter(|n| n.unsigned_abs() <= MAX_LUA_INT)
                .ok_or_else(|| ShimError::Garbage(format!("not an integer: {x}")))
        })
        .collect()
}

fn non_neg(n: i64, what: &str) -> Result<u64, ShimError> {
    u64::try_from(n).map_err(|_| ShimError::Garbage(format!("negative {what}: {n}")))
}

fn flag(n: i64, what: &str) -> Result<bool, ShimError> {
    match n {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(ShimError::Garbage(format!("{what} is not 0/1: {n}"))),
    }
}

/// Parses Webdis' answer to [`reserve_request`]. Never panics; see [`ShimError`] for the classes.
pub fn parse_reserve_reply(http_status: u32, body: &[u8]) -> Result<ReserveReply, ShimError> {
    let a = parse_int_array(http_status, body, 8)?;
    let [allowed, used, limit, mused, mlimit, dup, granted, reason] = a.as_slice() else {
        return Err(ShimError::Garbage("wrong length".into()));
    };
    let model_limit = match *mlimit {
        -1 => None,
        n => Some(non_neg(n, "model limit")?),
    };
    let reason = match reason {
        0 => Reason::Admitted,
        1 => Reason::TenantLimit,
        2 => Reason::ModelLimit,
        3 => Reason::Clamped,
        r => return Err(ShimError::Garbage(format!("unknown reason {r}"))),
    };
    let reply = ReserveReply {
        allowed: flag(*allowed, "allowed")?,
        used_after: non_neg(*used, "used")?,
        limit: non_neg(*limit, "limit")?,
        model_used_after: non_neg(*mused, "model used")?,
        model_limit,
        duplicate: flag(*dup, "duplicate")?,
        granted_output: non_neg(*granted, "granted output")?,
        reason,
    };
    let consistent = matches!(
        (reply.allowed, reply.reason),
        (true, Reason::Admitted | Reason::Clamped)
            | (false, Reason::TenantLimit | Reason::ModelLimit)
    );
    if !consistent {
        return Err(ShimError::Garbage(format!(
            "allowed={} with reason {:?}",
            reply.allowed, reply.reason
        )));
    }
    Ok(reply)
}

/// Parses Webdis' answer to [`settle_request`]. Never panics.
pub fn parse_settle_reply(http_status: u32, body: &[u8]) -> Result<SettleReply, ShimError> {
    let a = parse_int_array(http_status, body, 3)?;
    let [applied, used, mused] = a.as_slice() else {
        return Err(ShimError::Garbage("wrong length".into()));
    };
    Ok(SettleReply {
        applied: flag(*applied, "applied")?,
        used_after: non_neg(*used, "used")?,
        model_used_after: non_neg(*mused, "model used")?,
    })
}

// ---------------------------------------------------------------------------------------------------
// Weighted cost
// ---------------------------------------------------------------------------------------------------

/// Per-model price weights: how many quota units one token of each kind costs.
///
/// `cached` is the part of the prompt served from the provider's cache and `reasoning` the part of the
/// output spent on reasoning (both already counted inside prompt/output, as OpenAI reports them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// Weight of an uncached prompt token.
    pub input: f64,
    /// Weight of a visible output token.
    pub output: f64,
    /// Weight of a cached prompt token.
    pub cached_input: f64,
    /// Weight of a reasoning output token.
    pub reasoning: f64,
}

impl Weights {
    /// Every token counts 1: the quota is in plain tokens.
    pub const UNIT: Weights = Weights {
        input: 1.0,
        output: 1.0,
        cached_input: 1.0,
        reasoning: 1.0,
    };

    /// Checks every weight is finite and ≥ 0 (for config validation); names the bad field.
    pub fn validate(&self) -> Result<(), &'static str> {
        for (name, w) in [
            ("input", self.input),
            ("output", self.output),
            ("cached_input", self.cached_input),
            ("reasoning", self.reasoning),
        ] {
            if !w.is_finite() || w < 0.0 {
                return Err(name);
            }
        }
        Ok(())
    }
}

impl Default for Weights {
    fn default() -> Self {
        Self::UNIT
    }
}

fn w(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Weighted cost, rounded up, capped at [`MAX_LUA_INT`]. The same function prices the reservation
/// (estimated prompt, max output, 0, 0) and the settlement (actual usage), so their difference is exact.
/// `cached` is capped at `prompt` and `reasoning` at `output`; invalid weights count as 0.
pub fn weighted(prompt: u64, output: u64, cached: u64, reasoning: u64, weights: &Weights) -> u64 {
    let cached = cached.min(prompt);
    let reasoning = reasoning.min(output);
    let units = (prompt - cached) as f64 * w(weights.input)
        + cached as f64 * w(weights.cached_input)
        + (output - reasoning) as f64 * w(weights.output)
        + reasoning as f64 * w(weights.reasoning);
    // Subtract a hair so that 1.1 * 10 (= 11.000000000000002) does not round up to 12.
    let c = (units - 1e-9).ceil();
    if c >= MAX_LUA_INT as f64 {
        MAX_LUA_INT
    } else if c > 0.0 {
        c as u64
    } else {
        0
    }
}

/// How many output tokens a granted output cost buys (floor), for one choice (see
/// [`clamped_output_tokens`] for `n` > 1). A zero output weight makes output free: `u64::MAX`.
pub fn output_tokens_for_cost(cost: u64, weights: &Weights) -> u64 {
    let ow = w(weights.output);
    if ow == 0.0 {
        return u64::MAX;
    }
    let t = (cost as f64 / ow + 1e-9).floor();
    if t >= MAX_LUA_INT as f64 {
        MAX_LUA_INT
    } else if t > 0.0 {
        t as u64
    } else {
        0
    }
}

/// The output limit per choice to write into the body after a [`Reason::Clamped`] reservation that
/// granted `granted_cost` for `choices` choices (the estimate's `output_choices`, e.g. `n`): the
/// provider bills every choice, so prompt + `choices` × tokens × output weight stays within what was
/// left. A zero output weight makes output free: `u64::MAX`.
pub fn clamped_output_tokens(granted_cost: u64, weights: &Weights, choices: u64) -> u64 {
    let all_choices = Weights {
        output: w(weights.output) * choices.max(1) as f64,
        ..*weights
    };
    output_tokens_for_cost(granted_cost, &all_choices)
}

/// The smallest output cost worth admitting when clamping `choices` choices: one token each.
pub fn min_clamped_output_cost(weights: &Weights, choices: u64) -> u64 {
    weighted(0, choices.max(1), 0, 0, weights).max(1)
}

// ---------------------------------------------------------------------------------------------------
// Exhausted marker (shared data)
// ---------------------------------------------------------------------------------------------------

/// "This tenant is out of quota until `month_end_unix`", cached in Envoy shared data so later requests
/// are rejected in the headers phase without a callout.
///
/// Encoding: 17 bytes, `[1][month_end_unix: i64 LE][limit: u64 LE]`. Note: raising a tenant's override
/// in Redis does not clear a cached marker (shared data has no delete); the host should re-check Redis
/// now and then (or when the configured limit differs from `limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExhaustedMarker {
    /// When the quota resets ([`month_end_unix`]); the marker is void from then on.
    pub month_end_unix: i64,
    /// The effective limit that was exhausted (override or configured), for the 429.
    pub limit: u64,
    /// The configured limit when the marker was written: a configuration change voids the marker.
    pub config_limit: u64,
    /// What was left (below the exhaustion threshold), for the 429's headers.
    pub remaining: u64,
}

impl ExhaustedMarker {
    /// Version byte of the encoding.
    pub const VERSION: u8 = 2;
    /// Encoded length: `[version=2][valid_until i64][limit u64][config_limit u64][remaining u64]`.
    pub const LEN: usize = 33;

    /// True while the marker still blocks the tenant.
    pub fn is_active(&self, now_unix_s: i64) -> bool {
        now_unix_s < self.month_end_unix
    }

    /// Shared-data key of a tenant's marker: `tg:q:x:<sanitized tenant>`.
    pub fn key(tenant: &str) -> String {
        format!("tg:q:x:{}", sanitize(tenant))
    }
}

impl Codec for ExhaustedMarker {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.push(Self::VERSION);
        v.extend_from_slice(&self.month_end_unix.to_le_bytes());
        v.extend_from_slice(&self.limit.to_le_bytes());
        v.extend_from_slice(&self.config_limit.to_le_bytes());
        v.extend_from_slice(&self.remaining.to_le_bytes());
        v
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::LEN || bytes.first() != Some(&Self::VERSION) {
            return None;
        }
        Some(Self {
            month_end_unix: i64::from_le_bytes(read_u64(bytes, 1)?.to_le_bytes()),
            limit: read_u64(bytes, 9)?,
            config_limit: read_u64(bytes, 17)?,
            remaining: read_u64(bytes, 25)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-11-30T23:59:59Z
    const NOV_LAST_SECOND: i64 = 1_796_083_199;

    #[test]
    fn month_of_epoch_is_january_1970() {
        assert_eq!(month_of(0, 0), (1970, 1));
        assert_eq!(month_label(0, 0), "1970-01");
    }

    #[test]
    fn last_second_of_november_is_still_november_and_next_second_is_december() {
        assert_eq!(month_of(NOV_LAST_SECOND, 0), (2026, 11));
        assert_eq!(month_of(NOV_LAST_SECOND + 1, 0), (2026, 12));
        assert_eq!(month_end_unix(NOV_LAST_SECOND, 0), NOV_LAST_SECOND + 1);
        assert_eq!(seconds_to_reset(NOV_LAST_SECOND, 0), 1);
    }

    #[test]
    fn december_rolls_over_into_january_of_next_year() {
        let dec31 = 1_798_761_599; // 2026-12-31T23:59:59Z
        assert_eq!(month_label(dec31, 0), "2026-12");
        assert_eq!(month_end_unix(dec31, 0), 1_798_761_600); // 2027-01-01T00:00:00Z
        assert_eq!(month_label(dec31 + 1, 0), "2027-01");
        assert_eq!(month_end_unix(dec31 + 1, 0), 1_801_440_000); // 2027-02-01
    }

    #[test]
    fn leap_day_2028_belongs_to_february_which_ends_on_march_first() {
        let feb29 = 1_835_395_200; // 2028-02-29T00:00:00Z
        assert_eq!(month_of(feb29, 0), (2028, 2));
        assert_eq!(month_of(feb29 + 86_399, 0), (2028, 2));
        assert_eq!(month_end_unix(feb29, 0), feb29 + 86_400);
        assert_eq!(month_of(feb29 + 86_400, 0), (2028, 3));
        // 2100 is not a leap year: February 2100 has 28 days.
        let feb1_2100 = 4_105_123_200;
        assert_eq!(month_end_unix(feb1_2100, 0) - feb1_2100, 28 * 86_400);
    }

    #[test]
    fn positive_offset_of_14_hours_starts_the_month_earlier_in_utc() {
        // 2026-11-30T10:00:00Z is 2026-12-01T00:00 at +14:00.
        let t = 1_796_032_800;
        assert_eq!(month_of(t - 1, 840), (2026, 11));
        assert_eq!(month_of(t, 840), (2026, 12));
        assert_eq!(month_end_unix(t - 1, 840), t);
        assert_eq!(month_of(t, 0), (2026, 11));
    }

    #[test]
    fn negative_offset_of_14_hours_ends_the_month_later_in_utc() {
        // 2026-12-01T14:00:00Z is 2026-12-01T00:00 at -14:00.
        let t = 1_796_133_600;
        assert_eq!(month_of(t - 1, -840), (2026, 11));
        assert_eq!(month_of(t, -840), (2026, 12));
        assert_eq!(month_end_unix(NOV_LAST_SECOND, -840), t);
        assert_eq!(seconds_to_reset(NOV_LAST_SECOND, -840), 14 * 3600 + 1);
    }

    #[test]
    fn offsets_beyond_14_hours_and_absurd_times_are_clamped_without_panicking() {
        assert_eq!(
            month_of(NOV_LAST_SECOND, i32::MAX),
            month_of(NOV_LAST_SECOND, 840)
        );
        assert_eq!(month_of(i64::MIN, 0), (1970, 1));
        assert_eq!(month_of(i64::MIN, i32::MIN), (1969, 12));
        assert_eq!(month_of(i64::MAX, 0), (9999, 12));
        assert!(seconds_to_reset(i64::MAX, 0) >= 1);
        assert!(seconds_to_reset(i64::MIN, -840) >= 1);
    }

    #[test]
    fn civil_conversion_round_trips_every_day_over_four_centuries() {
        for days in (0..146_097 * 2).step_by(1) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn month_end_is_after_now_and_in_the_next_month_for_many_instants() {
        let mut t = 0i64;
        while t < 4_200_000_000 {
            for off in [-840, -330, 0, 345, 840] {
                let end = month_end_unix(t, off);
                assert!(end > t, "t={t} off={off}");
                assert_ne!(month_of(end, off), month_of(t, off));
                assert_eq!(month_of(end - 1, off), month_of(t, off));
            }
            t += 86_400 * 7 + 3_607;
        }
    }

    #[test]
    fn sanitized_borrows_exactly_when_sanitize_would_not_change_the_value() {
        let long = "m".repeat(300);
        for raw in ["gpt-4.1", "key:abc", "a b", "é", "", "x/y", long.as_str()] {
            let s = sanitized(raw);
            assert_eq!(s, sanitize(raw), "{raw}");
            assert_eq!(
                matches!(s, std::borrow::Cow::Borrowed(_)),
                s == raw,
                "{raw}"
            );
        }
    }

    #[test]
    fn sanitize_keeps_safe_characters_and_percent_encodes_the_rest() {
        assert_eq!(sanitize("key:abc-1.2_x"), "key:abc-1.2_x");
        assert_eq!(sanitize("a{b}c/d e%"), "a%7Bb%7Dc%2Fd%20e%25");
        assert_eq!(sanitize("é"), "%C3%A9");
        assert_eq!(sanitize(""), "~");
    }

    #[test]
    fn sanitize_bounds_long_values_and_keeps_them_distinct() {
        let a = "x".repeat(500);
        let b = format!("{}y", "x".repeat(499));
        let (sa, sb) = (sanitize(&a), sanitize(&b));
        assert!(sa.len() <= MAX_PART_LEN && sb.len() <= MAX_PART_LEN);
        assert_ne!(sa, sb);
        assert!(sa.contains('~'));
        let u = "€".repeat(200);
        let su = sanitize(&u);
        assert!(su.len() <= MAX_PART_LEN);
        let prefix = su.split('~').next().unwrap();
        assert_eq!(prefix.len() % 3, 0, "no %XX triple is split: {su}");
        assert_eq!(
            sanitize(&"y".repeat(MAX_PART_LEN)),
            "y".repeat(MAX_PART_LEN)
        );
    }

    #[test]
    fn every_key_of_a_tenant_carries_the_same_hash_tag() {
        let k = QuotaKeys::new("key:9f2c", Some("gpt-4.1"), "2026-11", Some("abc"), "r1");
        assert_eq!(k.used_total, "tg:q:{key:9f2c}:2026-11");
        assert_eq!(k.used_model, "tg:q:{key:9f2c}:2026-11:m:gpt-4.1");
        assert_eq!(k.limit_override, "tg:q:{key:9f2c}:limit");
        assert_eq!(k.limit_model_override, "tg:q:{key:9f2c}:limit:m:gpt-4.1");
        assert_eq!(k.idem, "tg:q:{key:9f2c}:idem:abc");
        assert_eq!(k.settled, "tg:q:{key:9f2c}:settled:r1");
        let t = QuotaKeys::new("a}b{", None, "2026-11", None, "r");
        for key in [
            &t.used_total,
            &t.used_model,
            &t.limit_override,
            &t.idem,
            &t.settled,
        ] {
            assert!(key.starts_with("tg:q:{a%7Db%7B}:"), "{key}");
            assert_eq!(key.matches('{').count(), 1);
        }
        assert_eq!(t.used_model, "tg:q:{a%7Db%7B}:none");
        assert!(!t.has_model);
    }

    pub(super) fn args() -> ReserveArgs {
        ReserveArgs {
            tenant: "acme".into(),
            model: Some("gpt-4.1".into()),
            month: "2026-11".into(),
            idempotency_key: None,
            body_fingerprint: 0xfeed,
            request_id: "req-1".into(),
            prompt_cost: 100,
            output_cost: 50,
            default_limit: 1000,
            default_model_limit: 0,
            expire_at_unix: 1_796_688_000,
            idem_window_s: 0,
            clamp_output: false,
            min_output_cost: 0,
        }
    }

    #[test]
    fn reserve_request_encodes_keys_and_arguments_in_script_order() {
        let body = reserve_request(&args(), ScriptCall::EvalSha);
        assert_eq!(
            body,
            format!(
                "EVALSHA/{RESERVE_SHA1}/6/tg%3Aq%3A%7Bacme%7D%3A2026-11/\
                 tg%3Aq%3A%7Bacme%7D%3A2026-11%3Am%3Agpt-4%2E1/tg%3Aq%3A%7Bacme%7D%3Alimit/\
                 tg%3Aq%3A%7Bacme%7D%3Alimit%3Am%3Agpt-4%2E1/tg%3Aq%3A%7Bacme%7D%3Anone/\
                 tg%3Aq%3A%7Bacme%7D%3Areq%3Areq-1/\
                 100/50/1000/0/1796688000/0/req-1/0/0/1/000000000000feed/3/tg1"
            )
        );
    }

    #[test]
    fn encoded_bodies_never_contain_raw_slash_plus_dot_or_space_inside_segments() {
        let mut a = args();
        a.tenant = "a/b+c d.json".into();
        a.request_id = "x.json".into();
        a.idempotency_key = Some("k/+.raw".into());
        a.idem_window_s = 60;
        for body in [
            reserve_request(&a, ScriptCall::Eval),
            reserve_request(&a, ScriptCall::EvalSha),
        ] {
            assert!(!body.contains('+') && !body.contains(' ') && !body.contains('.'));
            assert!(body.ends_with("/tg1"));
            let segments = body.split('/').count();
            assert_eq!(segments, 2 + 1 + 6 + 13);
        }
        assert!(webdis_encode(RESERVE_SCRIPT)
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'%' || b == b'_' || b == b'-'));
    }

    #[test]
    fn evalsha_bodies_are_an_order_of_magnitude_smaller_than_eval_bodies() {
        let eval = reserve_request(&args(), ScriptCall::Eval).len();
        let sha = reserve_request(&args(), ScriptCall::EvalSha).len();
        eprintln!("reserve body: EVAL {eval} bytes, EVALSHA {sha} bytes");
        assert!(sha < 400 && eval > 2000);
    }

    #[test]
    fn settle_request_clamps_huge_deltas_to_lua_exact_integers() {
        let s = SettleArgs {
            keys: args().keys(),
            delta: i64::MIN,
            expire_at_unix: 10,
            marker_ttl_s: 0,
            release_idempotency: false,
        };
        let body = settle_request(&s, ScriptCall::EvalSha);
        assert!(body.contains("/-9007199254740991/10/1/1/-/tg1"), "{body}");
        assert!(body.contains("settled%3Areq-1"));
    }

    #[test]
    fn admitted_reply_parses_with_every_field() {
        let r = parse_reserve_reply(200, br#"{"EVAL":[1,150,1000,150,500,0,50,0]}"#).unwrap();
        assert_eq!(
            r,
            ReserveReply {
                allowed: true,
                used_after: 150,
                limit: 1000,
                model_used_after: 150,
                model_limit: Some(500),
                duplicate: false,
                granted_output: 50,
                reason: Reason::Admitted
            }
        );
        assert_eq!(r.remaining(), 350);
    }

    #[test]
    fn evalsha_envelope_and_missing_model_limit_parse() {
        let r = parse_reserve_reply(200, br#"{"EVALSHA":[0,990,1000,0,-1,0,0,1]}"#).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.model_limit, None);
        assert_eq!(r.reason, Reason::TenantLimit);
        assert_eq!(r.remaining(), 10);
    }

    #[test]
    fn unavailable_covers_zero_5xx_and_empty_bodies() {
        for (status, body) in [
            (0, &b""[..]),
            (503, b""),
            (504, b"upstream request timeout"),
            (200, b""),
            (200, b" \n"),
        ] {
            assert_eq!(
                parse_reserve_reply(status, body),
                Err(ShimError::Unavailable),
                "{status}"
            );
        }
        assert_eq!(parse_settle_reply(503, b""), Err(ShimError::Unavailable));
    }

    #[test]
    fn status_403_is_forbidden_and_other_statuses_are_garbage() {
        assert_eq!(parse_reserve_reply(403, b"{}"), Err(ShimError::Forbidden));
        assert!(matches!(
            parse_reserve_reply(404, b"{}"),
            Err(ShimError::Garbage(_))
        ));
    }

    #[test]
    fn redis_errors_and_noscript_are_told_apart() {
        assert_eq!(
            parse_reserve_reply(200, br#"{"EVAL":[false,"ERR tokengate: bad argument"]}"#),
            Err(ShimError::RedisError("ERR tokengate: bad argument".into()))
        );
        assert_eq!(
            parse_settle_reply(
                200,
                br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#
            ),
            Err(ShimError::NoScript)
        );
    }

    #[test]
    fn malformed_replies_are_garbage_never_a_panic() {
        let cases: &[&[u8]] = &[
            b"not json",
            b"[1,2]",
            br#"{"EVAL":null}"#,
            br#"{"GET":[1,1,1,1,1,0,1,0]}"#,
            br#"{"EVAL":[1,1,1,1,1,0,1,0],"x":1}"#,
            br#"{"EVAL":[1,1,1,1,1,0,1]}"#,
            br#"{"EVAL":[1,1,1,1,1,0,1,0,0]}"#,
            br#"{"EVAL":[1,"1",1,1,1,0,1,0]}"#,
            br#"{"EVAL":[1,1.5,1,1,1,0,1,0]}"#,
            br#"{"EVAL":[1,1,-5,1,1,0,1,0]}"#,
            br#"{"EVAL":[1,1,1,1,-2,0,1,0]}"#,
            br#"{"EVAL":[2,1,1,1,1,0,1,0]}"#,
            br#"{"EVAL":[1,1,1,1,1,0,1,9]}"#,
            br#"{"EVAL":[1,1,1,1,1,0,1,1]}"#,
            br#"{"EVAL":[0,1,1,1,1,0,1,0]}"#,
            br#"{"EVAL":[1,1,1,1,1,0,1,18446744073709551615]}"#,
            br#"{"EVAL":[false]}"#,
            br#"{"EVAL":[true,"x"]}"#,
            b"\xff\xfe",
        ];
        for c in cases {
            let r = parse_reserve_reply(200, c);
            assert!(
                matches!(r, Err(ShimError::Garbage(_))),
                "{:?} -> {r:?}",
                String::from_utf8_lossy(c)
            );
        }
        assert!(matches!(
            parse_settle_reply(200, br#"{"EVAL":[1,-1,0]}"#),
            Err(ShimError::Garbage(_))
        ));
        assert!(matches!(
            parse_settle_reply(200, br#"{"EVAL":[3,1,0]}"#),
            Err(ShimError::Garbage(_))
        ));
        assert!(matches!(
            parse_settle_reply(200, br#"{"EVAL":[1,1]}"#),
            Err(ShimError::Garbage(_))
        ));
    }

    #[test]
    fn settle_reply_parses_applied_and_already_settled() {
        assert_eq!(
            parse_settle_reply(200, br#"{"EVAL":[1,120,80]}"#),
            Ok(SettleReply {
                applied: true,
                used_after: 120,
                model_used_after: 80
            })
        );
        assert!(
            !parse_settle_reply(200, br#"{"EVAL":[0,120,0]}"#)
                .unwrap()
                .applied
        );
    }

    #[test]
    fn weighted_cost_rounds_up_and_splits_cached_and_reasoning_tokens() {
        let w = Weights {
            input: 1.0,
            output: 4.0,
            cached_input: 0.25,
            reasoning: 4.0,
        };
        assert_eq!(weighted(1000, 100, 400, 50, &w), 600 + 100 + 400);
        assert_eq!(weighted(1, 0, 1, 0, &w), 1); // 0.25 rounds up
        assert_eq!(
            weighted(
                10,
                0,
                0,
                0,
                &Weights {
                    input: 1.1,
                    ..Weights::UNIT
                }
            ),
            11
        );
        assert_eq!(weighted(0, 0, 0, 0, &w), 0);
        assert_eq!(
            weighted(5, 5, 99, 99, &Weights::UNIT),
            10,
            "cached and reasoning are capped"
        );
    }

    #[test]
    fn weighted_cost_saturates_and_treats_invalid_weights_as_zero() {
        let bad = Weights {
            input: f64::NAN,
            output: -3.0,
            cached_input: f64::INFINITY,
            reasoning: 1.0,
        };
        assert_eq!(weighted(10, 10, 5, 0, &bad), 0);
        assert_eq!(bad.validate(), Err("input"));
        assert_eq!(Weights::UNIT.validate(), Ok(()));
        assert_eq!(
            weighted(u64::MAX, u64::MAX, 0, 0, &Weights::UNIT),
            MAX_LUA_INT
        );
    }

    #[test]
    fn output_tokens_for_cost_inverts_the_output_weight() {
        let w = Weights {
            output: 4.0,
            ..Weights::UNIT
        };
        assert_eq!(output_tokens_for_cost(400, &w), 100);
        assert_eq!(output_tokens_for_cost(403, &w), 100);
        assert_eq!(output_tokens_for_cost(weighted(0, 37, 0, 0, &w), &w), 37);
        assert_eq!(
            output_tokens_for_cost(5, &Weights { output: 0.0, ..w }),
            u64::MAX
        );
    }

    #[test]
    fn clamped_output_tokens_divides_what_is_left_by_every_choice() {
        let w4 = Weights {
            output: 4.0,
            ..Weights::UNIT
        };
        // The review's case: 993 left after the prompt, output weight 4, n = 2 -> 124 per choice.
        assert_eq!(clamped_output_tokens(993, &w4, 2), 124);
        assert_eq!(clamped_output_tokens(993, &w4, 1), 248);
        assert_eq!(
            clamped_output_tokens(993, &w4, 0),
            248,
            "0 choices count as 1"
        );
        assert_eq!(min_clamped_output_cost(&w4, 2), 8);
        assert_eq!(min_clamped_output_cost(&Weights::UNIT, 1), 1);
        assert_eq!(
            clamped_output_tokens(5, &Weights { output: 0.0, ..w4 }, 3),
            u64::MAX
        );
        // Never more than granted, for awkward weights, and at least one token per choice whenever
        // the grant reaches the clamping minimum.
        for ow in [0.25, 0.5, 1.0, 1.1, 3.0, 4.0, 7.3] {
            let w = Weights {
                output: ow,
                ..Weights::UNIT
            };
            for n in 1..=6 {
                for granted in 0..200 {
                    let t = clamped_output_tokens(granted, &w, n);
                    assert!(
                        weighted(0, t * n, 0, 0, &w) <= granted,
                        "ow {ow} n {n} granted {granted} -> {t}"
                    );
                    if granted >= min_clamped_output_cost(&w, n) {
                        assert!(t >= 1, "ow {ow} n {n} granted {granted}");
                    }
                }
            }
        }
    }

    fn reply(
        allowed: bool,
        used: u64,
        mused: u64,
        mlimit: Option<u64>,
        reason: Reason,
    ) -> ReserveReply {
        ReserveReply {
            allowed,
            used_after: used,
            limit: 100_000,
            model_used_after: mused,
            model_limit: mlimit,
            duplicate: false,
            granted_output: 0,
            reason,
        }
    }

    #[test]
    fn the_binding_limit_and_its_remaining_are_reported_together() {
        // Rejected by the model limit: the model's limit, not the tenant's.
        let r = reply(false, 0, 0, Some(10), Reason::ModelLimit);
        assert_eq!(r.binding(), (10, 10));
        // Admitted: whichever has less left.
        let r = reply(true, 100, 47, Some(50), Reason::Admitted);
        assert_eq!(r.binding(), (50, 3));
        assert_eq!(r.remaining(), 3);
        let r = reply(true, 99_990, 47, Some(5_000), Reason::Clamped);
        assert_eq!(r.binding(), (100_000, 10));
        // Tie, no model limit, tenant rejection: the tenant's.
        assert_eq!(
            reply(true, 90_000, 0, Some(10_000), Reason::Admitted).binding(),
            (100_000, 10_000)
        );
        assert_eq!(
            reply(true, 7, 7, None, Reason::Admitted).binding(),
            (100_000, 99_993)
        );
        assert_eq!(
            reply(false, 100_000, 0, Some(10), Reason::TenantLimit).binding(),
            (100_000, 0)
        );
    }

    #[test]
    fn a_full_refund_names_the_request_whose_idempotency_record_it_releases() {
        let mut a = args();
        a.idempotency_key = Some("k".into());
        a.idem_window_s = 60;
        let mut s = SettleArgs {
            keys: a.keys(),
            delta: -150,
            expire_at_unix: 10,
            marker_ttl_s: 60,
            release_idempotency: true,
        };
        let body = settle_request(&s, ScriptCall::EvalSha);
        assert!(body.contains("/4/"), "four keys: {body}");
        assert!(body.contains("idem%3Ak/-150/10/60/1/req-1/tg1"), "{body}");
        s.release_idempotency = false;
        assert!(settle_request(&s, ScriptCall::EvalSha).ends_with("/1/-/tg1"));
        // Without an idempotency key there is nothing to release.
        s.keys = args().keys();
        s.release_idempotency = true;
        assert!(settle_request(&s, ScriptCall::EvalSha).ends_with("/1/-/tg1"));
        let batch = settle_batch_request(&[&s, &s], ScriptCall::EvalSha);
        assert!(batch.contains("/8/"), "{batch}");
        // Reconciliation releases exactly when nothing is charged.
        let mut rec = ReconcileArgs {
            keys: a.keys(),
            actual: 0,
            expire_at_unix: 10,
            marker_ttl_s: 60,
        };
        assert!(reconcile_request(&rec, ScriptCall::EvalSha).ends_with("/0/10/60/1/req-1/tg1"));
        rec.actual = 5;
        assert!(reconcile_request(&rec, ScriptCall::EvalSha).ends_with("/5/10/60/1/-/tg1"));
    }

    #[test]
    fn body_fingerprint_is_fnv1a_of_the_raw_bytes() {
        assert_eq!(body_fingerprint(b""), crate::hash::FNV_OFFSET);
        assert_eq!(body_fingerprint(b"foobar"), 0x8594_4171_f739_67e8);
        assert_ne!(
            body_fingerprint(br#"{"max_tokens":10}"#),
            body_fingerprint(br#"{"max_tokens":5000}"#)
        );
    }

    #[test]
    fn exhausted_marker_round_trips_and_rejects_wrong_length_or_version() {
        let m = ExhaustedMarker {
            month_end_unix: 1_796_083_200,
            limit: 5_000_000,
            config_limit: 6_000_000,
            remaining: 3,
        };
        let bytes = m.encode();
        assert_eq!(bytes.len(), ExhaustedMarker::LEN);
        assert_eq!(ExhaustedMarker::decode(&bytes), Some(m));
        let mut v2 = bytes.clone();
        v2[0] = 1;
        assert_eq!(ExhaustedMarker::decode(&v2), None);
        assert_eq!(ExhaustedMarker::decode(&bytes[..32]), None);
        assert_eq!(ExhaustedMarker::decode(&[]), None);
        assert!(m.is_active(1_796_083_199));
        assert!(!m.is_active(1_796_083_200));
        assert_eq!(ExhaustedMarker::key("a b"), "tg:q:x:a%20b");
    }

    #[test]
    fn exhausted_marker_works_through_the_shared_store_helpers() {
        let s = crate::store::MemStore::new();
        let m = ExhaustedMarker {
            month_end_unix: -5,
            limit: 7,
            config_limit: 7,
            remaining: 0,
        };
        crate::store::SharedStore::set(&s, "k", &m.encode(), 0).unwrap();
        assert_eq!(
            crate::store::peek::<ExhaustedMarker>(&s, "k").unwrap(),
            (Some(m), false)
        );
    }
}

/// Tests against a real `redis-server` (and real Webdis) started on free loopback ports; skipped with a
/// message when the binaries are missing. Every process is killed by PID when its guard drops.
#[cfg(test)]
pub(crate) mod live {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    const REDIS: &str = "/usr/bin/redis-server";
    const REDIS_CLI: &str = "/usr/bin/redis-cli";
    const WEBDIS: &str = "/usr/bin/webdis";

    struct Proc(Child);
    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn wait_port(port: u16) {
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "port {port} never opened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Redis + Webdis (and optionally an ACL-restricted second Webdis) on their own ports.
    pub(crate) struct Stack {
        redis_port: u16,
        webdis_port: u16,
        redis: Option<Proc>,
        _webdis: Vec<Proc>,
        dir: PathBuf,
    }

    impl Drop for Stack {
        fn drop(&mut self) {
            self._webdis.clear();
            self.redis = None;
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    pub(crate) fn available() -> bool {
        let ok = [REDIS, REDIS_CLI, WEBDIS]
            .iter()
            .all(|p| Path::new(p).exists());
        if !ok {
            eprintln!("SKIPPED: redis-server, redis-cli or webdis not installed");
        }
        ok
    }

    fn spawn_webdis(dir: &Path, redis_port: u16, acl: &str) -> (Proc, u16) {
        let port = free_port();
        let conf = dir.join(format!("webdis-{port}.json"));
        std::fs::write(
            &conf,
            format!(
                r#"{{"redis_host":"127.0.0.1","redis_port":{redis_port},"http_host":"127.0.0.1",
                "http_port":{port},"threads":1,"pool_size":2,"daemonize":false,"websockets":false,
                "database":0,"verbosity":3,"logfile":"{}"{acl}}}"#,
                dir.join(format!("webdis-{port}.log")).display()
            ),
        )
        .unwrap();
        let child = Command::new(WEBDIS)
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let p = Proc(child);
        wait_port(port);
        (p, port)
    }

    impl Stack {
        pub fn start() -> Option<Stack> {
            if !available() {
                return None;
            }
            let redis_port = free_port();
            let dir =
                std::env::temp_dir().join(format!("tg-quota-{}-{redis_port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let redis = Proc(
                Command::new(REDIS)
                    .args([
                        "--port",
                        &redis_port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                    ])
                    .args(["--appendonly", "no", "--daemonize", "no"])
                    .arg("--dir")
                    .arg(&dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            wait_port(redis_port);
            let (webdis, webdis_port) = spawn_webdis(&dir, redis_port, "");
            Some(Stack {
                redis_port,
                webdis_port,
                redis: Some(redis),
                _webdis: vec![webdis],
                dir,
            })
        }

        /// A second Webdis whose ACL disables EVAL and EVALSHA; returns its port.
        pub fn start_acl_webdis(&mut self) -> u16 {
            let (p, port) = spawn_webdis(
                &self.dir,
                self.redis_port,
                r#","acl":[{"disabled":["EVAL","EVALSHA"]}]"#,
            );
            self._webdis.push(p);
            port
        }

        /// Runs redis-cli with `args`, returns its raw stdout (trimmed).
        pub fn cli(&self, args: &[&str]) -> String {
            let out = Command::new(REDIS_CLI)
                .args(["-h", "127.0.0.1", "-p", &self.redis_port.to_string()])
                .args(args)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }

        /// `POST /` to Webdis with `body`; returns (status, body).
        pub fn post(&self, body: &str) -> (u32, Vec<u8>) {
            post_to(self.webdis_port, body)
        }
    }

    fn post_to(port: u16, body: &str) -> (u32, Vec<u8>) {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "POST / HTTP/1.1\r\nHost: webdis\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            if let Some(pos) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..pos]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if let Some(len) = len {
                    if raw.len() >= pos + 4 + len {
                        break;
                    }
                }
            }
        }
        let pos = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no header end: {:?}", String::from_utf8_lossy(&raw)));
        let head = String::from_utf8_lossy(&raw[..pos]).to_string();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, raw[pos + 4..].to_vec())
    }

    fn reserve(st: &Stack, a: &ReserveArgs) -> Result<ReserveReply, ShimError> {
        let (s, b) = st.post(&reserve_request(a, ScriptCall::Eval));
        parse_reserve_reply(s, &b)
    }

    fn settle(st: &Stack, s: &SettleArgs) -> Result<SettleReply, ShimError> {
        let (code, b) = st.post(&settle_request(s, ScriptCall::Eval));
        parse_settle_reply(code, &b)
    }

    fn base() -> ReserveArgs {
        super::tests::args()
    }

    #[test]
    fn script_sha1_constants_match_what_redis_script_load_returns() {
        let Some(st) = Stack::start() else { return };
        assert_eq!(st.cli(&["SCRIPT", "LOAD", RESERVE_SCRIPT]), RESERVE_SHA1);
        assert_eq!(st.cli(&["SCRIPT", "LOAD", SETTLE_SCRIPT]), SETTLE_SHA1);
        assert_eq!(
            st.cli(&["SCRIPT", "LOAD", RECONCILE_SCRIPT]),
            RECONCILE_SHA1
        );
        assert_eq!(
            st.cli(&["SCRIPT", "LOAD", SETTLE_BATCH_SCRIPT]),
            SETTLE_BATCH_SHA1
        );
    }

    #[test]
    fn a_settlement_batch_applies_each_entry_once_through_webdis() {
        let Some(st) = Stack::start() else { return };
        let mut jobs = Vec::new();
        for (i, delta) in [(1, -20i64), (2, 5), (3, -500)] {
            let mut a = base();
            a.request_id = format!("b-{i}");
            reserve(&st, &a).unwrap();
            jobs.push(SettleArgs {
                keys: a.keys(),
                delta,
                expire_at_unix: 1_796_688_000,
                marker_ttl_s: 60,
                release_idempotency: false,
            });
        }
        let k = jobs[0].keys.clone();
        assert_eq!(st.cli(&["GET", &k.used_total]), "450");
        let refs: Vec<&SettleArgs> = jobs.iter().collect();
        let (status, body) = st.post(&settle_batch_request(&refs, ScriptCall::Eval));
        assert_eq!(
            parse_settle_batch_reply(status, &body, 3).unwrap(),
            [1, 1, 1]
        );
        // 450 - 20 + 5 - 500 stops at 0
        assert_eq!(st.cli(&["GET", &k.used_total]), "0");
        let (status, body) = st.post(&settle_batch_request(&refs, ScriptCall::EvalSha));
        assert_eq!(
            parse_settle_batch_reply(status, &body, 3).unwrap(),
            [0, 0, 0]
        );
        assert_eq!(tenant_tag(&k), "tg:q:{acme}");
    }

    #[test]
    fn reconcile_charges_actual_minus_a_landed_reservation_and_blocks_a_late_one() {
        let Some(st) = Stack::start() else { return };
        // (a) the reservation landed before the reconciliation: net charge = actual
        let a = base();
        reserve(&st, &a).unwrap();
        let k = a.keys();
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        let rec = ReconcileArgs {
            keys: k.clone(),
            actual: 40,
            expire_at_unix: 1_796_688_000,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["GET", &k.used_total]), "40");
        // a repeat changes nothing
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(!parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["GET", &k.used_total]), "40");
        // (b) reconciled first (actual 0: not served), the reservation arrives late: no charge
        let mut b = base();
        b.request_id = "req-2".into();
        let kb = b.keys();
        let rec_b = ReconcileArgs {
            keys: kb.clone(),
            actual: 0,
            expire_at_unix: 1_796_688_000,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec_b, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        let late = reserve(&st, &b).unwrap_err();
        assert!(
            matches!(&late, ShimError::RedisError(e) if e.contains("reconciled")),
            "{late:?}"
        );
        assert_eq!(st.cli(&["GET", &kb.used_total]), "40");
    }

    #[test]
    fn reserve_script_runs_directly_through_redis_cli_eval() {
        let Some(st) = Stack::start() else { return };
        let k = base().keys();
        let keys = [
            &k.used_total,
            &k.used_model,
            &k.limit_override,
            &k.limit_model_override,
            &k.idem,
            &k.request,
        ];
        let mut cmd: Vec<&str> = vec!["EVAL", RESERVE_SCRIPT, "6"];
        cmd.extend(keys.iter().map(|s| s.as_str()));
        cmd.extend([
            "100",
            "50",
            "1000",
            "0",
            "1796688000",
            "0",
            "req-1",
            "0",
            "0",
            "1",
            "feed",
            "3",
            "tg1",
        ]);
        assert_eq!(
            st.cli(&cmd).lines().collect::<Vec<_>>(),
            ["1", "150", "1000", "150", "-1", "0", "50", "0"]
        );
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        assert_eq!(st.cli(&["GET", &k.used_model]), "150");
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_total]), "1796688000");
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
    }

    #[test]
    fn reservation_through_webdis_charges_both_counters_and_expires_them_at_a_fixed_instant() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        let k = a.keys();
        let r1 = reserve(&st, &a).unwrap();
        assert_eq!(
            (
                r1.allowed,
                r1.used_after,
                r1.model_used_after,
                r1.granted_output
            ),
            (true, 150, 150, 50)
        );
        assert_eq!(r1.model_limit, None);
        let r2 = reserve(&st, &a).unwrap();
        assert_eq!(r2.used_after, 300);
        // EXPIREAT, not EXPIRE: the expiry stays the month end + grace no matter how many calls.
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_total]), "1796688000");
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_model]), "1796688000");
    }

    #[test]
    fn reservation_over_the_tenant_limit_is_rejected_and_charges_nothing() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 900;
        a.output_cost = 100;
        assert!(reserve(&st, &a).unwrap().allowed); // exactly the limit
        a.prompt_cost = 1;
        a.output_cost = 0;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.used_after, r.limit, r.reason),
            (false, 1000, 1000, Reason::TenantLimit)
        );
        assert_eq!(r.remaining(), 0);
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "1000");
    }

    #[test]
    fn model_limit_rejects_before_the_tenant_limit_and_says_so() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.default_model_limit = 200;
        assert_eq!(reserve(&st, &a).unwrap().model_limit, Some(200));
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.reason, r.used_after, r.model_used_after),
            (false, Reason::ModelLimit, 150, 150)
        );
        // Another model of the same tenant is not affected by that model's counter.
        a.model = Some("gpt-4.1-mini".into());
        assert!(reserve(&st, &a).unwrap().allowed);
    }

    #[test]
    fn operator_overrides_replace_the_default_limits() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        let k = a.keys();
        st.cli(&["SET", &k.limit_override, "100"]);
        let r = reserve(&st, &a).unwrap();
        assert_eq!((r.allowed, r.limit), (false, 100));
        st.cli(&["SET", &k.limit_override, "5000"]);
        st.cli(&["SET", &k.limit_model_override, "0"]);
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.limit, r.model_limit, r.reason),
            (false, 5000, Some(0), Reason::ModelLimit)
        );
    }

    #[test]
    fn a_corrupt_override_is_a_redis_error_not_a_silent_default() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        st.cli(&["SET", &a.keys().limit_override, "lots"]);
        match reserve(&st, &a) {
            Err(ShimError::RedisError(m)) => assert!(m.contains("not a count"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_repeated_idempotency_key_returns_the_first_decision_and_charges_once() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.idempotency_key = Some("client-key/1.json".into());
        a.idem_window_s = 600;
        let first = reserve(&st, &a).unwrap();
        assert!(!first.duplicate);
        a.request_id = "req-2".into();
        let again = reserve(&st, &a).unwrap();
        assert_eq!(
            again,
            ReserveReply {
                duplicate: true,
                ..first
            }
        );
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "150");
        let ttl: i64 = st.cli(&["TTL", &a.keys().idem]).parse().unwrap();
        assert!((590..=600).contains(&ttl), "{ttl}");
        assert!(st
            .cli(&["GET", &a.keys().idem])
            .starts_with("2 000000000000feed 1 req-1 "));
        // A later repeat reports the usage as it is now (another request charged 150 meanwhile).
        let mut other = base();
        other.request_id = "req-x".into();
        reserve(&st, &other).unwrap();
        a.request_id = "req-3".into();
        let third = reserve(&st, &a).unwrap();
        assert!(third.duplicate);
        assert_eq!(third.used_after, 300);
        assert_eq!(third.limit, first.limit);
    }

    fn idem_args(key: &str, rid: &str, fingerprint: u64) -> ReserveArgs {
        let mut a = base();
        a.idempotency_key = Some(key.into());
        a.idem_window_s = 600;
        a.request_id = rid.into();
        a.body_fingerprint = fingerprint;
        a
    }

    fn full_refund(a: &ReserveArgs, reserved: u64) -> SettleArgs {
        SettleArgs {
            keys: a.keys(),
            delta: -(reserved as i64),
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 60,
            release_idempotency: true,
        }
    }

    #[test]
    fn a_repeated_key_with_a_different_body_is_charged_and_leaves_the_record_alone() {
        let Some(st) = Stack::start() else { return };
        let first = idem_args("K", "req-1", 0xaaaa);
        assert!(!reserve(&st, &first).unwrap().duplicate);
        let record = st.cli(&["GET", &first.keys().idem]);
        let mut other = idem_args("K", "req-2", 0xbbbb);
        other.output_cost = 500;
        let r = reserve(&st, &other).unwrap();
        assert!(r.allowed && !r.duplicate, "{r:?}");
        assert_eq!(r.used_after, 150 + 600);
        assert_eq!(st.cli(&["GET", &first.keys().idem]), record, "untouched");
        // Over the limit it is refused like any request, not admitted as a duplicate.
        let mut big = idem_args("K", "req-3", 0xcccc);
        big.output_cost = 5_000;
        let r = reserve(&st, &big).unwrap();
        assert_eq!((r.allowed, r.reason), (false, Reason::TenantLimit));
        // The first body is still a (free) duplicate.
        let again = reserve(&st, &idem_args("K", "req-4", 0xaaaa)).unwrap();
        assert!(again.duplicate);
        assert_eq!(st.cli(&["GET", &first.keys().used_total]), "750");
    }

    #[test]
    fn free_repeats_of_one_key_are_bounded_then_charged() {
        let Some(st) = Stack::start() else { return };
        let a = idem_args("K", "req-0", 0xaaaa);
        let first = reserve(&st, &a).unwrap();
        assert!(!first.duplicate);
        let ttl0: i64 = st.cli(&["PTTL", &a.keys().idem]).parse().unwrap();
        for i in 1..=IDEMPOTENT_FREE_REPEATS {
            let r = reserve(&st, &idem_args("K", &format!("req-{i}"), 0xaaaa)).unwrap();
            assert_eq!(
                r,
                ReserveReply {
                    duplicate: true,
                    ..first
                },
                "repeat {i}"
            );
        }
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "150");
        let rec = st.cli(&["GET", &a.keys().idem]);
        assert_eq!(
            rec,
            format!("2 000000000000aaaa {IDEMPOTENT_FREE_REPEATS} req-0 1,150,1000,150,-1,0,50,0")
        );
        // Counting repeats never pushes the window forward.
        let ttl: i64 = st.cli(&["PTTL", &a.keys().idem]).parse().unwrap();
        assert!(ttl <= ttl0 && ttl > ttl0 - 5_000, "{ttl0} -> {ttl}");
        // Beyond the bound: charged like any request, the record stays as it is.
        for i in 1..=2u64 {
            let r = reserve(&st, &idem_args("K", &format!("req-x{i}"), 0xaaaa)).unwrap();
            assert!(r.allowed && !r.duplicate);
            assert_eq!(r.used_after, 150 + 150 * i);
        }
        assert_eq!(st.cli(&["GET", &a.keys().idem]), rec);
    }

    #[test]
    fn free_repeats_of_a_request_that_is_then_refunded_are_charged() {
        let Some(st) = Stack::start() else { return };
        // Two free repeats are served while the first request runs; then it fails (full refund).
        let a = idem_args("R", "req-1", 0xaaaa);
        let k = a.keys();
        reserve(&st, &a).unwrap();
        for rid in ["req-2", "req-3"] {
            let dup = reserve(&st, &idem_args("R", rid, 0xaaaa)).unwrap();
            assert!(dup.duplicate);
        }
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        assert!(settle(&st, &full_refund(&a, 150)).unwrap().applied);
        // The two repeats were served: each is charged the first one's reservation.
        assert_eq!(st.cli(&["GET", &k.used_total]), "300");
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        // The same through the batch script and through a reconciliation.
        let b = idem_args("S", "s-1", 0xaaaa);
        reserve(&st, &b).unwrap();
        reserve(&st, &idem_args("S", "s-2", 0xaaaa)).unwrap();
        let (status, body) = st.post(&settle_batch_request(
            &[&full_refund(&b, 150)],
            ScriptCall::Eval,
        ));
        assert_eq!(parse_settle_batch_reply(status, &body, 1).unwrap(), [1]);
        assert_eq!(st.cli(&["GET", &b.keys().used_total]), "450");
        let c = idem_args("T", "t-1", 0xaaaa);
        reserve(&st, &c).unwrap();
        reserve(&st, &idem_args("T", "t-2", 0xaaaa)).unwrap();
        let rec = ReconcileArgs {
            keys: c.keys(),
            actual: 0,
            expire_at_unix: c.expire_at_unix,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["GET", &c.keys().used_total]), "600");
    }

    #[test]
    fn a_fully_refunded_first_request_releases_its_key_so_the_retry_is_charged() {
        let Some(st) = Stack::start() else { return };
        let a = idem_args("K", "req-1", 0xaaaa);
        let k = a.keys();
        reserve(&st, &a).unwrap();
        // Another request with that key but another body is refunded in full: not its record.
        let other = idem_args("K", "req-2", 0xbbbb);
        reserve(&st, &other).unwrap();
        assert!(settle(&st, &full_refund(&other, 150)).unwrap().applied);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        // A partial refund (the request was served) keeps it.
        let mut partial = full_refund(&a, 40);
        partial.release_idempotency = false;
        let mut p2 = partial.clone();
        p2.keys = idem_args("K", "req-9", 0xaaaa).keys();
        settle(&st, &p2).unwrap();
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        // The owner's full refund deletes it; the retry (same body) is reserved and charged.
        assert!(settle(&st, &full_refund(&a, 150)).unwrap().applied);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        assert_eq!(st.cli(&["GET", &k.used_total]), "0"); // 150 + 150 - 150 - 40 - 150, floor 0
        let retry = reserve(&st, &idem_args("K", "req-3", 0xaaaa)).unwrap();
        assert!(retry.allowed && !retry.duplicate);
        assert_eq!(retry.used_after, 150);
        assert!(st
            .cli(&["GET", &k.idem])
            .starts_with("2 000000000000aaaa 0 req-3 "));
        // The same through the batch script, and through a reconciliation that charged nothing.
        let (status, body) = st.post(&settle_batch_request(
            &[&full_refund(&idem_args("K", "req-3", 0xaaaa), 150)],
            ScriptCall::Eval,
        ));
        assert_eq!(parse_settle_batch_reply(status, &body, 1).unwrap(), [1]);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        let b = idem_args("K", "req-4", 0xaaaa);
        reserve(&st, &b).unwrap();
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        let rec = ReconcileArgs {
            keys: b.keys(),
            actual: 0,
            expire_at_unix: b.expire_at_unix,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        assert_eq!(st.cli(&["GET", &k.used_total]), "0");
    }

    #[test]
    fn an_idempotency_record_in_another_format_never_makes_a_duplicate() {
        let Some(st) = Stack::start() else { return };
        let a = idem_args("K", "req-1", 0xaaaa);
        let k = a.keys();
        // What version 1 of the script stored (no fingerprint, no bound).
        st.cli(&["SET", &k.idem, "1,5,1000,5,-1,0,0,0 old-req", "EX", "600"]);
        let r = reserve(&st, &a).unwrap();
        assert!(r.allowed && !r.duplicate);
        assert_eq!(st.cli(&["GET", &k.idem]), "1,5,1000,5,-1,0,0,0 old-req");
        // A full refund by the request does not touch a record it did not write.
        settle(&st, &full_refund(&a, 150)).unwrap();
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        // A fingerprint that could break the record format is refused.
        let body = reserve_request(&a, ScriptCall::Eval).replace("/000000000000aaaa/", "/a%20b/");
        let (s, b) = st.post(&body);
        assert_eq!(
            parse_reserve_reply(s, &b),
            Err(ShimError::RedisError("ERR tokengate: bad argument".into()))
        );
    }

    #[test]
    fn clamping_grants_the_output_that_is_left_when_the_prompt_fits() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 800;
        a.output_cost = 0;
        reserve(&st, &a).unwrap();
        a.prompt_cost = 100;
        a.output_cost = 500;
        a.clamp_output = true;
        a.min_output_cost = 10;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.granted_output, r.used_after, r.reason),
            (true, 100, 1000, Reason::Clamped)
        );
        // Nothing left for output now: even a fitting prompt... is rejected (0 < min_output_cost).
        a.prompt_cost = 0;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.granted_output, r.reason),
            (false, 0, Reason::TenantLimit)
        );
    }

    #[test]
    fn clamping_never_admits_a_prompt_that_does_not_fit() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 1001;
        a.output_cost = 10;
        a.clamp_output = true;
        assert!(!reserve(&st, &a).unwrap().allowed);
        a.prompt_cost = 995;
        a.min_output_cost = 6;
        assert!(!reserve(&st, &a).unwrap().allowed, "5 left < min 6");
        a.min_output_cost = 5;
        assert_eq!(reserve(&st, &a).unwrap().granted_output, 5);
    }

    #[test]
    fn settlement_applies_once_per_request_id_and_never_goes_below_zero() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        reserve(&st, &a).unwrap(); // 150
        let mut s = SettleArgs {
            keys: a.keys(),
            delta: -40,
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 3600,
            release_idempotency: false,
        };
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: true,
                used_after: 110,
                model_used_after: 110
            }
        );
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: false,
                used_after: 110,
                model_used_after: 110
            }
        );
        s.keys = QuotaKeys::new("acme", Some("gpt-4.1"), "2026-11", None, "req-9");
        s.delta = -10_000;
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: true,
                used_after: 0,
                model_used_after: 0
            }
        );
        assert_eq!(st.cli(&["EXPIRETIME", &s.keys.used_total]), "1796688000");
        let ttl: i64 = st.cli(&["TTL", &s.keys.settled]).parse().unwrap();
        assert!((3590..=3600).contains(&ttl));
    }

    #[test]
    fn settlement_without_a_model_touches_only_the_tenant_counter() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.model = None;
        assert_eq!(reserve(&st, &a).unwrap().model_used_after, 0);
        let s = SettleArgs {
            keys: a.keys(),
            delta: 25,
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 60,
            release_idempotency: false,
        };
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: true,
                used_after: 175,
                model_used_after: 0
            }
        );
        assert_eq!(st.cli(&["EXISTS", &a.keys().used_model]), "0");
    }

    #[test]
    fn counts_near_two_to_the_fifty_three_stay_exact() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.default_limit = MAX_LUA_INT;
        a.prompt_cost = 4_000_000_000_000_000;
        a.output_cost = 123_456_789;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(r.used_after, 4_000_000_123_456_789);
        let s = SettleArgs {
            keys: a.keys(),
            delta: -3,
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 60,
            release_idempotency: false,
        };
        assert_eq!(settle(&st, &s).unwrap().used_after, 4_000_000_123_456_786);
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "4000000123456786");
    }

    #[test]
    fn awkward_tenant_model_and_ids_survive_webdis_encoding() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.tenant = "a/b+c d{x}%.json".into();
        a.model = Some("ft:gpt-4o:org/x.raw".into());
        a.request_id = "id.json".into();
        a.idempotency_key = Some("k+/ .raw".into());
        a.idem_window_s = 60;
        assert!(reserve(&st, &a).unwrap().allowed);
        let k = a.keys();
        assert_eq!(k.used_total, "tg:q:{a%2Fb%2Bc%20d%7Bx%7D%25.json}:2026-11");
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        assert_eq!(st.cli(&["GET", &k.used_model]), "150");
        assert_eq!(
            st.cli(&["GET", &k.idem]),
            "2 000000000000feed 0 id.json 1,150,1000,150,-1,0,50,0"
        );
        assert_eq!(
            st.cli(&["CLUSTER", "KEYSLOT", &k.used_total]),
            st.cli(&["CLUSTER", "KEYSLOT", &k.idem])
        );
    }

    #[test]
    fn evalsha_reports_noscript_until_an_eval_loads_the_script() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        st.cli(&["SCRIPT", "FLUSH"]);
        let (s, b) = st.post(&reserve_request(&a, ScriptCall::EvalSha));
        assert_eq!(parse_reserve_reply(s, &b), Err(ShimError::NoScript));
        let (s, b) = st.post(&settle_request(
            &SettleArgs {
                keys: a.keys(),
                delta: 1,
                expire_at_unix: 1,
                marker_ttl_s: 1,
                release_idempotency: false,
            },
            ScriptCall::EvalSha,
        ));
        assert_eq!(parse_settle_reply(s, &b), Err(ShimError::NoScript));
        assert!(reserve(&st, &a).unwrap().allowed); // EVAL
        let (s, b) = st.post(&reserve_request(&a, ScriptCall::EvalSha));
        assert_eq!(parse_reserve_reply(s, &b).unwrap().used_after, 300);
    }

    #[test]
    fn webdis_acl_denial_is_forbidden() {
        let Some(mut st) = Stack::start() else { return };
        let port = st.start_acl_webdis();
        let (s, b) = post_to(port, &reserve_request(&base(), ScriptCall::Eval));
        assert_eq!(parse_reserve_reply(s, &b), Err(ShimError::Forbidden));
    }

    #[test]
    fn redis_down_behind_webdis_is_unavailable() {
        let Some(mut st) = Stack::start() else { return };
        st.redis = None; // kills redis-server by PID
        let (s, b) = st.post(&reserve_request(&base(), ScriptCall::Eval));
        assert_eq!(
            parse_reserve_reply(s, &b),
            Err(ShimError::Unavailable),
            "{s} {:?}",
            String::from_utf8_lossy(&b)
        );
    }

    #[test]
    fn a_mismatched_protocol_tag_is_refused_by_the_script() {
        let Some(st) = Stack::start() else { return };
        let body = reserve_request(&base(), ScriptCall::Eval).replace("/tg1", "/tg0");
        let (s, b) = st.post(&body);
        assert_eq!(
            parse_reserve_reply(s, &b),
            Err(ShimError::RedisError(
                "ERR tokengate: protocol mismatch".into()
            ))
        );
    }

    #[test]
    fn print_one_real_exchange() {
        let Some(st) = Stack::start() else { return };
        let body = reserve_request(&base(), ScriptCall::EvalSha);
        let _ = reserve(&st, &base());
        let (s, b) = st.post(&body);
        eprintln!(
            "REQUEST POST / body ({} bytes):\n{body}\nRESPONSE {s}: {}",
            body.len(),
            String::from_utf8_lossy(&b)
        );
    }
}
