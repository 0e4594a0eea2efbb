//! The quota accounts of one month, read from Redis through the filter's own key layout
//! ([`tokengate::quota::QuotaKeys`], [`tokengate::store::keys::sanitize`]):
//!
//! ```text
//! tg:q:{alice}:2026-12                    a tenant's token quota: weighted tokens used this month
//! tg:q:{alice}:2026-12:m:gpt-4.1          the same, one model
//! tg:q:{alice}:2026-12:io                 hash: the provider's input/output tokens settled this month:
//!                                         in, out, in:<model>, out:<model> (absent: written by 0.1.x),
//!                                         and per lease L|<envoy>|<model>|<month> -> "<in> <out>" taken
//!                                         (not counts: skipped)
//! tg:q:{%7Eb:team-spend:team%3Dred}:2026-12   budget team-spend of team red: micro-units (or tokens)
//! tg:q:{…}:limit, …:limit:m:<model>       operator overrides of the limits
//! tg:q:{…}:leases                         "L|<envoy>|<model>|<month>" -> "<held> <reported> <version> <counter> <model counter|->"
//! tg:q:{…}:open                           request id -> "<amount> <min> <counter> <model counter|->"
//! ```
//!
//! A counter holds what was settled **plus** what Envoys' leases hold and what requests in flight
//! reserved (both counted when granted); the report shows the three apart, so `settled = used −
//! in_leases − in_flight` is exact against the counters at the moment they were read.

use crate::fail::Failure;
use crate::store::{as_i64, as_pairs, Store};
use redis::Cmd;
use std::collections::BTreeMap;
use tokengate::store::keys::sanitize;

/// Whose account it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A tenant's token quota (weighted tokens).
    Tenant,
    /// A budget's account: `~b:<budget>:<subject>`.
    Budget {
        /// The budget's name.
        name: String,
        /// A tenant id, a group path (`team=red`, `org=acme/team=red`) or `~all` (shared).
        subject: String,
    },
}

/// A quota account as Redis names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AccountId {
    /// The account id the filter uses (`alice`, `~b:team-spend:team=red`), decoded.
    pub id: String,
    /// Its encoded form inside the key's hash tag.
    pub encoded: String,
    /// The encoded form was cut (over 128 bytes): `id` is the readable start only.
    pub cut: bool,
    /// Tenant or budget.
    pub kind: Kind,
}

impl AccountId {
    /// From the encoded part of a key (`alice%40example.com`).
    pub fn from_encoded(encoded: &str) -> AccountId {
        let cut = encoded.contains('~') && encoded != "~";
        let readable = encoded.split('~').next().unwrap_or("");
        let id = if encoded == "~" {
            String::new()
        } else {
            percent_decode(readable)
        };
        let kind = match id.strip_prefix("~b:") {
            Some(rest) => {
                let (name, subject) = rest.split_once(':').unwrap_or((rest, ""));
                Kind::Budget {
                    name: name.to_string(),
                    subject: subject.to_string(),
                }
            }
            None => Kind::Tenant,
        };
        AccountId {
            id,
            encoded: encoded.to_string(),
            cut,
            kind,
        }
    }

    /// From an account id as the filter builds it.
    pub fn from_id(id: &str) -> AccountId {
        let mut a = AccountId::from_encoded(&sanitize(id));
        a.id = id.to_string();
        a
    }

    /// `tg:q:{<encoded>}`.
    pub fn prefix(&self) -> String {
        format!("{}{{{}}}", tokengate::store::keys::QUOTA, self.encoded)
    }

    /// The counter key of `month`.
    pub fn counter(&self, month: &str) -> String {
        format!("{}:{}", self.prefix(), sanitize(month))
    }

    /// The counter key of `month` and one model (encoded).
    pub fn model_counter(&self, month: &str, model_enc: &str) -> String {
        format!("{}:m:{model_enc}", self.counter(month))
    }

    /// The account as people read it: the tenant id, or `budget:subject`.
    pub fn label(&self) -> String {
        let s = match &self.kind {
            Kind::Tenant => self.id.clone(),
            Kind::Budget { name, subject } => format!("{name}:{subject}"),
        };
        if self.cut {
            format!("{s}…(cut: {})", self.encoded)
        } else {
            s
        }
    }
}

/// `%XX` back to bytes (the inverse of the filter's key encoding for values that were not cut).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(x) = hex {
                out.push(x);
                i += 3;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

/// One Envoy's lease of an account.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// The Envoy's id (hex), from the field `L|<envoy>|<model>|<month>`.
    pub envoy: String,
    /// The model (decoded), `-` for a lease of the whole account.
    pub model: String,
    /// The month of the lease.
    pub month: String,
    /// What it holds (counted in the counters, not spent yet).
    pub held: i64,
    /// What its Envoy reported spending from it so far.
    pub reported: i64,
    /// Its version: milliseconds since the epoch when it was first granted, plus one per sync.
    pub version: i64,
    /// The counter key it is counted in.
    pub counter: String,
    /// The model counter key, if any.
    pub model_counter: Option<String>,
    /// When Redis resolves it if no sync renews it (unix s), from the `due` sorted set.
    pub due: Option<i64>,
}

/// Parses one lease entry of `tg:q:{…}:leases`.
pub fn parse_lease(key: &str, field: &str, value: &str) -> Result<Lease, Failure> {
    let bad = || {
        Failure::schema(format!(
            "{key} field {field:?} holds {value:?}, not \"<held> <reported> <version> <counter> <model counter>\": \
             keys of another tokengate version?"
        ))
    };
    let f: Vec<&str> = field.split('|').collect();
    let v: Vec<&str> = value.split(' ').collect();
    let (["L", envoy, model, month], [held, reported, version, counter, mc]) =
        (f.as_slice(), v.as_slice())
    else {
        return Err(bad());
    };
    let num = |s: &str| s.parse::<i64>().map_err(|_| bad());
    Ok(Lease {
        envoy: (*envoy).to_string(),
        model: percent_decode(model),
        month: percent_decode(month),
        held: num(held)?,
        reported: num(reported)?,
        version: num(version)?,
        counter: (*counter).to_string(),
        model_counter: (*mc != "-").then(|| (*mc).to_string()),
        due: None,
    })
}

/// One reservation in flight, from `tg:q:{…}:open`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    /// What it holds in the counters.
    pub amount: i64,
    /// The counter key.
    pub counter: String,
    /// The model counter key, if any.
    pub model_counter: Option<String>,
}

fn parse_open(key: &str, field: &str, value: &str) -> Result<Reservation, Failure> {
    let v: Vec<&str> = value.split(' ').collect();
    let bad = || {
        Failure::schema(format!(
            "{key} field {field:?} holds {value:?}, not \"<amount> <min> <counter> <model counter>\": \
             keys of another tokengate version?"
        ))
    };
    let [amount, min, counter, mc] = v.as_slice() else {
        return Err(bad());
    };
    min.parse::<i64>().map_err(|_| bad())?;
    Ok(Reservation {
        amount: amount.parse().map_err(|_| bad())?,
        counter: (*counter).to_string(),
        model_counter: (*mc != "-").then(|| (*mc).to_string()),
    })
}

/// One counter and what is inside it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Amounts {
    /// The counter's value.
    pub used: i64,
    /// What leases counted in it hold.
    pub in_leases: i64,
    /// What reservations in flight counted in it hold.
    pub in_flight: i64,
    /// The operator's override of its limit, if any.
    pub limit_override: Option<i64>,
    /// The provider's input tokens settled (`in` of the month's `:io` hash); `None` when Redis holds
    /// no split for it (a month counted by 0.1.x, or no provider usage settled yet).
    pub tokens_in: Option<i64>,
    /// The provider's output tokens settled (`out`); `None` as for `tokens_in`.
    pub tokens_out: Option<i64>,
}

/// `a + b` where either is known (an unknown side adds nothing); `None` when neither is.
pub fn add_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
    }
}

impl Amounts {
    /// What was settled: the counter less leases held and reservations in flight.
    pub fn settled(&self) -> i64 {
        self.used - self.in_leases - self.in_flight
    }
}

/// An account's month.
#[derive(Debug, Clone, PartialEq)]
pub struct Month {
    /// The account.
    pub account: AccountId,
    /// The account's counter.
    pub total: Amounts,
    /// Per model counter (decoded model name → amounts).
    pub models: BTreeMap<String, Amounts>,
    /// The leases of the account (of this month's counters).
    pub leases: Vec<Lease>,
}

/// Parses `tg:q:{<enc>}:<rest>` into the encoded account and the rest.
pub fn split_key(key: &str) -> Option<(&str, &str)> {
    let inner = key
        .strip_prefix(tokengate::store::keys::QUOTA)?
        .strip_prefix('{')?;
    let close = inner.find("}:")?;
    Some((inner.get(..close)?, inner.get(close + 2..)?))
}

/// Every account with a counter in `month`, with its model counters, leases, reservations in flight and
/// overrides, read in a few pipelined round trips.
pub fn read_month(store: &mut Store, month: &str) -> Result<Vec<Month>, Failure> {
    let month_enc = sanitize(month);
    let keys = store.scan(&format!(
        "{}{{*}}:{month_enc}*",
        tokengate::store::keys::QUOTA
    ))?;
    // encoded account -> encoded models
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in &keys {
        let Some((enc, rest)) = split_key(k) else {
            continue;
        };
        if rest == month_enc {
            found.entry(enc.to_string()).or_default();
        } else if let Some(m) = rest
            .strip_prefix(month_enc.as_str())
            .and_then(|r| r.strip_prefix(":m:"))
        {
            found
                .entry(enc.to_string())
                .or_default()
                .push(m.to_string());
        }
    }
    let mut cmds = Vec::new();
    for (enc, models) in &found {
        let a = AccountId::from_encoded(enc);
        let p = a.prefix();
        cmds.push(get(&a.counter(month)));
        cmds.push(get(&format!("{p}:limit")));
        cmds.push(Cmd::hgetall(format!("{p}:leases")));
        cmds.push(Cmd::hgetall(format!("{p}:open")));
        cmds.push(Cmd::hgetall(format!("{}:io", a.counter(month))));
        for m in models {
            cmds.push(get(&a.model_counter(month, m)));
            cmds.push(get(&format!("{p}:limit:m:{m}")));
        }
    }
    let replies = store.batch(&cmds)?;
    let mut it = replies.iter();
    let mut next = || it.next().cloned().unwrap_or(redis::Value::Nil);
    let mut out = Vec::with_capacity(found.len());
    for (enc, models) in &found {
        let account = AccountId::from_encoded(enc);
        let p = account.prefix();
        let counter = account.counter(month);
        let used = count(&counter, &next())?.unwrap_or(0);
        let limit_override = count(&format!("{p}:limit"), &next())?;
        let lease_pairs = as_pairs(&next());
        let open_pairs = as_pairs(&next());
        let io_key = format!("{counter}:io");
        let io = parse_io(&io_key, &as_pairs(&next()))?;
        let mut total = Amounts {
            used,
            limit_override,
            tokens_in: io.get("in").copied(),
            tokens_out: io.get("out").copied(),
            ..Amounts::default()
        };
        let mut per_model: BTreeMap<String, Amounts> = BTreeMap::new();
        let mut by_key: BTreeMap<String, String> = BTreeMap::new();
        for m in models {
            let key = account.model_counter(month, m);
            let used = count(&key, &next())?.unwrap_or(0);
            let limit_override = count(&format!("{p}:limit:m:{m}"), &next())?;
            let name = percent_decode(m);
            by_key.insert(key, name.clone());
            per_model.insert(
                name,
                Amounts {
                    used,
                    limit_override,
                    tokens_in: io.get(&format!("in:{m}")).copied(),
                    tokens_out: io.get(&format!("out:{m}")).copied(),
                    ..Amounts::default()
                },
            );
        }
        let mut leases = Vec::new();
        for (f, v) in &lease_pairs {
            let l = parse_lease(&format!("{p}:leases"), f, v)?;
            if l.counter != counter {
                continue;
            }
            total.in_leases += l.held;
            if let Some(m) = l.model_counter.as_ref().and_then(|k| by_key.get(k)) {
                if let Some(a) = per_model.get_mut(m) {
                    a.in_leases += l.held;
                }
            }
            leases.push(l);
        }
        for (f, v) in &open_pairs {
            let r = parse_open(&format!("{p}:open"), f, v)?;
            if r.counter != counter {
                continue;
            }
            total.in_flight += r.amount;
            if let Some(m) = r.model_counter.as_ref().and_then(|k| by_key.get(k)) {
                if let Some(a) = per_model.get_mut(m) {
                    a.in_flight += r.amount;
                }
            }
        }
        out.push(Month {
            account,
            total,
            models: per_model,
            leases,
        });
    }
    Ok(out)
}

/// The fields of a month's input/output hash, each a whole number (else a schema error).
/// The counts of a month's `:io` hash: `in`, `out`, `in:<model>`, `out:<model>`. The fields of leases
/// (`L|<envoy>|<model>|<month>` → `"<in> <out>"`: what the lease script took of each lease, not a count
/// of the account) are left out.
fn parse_io(key: &str, pairs: &[(String, String)]) -> Result<BTreeMap<String, i64>, Failure> {
    pairs
        .iter()
        .filter(|(f, _)| !f.starts_with("L|"))
        .map(|(f, v)| {
            v.parse::<i64>().map(|n| (f.clone(), n)).map_err(|_| {
                Failure::schema(format!(
                    "{key} field {f:?} holds {v:?}, not a whole number: keys of another tokengate version?"
                ))
            })
        })
        .collect()
}

fn get(key: &str) -> Cmd {
    let mut c = redis::cmd("GET");
    c.arg(key);
    c
}

/// A counter's value: `None` when absent; a schema error when it is not a whole number.
pub fn count(key: &str, v: &redis::Value) -> Result<Option<i64>, Failure> {
    match v {
        redis::Value::Nil => Ok(None),
        other => as_i64(other).map(Some).ok_or_else(|| {
            Failure::schema(format!(
                "{key} holds {other:?}, not a whole number: keys of another tokengate version?"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_ids_decode_tenants_and_budgets() {
        let a = AccountId::from_encoded("alice%40example.com");
        assert_eq!(a.id, "alice@example.com");
        assert_eq!(a.kind, Kind::Tenant);
        let b = AccountId::from_encoded("%7Eb:team-spend:org%3Dacme%2Fteam%3Dred");
        assert_eq!(
            b.kind,
            Kind::Budget {
                name: "team-spend".into(),
                subject: "org=acme/team=red".into()
            }
        );
        assert_eq!(b.label(), "team-spend:org=acme/team=red");
        assert_eq!(
            AccountId::from_id("~b:x:~all").counter("2026-12"),
            "tg:q:{%7Eb:x:%7Eall}:2026-12"
        );
        let long = "a@".repeat(100);
        let c = AccountId::from_id(&long);
        assert!(c.cut && c.encoded.len() <= 128);
        assert_eq!(c.id, long, "an id given whole stays whole");
    }

    #[test]
    fn the_io_hash_gives_its_counts_and_skips_what_leases_took() {
        let p = |f: &str, v: &str| (f.to_string(), v.to_string());
        let io = parse_io(
            "k:io",
            &[
                p("in", "70"),
                p("out", "30"),
                p("in:gpt-4.1", "70"),
                p("L|ab|gpt-4.1|2026-12", "70 30"),
                p("L|ab|-|2026-12", "0 0"),
            ],
        )
        .unwrap();
        assert_eq!(
            io.into_iter().collect::<Vec<_>>(),
            vec![
                ("in".to_string(), 70),
                ("in:gpt-4.1".to_string(), 70),
                ("out".to_string(), 30)
            ]
        );
        // Any other field that is not a count is still another schema.
        assert!(parse_io("k:io", &[p("in", "70 30")]).is_err());
    }

    #[test]
    fn lease_records_parse_or_name_the_schema() {
        let l = parse_lease(
            "k",
            "L|1f|gpt-4.1|2026-12",
            "4096 100 1765000000001 tg:q:{a}:2026-12 tg:q:{a}:2026-12:m:gpt-4.1",
        )
        .unwrap();
        assert_eq!((l.held, l.reported, l.envoy.as_str()), (4096, 100, "1f"));
        let e = parse_lease("k", "L|1f|-|2026-12", "4096 100").unwrap_err();
        assert_eq!(e.code, 4);
    }

    #[test]
    fn keys_split_into_account_and_rest() {
        assert_eq!(
            split_key("tg:q:{a%7Db}:2026-12:m:x"),
            Some(("a%7Db", "2026-12:m:x"))
        );
        assert_eq!(split_key("tg:gb:{a}:x"), None);
    }
}
