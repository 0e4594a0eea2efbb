//! The operator's writes and the lease view: `override set|clear|list`, `month give-back`, `leases`.
//!
//! * An override is the key the quota scripts already read before the configured limit:
//!   `tg:q:{<account>}:limit` (and `…:limit:m:<model>` for a tenant's model limit); it holds a whole
//!   number in the account's base unit (weighted tokens, or micro-units for a money budget) and has no
//!   expiry (it applies every month until cleared). A tenant already refused is served again after
//!   `quota.exhausted_recheck_s` (Envoy's exhausted marker).
//! * A give-back lowers the month's counters of one account to what leases and reservations in flight
//!   hold in them, in one script on the account's slot: usage settled so far is forgotten, while what
//!   Envoys hold and requests in flight reserved stays counted, so their later settlements and lease
//!   reports still add up.

use crate::accounts::{self, AccountId, Kind};
use crate::fail::Failure;
use crate::store::{as_i64, as_pairs, as_string, Store};
use redis::Cmd;
use tokengate::config::{Config, Scope};

/// Which account an operator names.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// The tenant (its token quota; with `budget`, the subject of a tenant-scope budget).
    pub tenant: Option<String>,
    /// A budget's name.
    pub budget: Option<String>,
    /// Group values, `level=value` (or a bare value for the one level of `group_header`).
    pub groups: Vec<String>,
}

/// False for a `key:` tenant that is not what a hashed API key names (`key:` + 16 lower-case hex
/// digits): no request is ever charged to it.
fn hashed_form(tenant: &str) -> bool {
    match tenant.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("key:") => tenant.get(4..).is_some_and(|h| {
            tenant.starts_with("key:")
                && h.len() == 16
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }),
        _ => true,
    }
}

/// The account `t` names under `cfg`, and the unit its amounts are in.
pub fn account(cfg: &Config, t: &Target) -> Result<(AccountId, crate::usage::Unit), Failure> {
    let q = cfg.quota.as_ref().ok_or_else(|| {
        Failure::mismatch("the configuration has no quota section: no account to name")
    })?;
    let Some(bname) = &t.budget else {
        let tenant = t.tenant.as_deref().ok_or_else(|| {
            Failure::input(
                "name the account: --tenant T (a token quota), or --budget B with its subject",
            )
        })?;
        if !tokengate::identity::valid_tenant(tenant) || !hashed_form(tenant) {
            return Err(Failure::input(format!(
                "{tenant:?} is not a tenant id (1 to {} of A-Z a-z 0-9 . _ : @ -; a `key:` tenant is \
                 `key:` and 16 lower-case hex digits): no request is ever charged to it",
                tokengate::identity::MAX_TENANT_LEN
            )));
        }
        if q.tenant(tenant).monthly_limit == 0 {
            return Err(Failure::mismatch(format!(
                "tenant {tenant:?} has no token quota in this configuration (no quota.monthly_limit): \
                 did you mean one of its budgets (--budget)?"
            )));
        }
        return Ok((AccountId::from_id(tenant), crate::usage::Unit::Tokens));
    };
    let b = q
        .budgets
        .list
        .iter()
        .find(|b| &b.name == bname)
        .ok_or_else(|| {
            let known: Vec<&str> = q.budgets.list.iter().map(|b| b.name.as_str()).collect();
            Failure::mismatch(format!(
                "no budget {bname:?} in this configuration (it defines {known:?})"
            ))
        })?;
    let levels = &cfg.groups;
    let tenant = t.tenant.clone().unwrap_or_default();
    if !tenant.is_empty() && (!tokengate::identity::valid_tenant(&tenant) || !hashed_form(&tenant))
    {
        return Err(Failure::input(format!("{tenant:?} is not a tenant id")));
    }
    let groups = crate::explain::groups(cfg, &tenant, &t.groups)?;
    match b.scope {
        Scope::Tenant if tenant.is_empty() => {
            return Err(Failure::input(format!(
                "budget {bname:?} is per tenant: add --tenant T"
            )))
        }
        Scope::Group(l) if groups.get(l).is_none_or(Option::is_none) => {
            return Err(Failure::input(format!(
                "budget {bname:?} is per {}: add --group {}=VALUE (and its outer levels)",
                b.scope.as_str(levels),
                b.scope.as_str(levels)
            )))
        }
        _ => {}
    }
    let unit = if b.tokens {
        crate::usage::Unit::Tokens
    } else {
        crate::usage::Unit::Money(q.budgets.currency.clone())
    };
    Ok((
        AccountId::from_id(&b.account(&tenant, levels, &groups)),
        unit,
    ))
}

/// Parses an amount in `unit` into base units: whole tokens, or a decimal of the currency to at most 6
/// places (exact: no binary floating point).
pub fn parse_amount(s: &str, unit: &crate::usage::Unit) -> Result<i64, Failure> {
    let bad = |why: &str| Failure::input(format!("--limit {s:?}: {why}"));
    let max = 9_007_199_254_740_991i64;
    let v = match unit {
        crate::usage::Unit::Tokens => s
            .parse::<i64>()
            .map_err(|_| bad("a whole number of tokens"))?,
        crate::usage::Unit::Money(c) => {
            let (int, frac) = s.split_once('.').unwrap_or((s, ""));
            if int.is_empty() && frac.is_empty()
                || !int.bytes().all(|b| b.is_ascii_digit())
                || !frac.bytes().all(|b| b.is_ascii_digit())
                || frac.len() > 6
            {
                return Err(bad(&format!(
                    "an amount of {c} with at most 6 decimals (micro-units)"
                )));
            }
            let i: i64 = if int.is_empty() {
                0
            } else {
                int.parse().map_err(|_| bad("too large"))?
            };
            let f: i64 = format!("{frac:0<6}").parse().unwrap_or(0);
            i.checked_mul(1_000_000)
                .and_then(|x| x.checked_add(f))
                .ok_or_else(|| bad("too large"))?
        }
    };
    if !(0..=max).contains(&v) {
        return Err(bad("must be between 0 and 2^53 - 1 base units"));
    }
    Ok(v)
}

/// `override set`: writes the override, returns what the line says.
pub fn override_set(
    store: &mut Store,
    cfg: &Config,
    t: &Target,
    model: Option<&str>,
    limit: &str,
) -> Result<String, Failure> {
    let (a, unit) = account(cfg, t)?;
    let key = limit_key(&a, model)?;
    let v = parse_amount(limit, &unit)?;
    let before: Option<String> = store.query(redis::cmd("GET").arg(&key))?;
    store.query::<()>(redis::cmd("SET").arg(&key).arg(v))?;
    let recheck = cfg.quota.as_ref().map_or(60, |q| q.exhausted_recheck_s);
    Ok(format!(
        "{key}: {} -> {} {} (a tenant refused for this limit is served again within {recheck} s)",
        before
            .and_then(|b| b.parse::<i64>().ok())
            .map_or("(configured)".to_string(), |b| unit.amount(b)),
        unit.amount(v),
        unit.name()
    ))
}

/// `override clear`.
pub fn override_clear(
    store: &mut Store,
    cfg: &Config,
    t: &Target,
    model: Option<&str>,
) -> Result<String, Failure> {
    let (a, _) = account(cfg, t)?;
    let key = limit_key(&a, model)?;
    let n: i64 = store.query(redis::cmd("DEL").arg(&key))?;
    Ok(if n == 0 {
        format!("{key}: no override (the configured limit applies)")
    } else {
        format!("{key}: override removed (the configured limit applies)")
    })
}

fn limit_key(a: &AccountId, model: Option<&str>) -> Result<String, Failure> {
    match model {
        None => Ok(format!("{}:limit", a.prefix())),
        Some(_) if a.kind != Kind::Tenant => Err(Failure::input(
            "--model: budgets have no per-model limits (only a tenant's token quota has)",
        )),
        Some(m) => Ok(format!(
            "{}:limit:m:{}",
            a.prefix(),
            tokengate::store::keys::sanitize(m)
        )),
    }
}

/// `override list`: every override in Redis, with the configured limit beside it when a configuration
/// is given.
pub fn override_list(store: &mut Store, cfg: Option<&Config>) -> Result<Vec<Vec<String>>, Failure> {
    let keys = store.scan(&format!("{}{{*}}:limit*", tokengate::store::keys::QUOTA))?;
    let keys: Vec<String> = keys
        .into_iter()
        .filter(|k| {
            accounts::split_key(k)
                .is_some_and(|(_, rest)| rest == "limit" || rest.starts_with("limit:m:"))
        })
        .collect();
    let cmds: Vec<Cmd> = keys
        .iter()
        .map(|k| {
            let mut c = redis::cmd("GET");
            c.arg(k);
            c
        })
        .collect();
    let vals = store.batch(&cmds)?;
    let mut rows = vec![vec![
        "ACCOUNT".to_string(),
        "MODEL".into(),
        "OVERRIDE".into(),
        "CONFIGURED".into(),
        "UNIT".into(),
        "KEY".into(),
    ]];
    for (k, v) in keys.iter().zip(vals.iter()) {
        let Some((enc, rest)) = accounts::split_key(k) else {
            continue;
        };
        let a = AccountId::from_encoded(enc);
        let model = rest
            .strip_prefix("limit:m:")
            .map(accounts::percent_decode)
            .unwrap_or_default();
        let Some(val) = accounts::count(k, v)? else {
            continue;
        };
        let (unit, configured) = match cfg.and_then(|c| c.quota.as_ref().map(|q| (c, q))) {
            Some((_c, q)) => {
                let unit = match q.budget_of(&a.id) {
                    Some((_, b)) if !b.tokens => {
                        crate::usage::Unit::Money(q.budgets.currency.clone())
                    }
                    _ => crate::usage::Unit::Tokens,
                };
                let conf = if model.is_empty() {
                    Some(q.account_limit(&a.id))
                } else {
                    q.tenant(&a.id)
                        .model_limits
                        .iter()
                        .find(|(m, _)| *m == model)
                        .map(|(_, l)| *l)
                };
                let conf = conf.and_then(|c| i64::try_from(c).ok());
                (unit, conf)
            }
            None => (crate::usage::Unit::Tokens, None),
        };
        let unit_name = if cfg.is_some() {
            unit.name().to_string()
        } else {
            "base units".to_string()
        };
        rows.push(vec![
            a.label(),
            model,
            unit.amount(val),
            configured.map(|c| unit.amount(c)).unwrap_or_default(),
            unit_name,
            k.clone(),
        ]);
    }
    Ok(rows)
}

/// The script of a give-back: each counter in KEYS (but the 2nd, the leases hash, and the 3rd, the
/// reservations in flight) is lowered to what leases and reservations counted in it still hold.
/// Reply: `[before, after]` per counter.
const GIVE_BACK: &str = r#"
local function held_in(key)
  local s = 0
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all - 1, 2 do
    local o, lu, lm = string.match(all[i + 1], '^(%d+) %d+ %d+ (%S+) (%S+)$')
    if o and (lu == key or lm == key) then s = s + tonumber(o) end
  end
  local op = redis.call('HGETALL', KEYS[3])
  for i = 1, #op - 1, 2 do
    local a, ru, rm = string.match(op[i + 1], '^(%d+) %d+ (%S+) (%S+)$')
    if a and (ru == key or rm == key) then s = s + tonumber(a) end
  end
  return s
end
local out = {}
for i, k in ipairs(KEYS) do
  if i ~= 2 and i ~= 3 then
    local v = tonumber(redis.call('GET', k) or '0')
    if not v then return redis.error_reply('tokengate: not a count at ' .. k) end
    local keep = held_in(k)
    if keep < v then redis.call('SET', k, string.format('%d', keep), 'KEEPTTL') end
    out[#out + 1] = v
    out[#out + 1] = math.min(keep, v)
  end
end
return out
"#;

/// `month give-back`: returns one line per counter (before → after).
pub fn give_back(
    store: &mut Store,
    cfg: &Config,
    t: &Target,
    month: &str,
) -> Result<Vec<String>, Failure> {
    let (a, unit) = account(cfg, t)?;
    let counter = a.counter(month);
    let models = store.scan(&format!("{counter}:m:*"))?;
    let p = a.prefix();
    let mut keys = vec![counter.clone(), format!("{p}:leases"), format!("{p}:open")];
    keys.extend(models.iter().cloned());
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(GIVE_BACK).arg(keys.len());
    for k in &keys {
        cmd.arg(k);
    }
    let v: redis::Value = store.query(&cmd)?;
    let nums: Vec<i64> = match &v {
        redis::Value::Array(a) => a.iter().filter_map(as_i64).collect(),
        _ => Vec::new(),
    };
    let counters: Vec<&String> = std::iter::once(&counter).chain(models.iter()).collect();
    let mut out = Vec::new();
    for (k, pair) in counters.iter().zip(nums.chunks(2)) {
        if let [before, after] = pair {
            out.push(format!(
                "{k}: {} -> {} {} (kept: what leases and requests in flight hold)",
                unit.amount(*before),
                unit.amount(*after),
                unit.name()
            ));
        }
    }
    let recheck = cfg.quota.as_ref().map_or(60, |q| q.exhausted_recheck_s);
    out.push(format!(
        "a tenant refused this month is served again within {recheck} s (quota.exhausted_recheck_s)"
    ));
    Ok(out)
}

/// `leases`: every quota lease Envoys hold, as table rows.
pub fn leases(
    store: &mut Store,
    cfg: Option<&Config>,
    tenant: Option<&str>,
) -> Result<Vec<Vec<String>>, Failure> {
    let keys = store.scan(&format!("{}{{*}}:leases", tokengate::store::keys::QUOTA))?;
    let cmds: Vec<Cmd> = keys.iter().map(Cmd::hgetall).collect();
    let vals = store.batch(&cmds)?;
    let mut all = Vec::new();
    for (k, v) in keys.iter().zip(vals.iter()) {
        let Some((enc, _)) = accounts::split_key(k) else {
            continue;
        };
        let a = AccountId::from_encoded(enc);
        if let Some(t) = tenant {
            let mine = match &a.kind {
                Kind::Tenant => a.id == t,
                Kind::Budget { subject, .. } => subject == t,
            };
            if !mine {
                continue;
            }
        }
        for (f, val) in as_pairs(v) {
            let mut l = accounts::parse_lease(k, &f, &val)?;
            let due_key = format!("{}:due", a.prefix());
            let due: Option<redis::Value> =
                Some(store.query(redis::cmd("ZSCORE").arg(&due_key).arg(&f))?);
            l.due = due
                .as_ref()
                .and_then(as_string)
                .and_then(|s| s.parse::<f64>().ok())
                .map(|x| x as i64);
            all.push((a.clone(), f, l));
        }
    }
    let ttl = cfg
        .and_then(|c| c.quota.as_ref())
        .and_then(|q| q.lease.map(|l| l.ttl_s))
        .and_then(|t| i64::try_from(t).ok());
    let mut rows = vec![vec![
        "ACCOUNT".to_string(),
        "MODEL".into(),
        "ENVOY".into(),
        "MONTH".into(),
        "HELD".into(),
        "REPORTED".into(),
        "SINCE (UTC, ≈)".into(),
        "LAST SYNC (UTC)".into(),
        "RESOLVED AT (UTC)".into(),
    ]];
    for (a, _f, l) in all {
        let unit = cfg
            .and_then(|c| c.quota.as_ref())
            .and_then(|q| q.budget_of(&a.id))
            .map_or(crate::usage::Unit::Tokens, |(_, b)| {
                if b.tokens {
                    crate::usage::Unit::Tokens
                } else {
                    crate::usage::Unit::Money(
                        cfg.and_then(|c| c.quota.as_ref())
                            .map(|q| q.budgets.currency.clone())
                            .unwrap_or_default(),
                    )
                }
            });
        rows.push(vec![
            a.label(),
            l.model.clone(),
            l.envoy.clone(),
            l.month.clone(),
            format!("{} {}", unit.amount(l.held), unit.name()),
            unit.amount(l.reported),
            utc(l.version.div_euclid(1000)),
            match (l.due, ttl) {
                (Some(d), Some(t)) => utc(d - t),
                _ => String::from("?"),
            },
            l.due.map(utc).unwrap_or_default(),
        ]);
    }
    Ok(rows)
}

/// `2026-12-03T10:04:05Z`.
pub fn utc(unix_s: i64) -> String {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Unit;

    #[test]
    fn amounts_parse_exactly_in_their_unit() {
        let usd = Unit::Money("USD".into());
        assert_eq!(parse_amount("12.5", &usd).unwrap(), 12_500_000);
        assert_eq!(parse_amount("0.000001", &usd).unwrap(), 1);
        assert_eq!(parse_amount(".5", &usd).unwrap(), 500_000);
        assert!(parse_amount("1.0000001", &usd).is_err());
        assert!(parse_amount("-1", &usd).is_err());
        assert!(parse_amount("1e3", &usd).is_err());
        assert_eq!(parse_amount("100000", &Unit::Tokens).unwrap(), 100_000);
        assert!(parse_amount("1.5", &Unit::Tokens).is_err());
        assert!(parse_amount("9007199254740992", &Unit::Tokens).is_err());
    }

    #[test]
    fn utc_times_cross_years_and_leap_days() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_709_164_800), "2024-02-29T00:00:00Z");
        assert_eq!(utc(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn a_key_tenant_is_named_only_in_the_form_a_hashed_key_gives() {
        assert!(hashed_form("key:0123456789abcdef"));
        assert!(hashed_form("alice@example.com"));
        for bad in [
            "key:abc",
            "KEY:0123456789abcdef",
            "key:0123456789ABCDEF",
            "key:0123456789abcdefa",
        ] {
            assert!(!hashed_form(bad), "{bad}");
        }
    }

    #[test]
    fn accounts_are_named_as_the_filter_names_them() {
        let cfg = tokengate::config::parse(
            br#"{"groups": [{"name": "org", "header": "x-org"}, {"name": "team", "header": "x-team"}], "trusted_headers": {"set_by": "the test"},
                "rules": [{"tokens_per_second": 1, "burst": 1}],
                "quota": {"cluster": "w", "monthly_limit": 1, "currency": "USD",
                  "prices": {"*": {"input": 1, "output": 1}},
                  "budgets": [{"name": "t", "scope": "team", "monthly_limit": 5},
                              {"name": "s", "scope": "shared", "monthly_limit": 5}]}}"#,
        )
        .unwrap();
        let t = |budget: &str, groups: &[&str]| Target {
            tenant: None,
            budget: Some(budget.into()),
            groups: groups.iter().map(|s| s.to_string()).collect(),
        };
        let (a, u) = account(&cfg, &t("t", &["org=acme", "team=red"])).unwrap();
        assert_eq!(a.id, "~b:t:org=acme/team=red");
        assert_eq!(u, Unit::Money("USD".into()));
        let (a, _) = account(&cfg, &t("t", &["team=red"])).unwrap();
        assert_eq!(
            a.id, "~b:t:org=-/team=red",
            "a missing outer level is '-', as the filter writes it"
        );
        assert_eq!(account(&cfg, &t("s", &[])).unwrap().0.id, "~b:s:~all");
        assert_eq!(account(&cfg, &t("t", &[])).unwrap_err().code, 2);
        assert_eq!(account(&cfg, &t("nope", &[])).unwrap_err().code, 5);
        assert_eq!(account(&cfg, &t("t", &["red"])).unwrap_err().code, 2);
    }
}
