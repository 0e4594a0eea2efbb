//! Reading Webdis' answers to the quota scripts: the reservation decision ([`ReserveReply`], with the
//! limit that binds it) and a settlement batch's per-entry results. The
//! envelope and every failure class come from [`crate::shim::webdis::parse_int_array`]; this adds the shape and
//! consistency checks of each script's reply. Never panics: anything unexpected is
//! [`ShimError::Garbage`].

use crate::shim::webdis::{parse_int_array, parse_int_array_of, ShimError};

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
    /// Admitted (and charged).
    pub allowed: bool,
    /// Tenant used this month after this call (unchanged when rejected).
    pub used_after: u64,
    /// Effective tenant limit (override or default).
    pub limit: u64,
    /// Tenant x model used after this call (0 when no model is tracked).
    pub model_used_after: u64,
    /// Effective tenant x model limit; `None` = no model limit.
    pub model_limit: Option<u64>,
    /// Output cost reserved (equals `output_cost` unless clamped; 0 when rejected).
    pub granted_output: u64,
    /// Rejected: how much what is left (the binding remaining) would grow once other Envoys' leases
    /// of the account went back (0 when admitted, or beyond 512 leases of the tenant).
    pub held_elsewhere: u64,
    /// Rejected: other Envoys hold leases of the tenant (of any model, or more than Redis looked at).
    pub leases_elsewhere: bool,
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
///
/// [`reserve_request`]: super::reserve_request
pub fn parse_reserve_reply(http_status: u32, body: &[u8]) -> Result<ReserveReply, ShimError> {
    // The 9th element (other Envoys hold leases of the tenant) is new: a reply without it says no.
    let a = parse_int_array_of(http_status, body, 8..=9)?;
    reserve_values(&a)
}

/// Reads one reservation's reply values (8 or 9 integers; also each entry of a batch's reply).
pub(crate) fn reserve_values(a: &[i64]) -> Result<ReserveReply, ShimError> {
    let [allowed, used, limit, mused, mlimit, elsewhere, granted, reason] =
        a.get(..8).unwrap_or_default()
    else {
        return Err(ShimError::Garbage("wrong length".into()));
    };
    let others = a.get(8).copied().unwrap_or(0);
    if *allowed != 0 && *elsewhere != 0 {
        // An admission reports no leases (the v2 scripts' "duplicate" flag; v3 has no free repeats).
        return Err(ShimError::Garbage(format!(
            "element 6 is not 0: {elsewhere}"
        )));
    }
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
        granted_output: non_neg(*granted, "granted output")?,
        // A hint: one that is not a count reads as none (the refusal stands, never a shim error).
        held_elsewhere: u64::try_from(*elsewhere).unwrap_or(0),
        leases_elsewhere: others != 0,
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

/// Parses a settlement batch's reply: one of 1 / 0 / −1 per entry, `n` entries.
pub fn parse_settle_reply(http_status: u32, body: &[u8], n: usize) -> Result<Vec<i64>, ShimError> {
    let v = parse_int_array(http_status, body, n)?;
    if v.iter().any(|x| !(-1..=1).contains(x)) {
        return Err(ShimError::Garbage("batch entry out of range".into()));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

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
                granted_output: 50,
                held_elsewhere: 0,
                leases_elsewhere: false,
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
        assert_eq!(r.held_elsewhere, 0);
        // A refusal reports what other Envoys' leases hold; an admission cannot; a negative hint
        // is none (the refusal stands).
        let r = parse_reserve_reply(200, br#"{"EVALSHA":[0,990,1000,0,-1,400,0,1]}"#).unwrap();
        assert_eq!(r.held_elsewhere, 400);
        let r = parse_reserve_reply(200, br#"{"EVALSHA":[0,990,1000,0,-1,-1,0,1]}"#).unwrap();
        assert_eq!((r.allowed, r.held_elsewhere), (false, 0));
        assert!(parse_reserve_reply(200, br#"{"EVAL":[1,990,1000,0,-1,400,0,0]}"#).is_err());
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
        assert_eq!(parse_settle_reply(503, b"", 1), Err(ShimError::Unavailable));
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
                br#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#,
                1
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
            br#"{"EVAL":[1,1,1,1,1,0,1,0,0,0]}"#,
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
            parse_settle_reply(200, br#"{"EVAL":[1,-2,0]}"#, 3),
            Err(ShimError::Garbage(_))
        ));
        assert!(matches!(
            parse_settle_reply(200, br#"{"EVAL":[1,1]}"#, 3),
            Err(ShimError::Garbage(_))
        ));
        assert!(matches!(
            parse_reserve_reply(200, br#"{"EVAL":[1,1,1,1,1,1,1,0]}"#),
            Err(ShimError::Garbage(_))
        ));
    }

    #[test]
    fn settle_reply_gives_one_result_per_entry() {
        assert_eq!(
            parse_settle_reply(200, br#"{"EVAL":[1,0,-1]}"#, 3),
            Ok(vec![1, 0, -1])
        );
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
            granted_output: 0,
            held_elsewhere: 0,
            leases_elsewhere: false,
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
}
