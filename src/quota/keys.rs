//! The Redis keys of one tenant's monthly quota. Every key starts with `tg:q:{<tenant>}` (the
//! [`crate::store::keys::QUOTA`] prefix and the tenant as Redis Cluster hash tag), so one request's keys, and a
//! batch of one tenant's settlements, stay on one slot:
//! ```text
//! tg:q:{acme}:2026-11                  tenant used this month (reservations in flight included)
//! tg:q:{acme}:2026-11:m:gpt-4.1        tenant x model used this month
//! tg:q:{acme}:2026-11:io               hash: the provider's input/output tokens settled this month,
//!                                      fields in, out, in:<model>, out:<model> (since 0.2.0)
//! tg:q:{acme}:limit                    optional operator override of the tenant limit (integer)
//! tg:q:{acme}:limit:m:gpt-4.1          optional operator override of the tenant x model limit
//! tg:q:{acme}:open                     hash: reservations in flight, request id -> "<amount> <min> <keys>"
//! tg:q:{acme}:due                      sorted set: request id by deadline (unix s)
//! tg:q:{acme}:done                     hash: tombstones (resolved at the deadline, or charged without
//!                                      a reservation), request id -> "S <min> <keys>" | "C"
//! tg:q:{acme}:gone                     sorted set: tombstone id by expiry (unix s)
//! tg:q:{acme}:leases                   hash: leases of Envoys, "L|<envoy>|<model>|<month>" ->
//!                                      "<held> <reported total> <version> <counter keys>"
//! tg:q:{acme}:none                     placeholder key when no model is tracked (never read or written)
//! ```
//! So Redis holds, per tenant, a handful of keys plus one entry per request *in flight* (and a
//! tombstone per request resolved by the deadline rule or charged without a reservation, for
//! `tombstone_s`): memory is O(tenants + requests in flight), not O(requests).
//!
//! Tenant, model, month and ids go through [`crate::store::keys::sanitize`].

use crate::store::keys::sanitize;

/// `tg:q:{<tenant>}` — the prefix (with hash tag) every key of one tenant shares.
pub fn tenant_prefix(tenant: &str) -> String {
    format!("{}{{{}}}", crate::store::keys::QUOTA, sanitize(tenant))
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
    /// `tg:q:{t}:open` — reservations in flight.
    pub open: String,
    /// `tg:q:{t}:due` — their deadlines.
    pub due: String,
    /// `tg:q:{t}:done` — tombstones.
    pub done: String,
    /// `tg:q:{t}:gone` — tombstone expiries.
    pub gone: String,
    /// `tg:q:{t}:leases` — leases held by Envoys.
    pub leases: String,
    /// The sanitized request id (the field of this request's entries).
    pub request_id: String,
    /// True when a model is tracked (the model keys are real).
    pub has_model: bool,
}

impl QuotaKeys {
    /// Keys for `tenant` (and `model` when given) in month `month` (a [`month_label`]).
    ///
    /// [`month_label`]: crate::quota::calendar::month_label
    pub fn new(tenant: &str, model: Option<&str>, month: &str, request_id: &str) -> Self {
        let p = tenant_prefix(tenant);
        let month = sanitize(month);
        let none = format!("{p}:none");
        let (used_model, limit_model_override) = match model {
            Some(m) => {
                let m = sanitize(m);
                (format!("{p}:{month}:m:{m}"), format!("{p}:limit:m:{m}"))
            }
            None => (none.clone(), none),
        };
        Self {
            used_total: format!("{p}:{month}"),
            used_model,
            limit_override: format!("{p}:limit"),
            limit_model_override,
            open: format!("{p}:open"),
            due: format!("{p}:due"),
            done: format!("{p}:done"),
            gone: format!("{p}:gone"),
            leases: format!("{p}:leases"),
            request_id: sanitize(request_id),
            has_model: model.is_some(),
        }
    }
}

impl QuotaKeys {
    /// The keys a settlement needs, rebuilt from its tenant prefix (`tg:q:{t}`), its counter keys and
    /// request id (as a journal entry keeps them); the limit keys are not needed and left empty.
    pub fn for_settlement(
        prefix: &str,
        used_total: String,
        used_model: String,
        request_id: String,
        has_model: bool,
    ) -> Self {
        Self {
            used_total,
            used_model,
            limit_override: String::new(),
            limit_model_override: String::new(),
            open: format!("{prefix}:open"),
            due: format!("{prefix}:due"),
            done: format!("{prefix}:done"),
            gone: format!("{prefix}:gone"),
            leases: format!("{prefix}:leases"),
            request_id,
            has_model,
        }
    }
}

impl QuotaKeys {
    /// `tg:q:{t}:<month>:io` — hash of the provider's input and output tokens settled in the month
    /// (fields `in`, `out`, `in:<model>`, `out:<model>`), same hash tag and expiry as the counters.
    pub fn io(&self) -> String {
        format!("{}:io", self.used_total)
    }
}

/// The hash-tag prefix of a settlement's keys (`tg:q:{tenant}`): settlements may be batched per prefix.
pub fn tenant_tag(keys: &QuotaKeys) -> &str {
    match keys.used_total.find("}:") {
        Some(i) => keys.used_total.get(..=i).unwrap_or(&keys.used_total),
        None => &keys.used_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_tenant_carries_the_same_hash_tag() {
        let k = QuotaKeys::new("key:9f2c", Some("gpt-4.1"), "2026-11", "r1");
        assert_eq!(k.used_total, "tg:q:{key:9f2c}:2026-11");
        assert_eq!(k.used_model, "tg:q:{key:9f2c}:2026-11:m:gpt-4.1");
        assert_eq!(k.limit_override, "tg:q:{key:9f2c}:limit");
        assert_eq!(k.limit_model_override, "tg:q:{key:9f2c}:limit:m:gpt-4.1");
        assert_eq!(k.open, "tg:q:{key:9f2c}:open");
        assert_eq!(k.request_id, "r1");
        let t = QuotaKeys::new("a}b{", None, "2026-11", "r");
        for key in [
            &t.used_total,
            &t.used_model,
            &t.limit_override,
            &t.open,
            &t.due,
            &t.done,
            &t.gone,
        ] {
            assert!(key.starts_with("tg:q:{a%7Db%7B}:"), "{key}");
            assert_eq!(key.matches('{').count(), 1);
        }
        assert_eq!(t.used_model, "tg:q:{a%7Db%7B}:none");
        assert!(!t.has_model);
    }
}
