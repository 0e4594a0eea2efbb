//! The top-level fields: where the tenant and the model come from (`tenant_header`, `api_key_tenants`,
//! `default_tenant`, `model_header`), request bodies (`max_body_bytes`, `invalid_body`) and the shared
//! store (`max_tenants`, `cas_max_retries`, `on_store_error`). Sections have files of their own.

use super::fields::{header_name, in_range, show, TENANT_ID};
use super::rules::Rule;
use super::{err, ConfigError};
use serde::Deserialize;

/// What to do with a body on an LLM path that is not valid JSON.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InvalidBody {
    /// Answer 400 `invalid_body` (default).
    Reject,
    /// Admit it, charging this many tokens.
    Charge(u64),
}

/// What to do when the shared store fails (CAS retries exhausted, host error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailure {
    /// Admit the request unmetered, count it (default: a local contention never blocks traffic).
    Allow,
    /// Answer 503 `rate_limiter_unavailable`.
    Deny,
}

/// What to do with a body asking for more output than the model's `max_tokens_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AboveCap {
    /// Lower the limit in the body to the cap (default): the provider never generates more than was
    /// reserved.
    Lower,
    /// Answer 400 `output_limit_too_large`.
    Refuse,
}

/// A setting that is one of two words: the first (also when absent) or the second.
pub(super) fn either<T>(
    field: &str,
    v: Option<&str>,
    (first, if_first): (&str, T),
    (second, if_second): (&str, T),
) -> Result<T, ConfigError> {
    match v {
        None => Ok(if_first),
        Some(w) if w == first => Ok(if_first),
        Some(w) if w == second => Ok(if_second),
        Some(other) => Err(err(
            field,
            format!("must be \"{first}\" or \"{second}\", got \"{other}\""),
        )),
    }
}

/// `output_above_cap`: `"lower"` (default) or `"refuse"`.
pub(super) fn above_cap(v: Option<String>) -> Result<AboveCap, ConfigError> {
    either(
        "output_above_cap",
        v.as_deref(),
        ("lower", AboveCap::Lower),
        ("refuse", AboveCap::Refuse),
    )
}

/// `output_limit_absent`: false (`"leave"`, the default) leaves a body without an output limit to the
/// provider's own; true (`"write"`) writes the reserved one (`default_max_tokens`) into it.
pub(super) fn write_absent_limit(v: Option<String>) -> Result<bool, ConfigError> {
    either(
        "output_limit_absent",
        v.as_deref(),
        ("leave", false),
        ("write", true),
    )
}

/// `background_responses`: true (`"refuse"`, the default) refuses an OpenAI Responses request with
/// `background: true`; `"reservation"` admits it, charged its whole reservation.
pub(super) fn refuse_background(v: Option<String>) -> Result<bool, ConfigError> {
    either(
        "background_responses",
        v.as_deref(),
        ("refuse", true),
        ("reservation", false),
    )
}

/// Default header giving the model in the headers phase.
pub const DEFAULT_MODEL_HEADER: &str = "x-tokengate-model";
/// Default largest body: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 8 * 1024 * 1024;
/// Largest `max_body_bytes`: 1 GiB.
pub const MAX_BODY_BYTES_LIMIT: u64 = 1 << 30;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object {\"action\": …}")]
pub(super) struct RawInvalidBody {
    action: String,
    tokens: Option<u64>,
}

/// Where the tenant and the model are read from.
pub(super) struct Sources {
    /// `tenant_header`, lower-cased.
    pub tenant_header: Option<String>,
    /// `model_header` (default [`DEFAULT_MODEL_HEADER`]), lower-cased.
    pub model_header: Option<String>,
    /// `api_key_tenants` (default true).
    pub api_key_tenants: bool,
    /// `default_tenant`, a valid tenant id.
    pub default_tenant: Option<String>,
}

/// Validates `tenant_header`, `model_header`, `api_key_tenants` and `default_tenant`, in that order.
pub(super) fn sources(
    tenant_header: Option<String>,
    model_header: Option<String>,
    api_key_tenants: Option<bool>,
    default_tenant: Option<String>,
) -> Result<Sources, ConfigError> {
    let tenant_header = header_name("tenant_header", tenant_header)?;
    let model_header = header_name(
        "model_header",
        Some(model_header.unwrap_or_else(|| DEFAULT_MODEL_HEADER.to_string())),
    )?;
    let api_key_tenants = api_key_tenants.unwrap_or(true);
    let default_tenant = match default_tenant {
        Some(t) if t.trim().is_empty() => {
            return Err(err("default_tenant", "must not be empty (omit it for 401)"))
        }
        Some(t) if !crate::identity::valid_tenant(&t) => {
            return Err(err(
                "default_tenant",
                format!("'{t}' is not a valid tenant id: {TENANT_ID}"),
            ))
        }
        other => other,
    };
    Ok(Sources {
        tenant_header,
        model_header,
        api_key_tenants,
        default_tenant,
    })
}

/// `api_keys`: `{"<tenant>": ["<SHA-256 of a key, 64 hex digits, optionally after sha256:>", …]}` — the
/// only keys accepted, each naming its tenant. Raw keys are never put in the configuration.
pub(super) fn api_keys(
    raw: super::shape::UniqueMap<Vec<String>>,
    api_key_tenants: bool,
) -> Result<crate::identity::ApiKeys, ConfigError> {
    if !api_key_tenants {
        return Err(err(
            "api_keys",
            "needs api_key_tenants: true (keys name the tenants)",
        ));
    }
    let mut out = crate::identity::ApiKeys::default();
    for (tenant, digests) in raw {
        let field = format!("api_keys.{tenant}");
        if !crate::identity::valid_tenant(&tenant) {
            return Err(err(
                field,
                format!("'{tenant}' is not a valid tenant id: {TENANT_ID}"),
            ));
        }
        if tenant
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("key:"))
        {
            return Err(err(
                field,
                "tenant ids starting with 'key:' are reserved for unlisted keys",
            ));
        }
        if digests.is_empty() {
            return Err(err(field, "lists no key digest"));
        }
        for (i, d) in digests.iter().enumerate() {
            let f = format!("{field}[{i}]");
            let Some(digest) = crate::identity::parse_digest(d.trim()) else {
                return Err(err(
                    f,
                    "must be the SHA-256 of the key as 64 hex digits (printf %s \"$KEY\" | sha256sum), optionally after 'sha256:'; never the key itself",
                ));
            };
            if let Some(other) = out.insert(digest, tenant.clone()) {
                return Err(err(
                    f,
                    format!("the same key is also listed for tenant '{other}'"),
                ));
            }
        }
    }
    if out.is_empty() {
        return Err(err(
            "api_keys",
            "lists no tenant (omit it to accept any key)",
        ));
    }
    Ok(out)
}

/// `max_body_bytes`: 1 byte to [`MAX_BODY_BYTES_LIMIT`], default [`DEFAULT_MAX_BODY_BYTES`].
pub(super) fn max_body_bytes(v: Option<u64>) -> Result<usize, ConfigError> {
    let max_body = v.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body == 0 || max_body > MAX_BODY_BYTES_LIMIT {
        return Err(err(
            "max_body_bytes",
            format!("must be between 1 and {MAX_BODY_BYTES_LIMIT} (1 GiB), got {max_body}"),
        ));
    }
    Ok(usize::try_from(max_body).unwrap_or(usize::MAX))
}

/// `invalid_body`: `{"action": "reject"}` (default) or `{"action": "charge", "tokens": N}`.
pub(super) fn invalid_body(raw: Option<RawInvalidBody>) -> Result<InvalidBody, ConfigError> {
    Ok(match raw {
        None => InvalidBody::Reject,
        Some(ib) => match (ib.action.as_str(), ib.tokens) {
            ("reject", None) => InvalidBody::Reject,
            ("reject", Some(_)) => {
                return Err(err(
                    "invalid_body.tokens",
                    "only allowed with action \"charge\"",
                ))
            }
            ("charge", Some(t)) if t > 0 => InvalidBody::Charge(t),
            ("charge", _) => {
                return Err(err(
                    "invalid_body.tokens",
                    "action \"charge\" needs tokens > 0",
                ))
            }
            (a, _) => {
                return Err(err(
                    "invalid_body.action",
                    format!("'{a}' is not one of \"reject\", \"charge\""),
                ))
            }
        },
    })
}

/// A fixed charge for unreadable bodies must fit the burst of some rule, or every such request is
/// refused with 413.
pub(super) fn charge_fits_a_rule(
    invalid_body: InvalidBody,
    rules: &[Rule],
) -> Result<(), ConfigError> {
    if let InvalidBody::Charge(tokens) = invalid_body {
        let largest = rules.iter().map(|r| r.params.burst).fold(0.0, f64::max);
        if tokens as f64 > largest {
            return Err(err(
                "invalid_body.tokens",
                format!(
                    "{tokens} is larger than the burst of every rule (largest {}): every request with an unreadable body would be refused with 413",
                    show(largest)
                ),
            ));
        }
    }
    Ok(())
}

/// The shared store's bounds and failure policy.
pub(super) struct Store {
    /// `max_tenants` (1 to 1 000 000, default 10 000).
    pub max_tenants: u32,
    /// `cas_max_retries` (1 to 1000, default 32).
    pub cas_max_retries: u32,
    /// `on_store_error` (`"allow"`, default, or `"deny"`).
    pub on_store_error: StoreFailure,
}

/// Validates `max_tenants`, `cas_max_retries` and `on_store_error`, in that order.
pub(super) fn store(
    max_tenants: Option<u32>,
    cas_max_retries: Option<u32>,
    on_store_error: Option<String>,
) -> Result<Store, ConfigError> {
    let max_tenants = in_range("max_tenants", max_tenants.unwrap_or(10_000), 1, 1_000_000)?;
    let cas_max_retries = in_range("cas_max_retries", cas_max_retries.unwrap_or(32), 1, 1000)?;
    let on_store_error = match on_store_error.as_deref() {
        None | Some("allow") => StoreFailure::Allow,
        Some("deny") => StoreFailure::Deny,
        Some(o) => {
            return Err(err(
                "on_store_error",
                format!("'{o}' is not one of \"allow\", \"deny\""),
            ))
        }
    };
    Ok(Store {
        max_tenants,
        cas_max_retries,
        on_store_error,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn invalid_body_policy_is_checked() {
        let c = parse_str(
            r#"{"invalid_body":{"action":"charge","tokens":500},"rules":[{"tokens_per_second":1,"burst":500}]}"#,
        )
        .unwrap();
        assert_eq!(c.invalid_body, InvalidBody::Charge(500));
        let e = parse_str(
            r#"{"invalid_body":{"action":"charge"},"rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "invalid_body.tokens");
        let e = parse_str(
            r#"{"invalid_body":{"action":"drop"},"rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "invalid_body.action");
    }

    #[test]
    fn default_tenant_must_be_a_valid_tenant_id() {
        assert_eq!(
            refusal(&with("", r#","default_tenant":"a b""#)),
            "default_tenant: 'a b' is not a valid tenant id: 1-128 characters from [A-Za-z0-9._:@-]"
        );
        assert_eq!(
            refusal(&with("", r#","default_tenant":" ""#)),
            "default_tenant: must not be empty (omit it for 401)"
        );
        let c = parse_str(&with("", r#","default_tenant":"anon@x""#)).unwrap();
        assert_eq!(c.default_tenant.as_deref(), Some("anon@x"));
        assert_eq!(
            refusal(&with(
                "",
                r#","quota":{"cluster":"w","monthly_limit":1,"tenants":{"a/b":{}}}"#
            )),
            "quota.tenants.a/b: is not a valid tenant id: 1-128 characters from [A-Za-z0-9._:@-]"
        );
    }

    #[test]
    fn bad_header_names_and_duplicate_rule_names_are_refused() {
        assert_eq!(
            parse_str(r#"{"tenant_header":"x y","rules":[{"tokens_per_second":1,"burst":1}]}"#)
                .unwrap_err()
                .field,
            "tenant_header"
        );
        let e = parse_str(
            r#"{"rules":[{"name":"a","tokens_per_second":1,"burst":1},{"name":"a","tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "rules[1].name");
    }

    #[test]
    fn a_fixed_charge_for_unreadable_bodies_above_every_burst_is_refused() {
        let config = |tokens: u64| {
            format!(
                r#"{{"invalid_body":{{"action":"charge","tokens":{tokens}}},
                    "rules":[{{"tenant":"a","tokens_per_second":1,"burst":300}},
                             {{"tokens_per_second":1,"burst":200}}]}}"#
            )
        };
        assert_eq!(
            refusal(&config(301)),
            "invalid_body.tokens: 301 is larger than the burst of every rule (largest 300): every request with an unreadable body would be refused with 413"
        );
        assert_eq!(
            parse_str(&config(300)).unwrap().invalid_body,
            InvalidBody::Charge(300)
        );
    }
}
