//! Checks of single values shared by every section: numbers within a stated range, header names,
//! exact model names, and the wording of ranges in refusals (`must be between 1 and 1e15, got 0`).

use super::{err, ConfigError};
use std::fmt;

/// What a tenant id is, for messages (see [`crate::identity::valid_tenant`]).
pub(super) const TENANT_ID: &str = "1-128 characters from [A-Za-z0-9._:@-]";

/// A number for a message: plain when short (`0.5`, `60000`), else in exponent form (`1e15`, `1e-300`).
pub(super) fn show(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-3..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// A required number within `lo..=hi`; the error states the range and what was given.
pub(super) fn number_in(
    field: String,
    v: Option<f64>,
    lo: f64,
    hi: f64,
) -> Result<f64, ConfigError> {
    match v {
        None => Err(err(field, "is required")),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        Some(x) => Err(err(
            field,
            format!(
                "must be between {} and {}, got {}",
                show(lo),
                show(hi),
                show(x)
            ),
        )),
    }
}

/// An integer within `lo..=hi`; the error states the range and what was given.
pub(super) fn in_range<T>(field: impl Into<String>, v: T, lo: T, hi: T) -> Result<T, ConfigError>
where
    T: PartialOrd + fmt::Display + Copy,
{
    if v < lo || v > hi {
        Err(err(
            field,
            format!("must be between {lo} and {hi}, got {v}"),
        ))
    } else {
        Ok(v)
    }
}

/// An integer of at least `lo` (no upper bound but its type's).
pub(super) fn at_least<T>(field: impl Into<String>, v: T, lo: T) -> Result<T, ConfigError>
where
    T: PartialOrd + fmt::Display + Copy,
{
    if v < lo {
        Err(err(field, format!("must be >= {lo}, got {v}")))
    } else {
        Ok(v)
    }
}

pub(super) fn header_name(field: &str, v: Option<String>) -> Result<Option<String>, ConfigError> {
    match v {
        None => Ok(None),
        Some(h) => {
            let lower = h.trim().to_ascii_lowercase();
            let ok = !lower.is_empty()
                && lower
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if ok {
                Ok(Some(lower))
            } else {
                Err(err(field, format!("'{h}' is not a valid header name")))
            }
        }
    }
}

/// Keys that name one model (quota limits and weights, model fallbacks): a `*` there would be taken
/// literally and never match, so it is refused.
pub(super) fn exact_model(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.contains('*') {
        return Err(err(
            field,
            format!("'{name}' must be an exact model name here ('*' patterns are only for rules[].model, limits[].model and models)"),
        ));
    }
    Ok(())
}

/// Turns a validation message that starts with the field name (`failure_threshold must be >= 1`) into a
/// ConfigError under `prefix` (`breaker.failure_threshold: must be >= 1`).
pub(super) fn prefixed_err(prefix: &str, msg: &str) -> ConfigError {
    let (field, reason) = msg.split_once(' ').unwrap_or((msg, "is invalid"));
    err(format!("{prefix}.{field}"), reason.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn exact_model_keys_and_route_values_are_checked() {
        let r = r#""rules":[{"tokens_per_second":10,"burst":100}]"#;
        let e = parse_str(&format!(
            r#"{{{r},"quota":{{"cluster":"w","monthly_limit":10,"weights":{{"gpt-4*":{{"output":2}}}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "quota.weights.gpt-4*");
        let e = parse_str(&format!(
            r#"{{{r},"quota":{{"cluster":"w","monthly_limit":10,"model_limits":{{"a*":1}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "quota.model_limits.a*");
        let e = parse_str(&format!(
            r#"{{{r},"breaker":{{"model_fallbacks":{{"a":"b*"}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "breaker.model_fallbacks.a");
        let e = parse_str(&format!(
            r#"{{{r},"breaker":{{"cluster_fallbacks":{{"a":{{"cluster":"b","route":"x\r\ny"}}}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "breaker.cluster_fallbacks.a.route");
    }
}
