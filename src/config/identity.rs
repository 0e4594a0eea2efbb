//! Where identity comes from, beyond API keys: claims of a JWT that Envoy verified (`tenant_claim`,
//! `groups[].claim`, read from the dynamic metadata `jwt_authn` writes), and — only when the operator
//! says who sets them — request headers (`tenant_header`, `groups[].header`, `trusted_headers.set_by`).
//!
//! ```json
//! "tenant_claim": "tenant",
//! "groups": [{"name": "org", "claim": "org"}, {"name": "team", "claim": ["https://acme.example/claims", "team"]}],
//! "jwt_metadata": {"namespace": "envoy.filters.http.jwt_authn", "key": "payload"}
//! ```
//!
//! A claim is a path into the verified payload: a string splits on `.` (`org.team`, `groups.0` for an
//! array's first element), an array of strings is taken segment by segment (for claim names that hold
//! dots, such as URL-named claims). A request header is identity only with `trusted_headers`:
//! `{"set_by": "<the filter that sets it and removes the client's copy>"}`; without it a config that
//! names one is refused (a forgotten strip would let any client choose who pays).

use super::shape::OneOrMany;
use super::{err, ConfigError};
use serde::Deserialize;

/// Where Envoy's `jwt_authn` writes a verified token's payload by default (`payload_in_metadata:
/// payload`; Istio 1.22 and later configure it this way for `RequestAuthentication`).
pub const DEFAULT_JWT_NAMESPACE: &str = "envoy.filters.http.jwt_authn";
/// The default `payload_in_metadata` key.
pub const DEFAULT_JWT_KEY: &str = "payload";
/// Most segments of a claim path.
pub const MAX_CLAIM_SEGMENTS: usize = 8;

/// A claim's path inside the verified payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPath(pub Vec<String>);

impl ClaimPath {
    /// As the configuration could spell it (`org.team`).
    pub fn display(&self) -> String {
        self.0.join(".")
    }
}

/// Where verified claims are read, and which ones name the tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `filter_metadata` namespace (`jwt_metadata.namespace`).
    pub namespace: String,
    /// Key of the payload in it (`jwt_metadata.key`, `payload_in_metadata`).
    pub key: String,
    /// `tenant_claim`.
    pub tenant: Option<ClaimPath>,
}

impl Claims {
    /// The property path of `claim`: `metadata.filter_metadata.<namespace>.<key>.<claim…>`.
    pub fn property<'a>(&'a self, claim: &'a ClaimPath) -> Vec<&'a str> {
        let mut p = vec![
            "metadata",
            "filter_metadata",
            self.namespace.as_str(),
            self.key.as_str(),
        ];
        p.extend(claim.0.iter().map(String::as_str));
        p
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object {\"namespace\": …, \"key\": …}"
)]
pub(super) struct RawJwtMetadata {
    namespace: Option<String>,
    key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object {\"set_by\": …}")]
pub(super) struct RawTrusted {
    set_by: Option<String>,
}

/// A claim path as configured: `"org.team"` or `["https://acme.example/claims", "team"]`.
pub(super) type RawClaim = OneOrMany<String>;

/// Validates a claim path (`field` names it in errors).
pub(super) fn claim_path(field: &str, raw: RawClaim) -> Result<ClaimPath, ConfigError> {
    let segments: Vec<String> = match raw {
        OneOrMany::One(s) => s.split('.').map(str::to_string).collect(),
        OneOrMany::Many(v) => v,
    };
    if segments.is_empty() || segments.len() > MAX_CLAIM_SEGMENTS {
        return Err(err(
            field,
            format!("must name 1 to {MAX_CLAIM_SEGMENTS} segments"),
        ));
    }
    for s in &segments {
        if s.is_empty() || s.len() > 256 || s.chars().any(char::is_control) {
            return Err(err(
                field,
                format!("'{s}' is not a claim name: 1-256 characters, no control characters"),
            ));
        }
    }
    Ok(ClaimPath(segments))
}

/// Validates `jwt_metadata` and `tenant_claim`.
pub(super) fn claims(
    jwt_metadata: Option<RawJwtMetadata>,
    tenant_claim: Option<RawClaim>,
) -> Result<Claims, ConfigError> {
    let (namespace, key) = match jwt_metadata {
        Some(m) => (
            m.namespace
                .unwrap_or_else(|| DEFAULT_JWT_NAMESPACE.to_string()),
            m.key.unwrap_or_else(|| DEFAULT_JWT_KEY.to_string()),
        ),
        None => (
            DEFAULT_JWT_NAMESPACE.to_string(),
            DEFAULT_JWT_KEY.to_string(),
        ),
    };
    for (f, v) in [
        ("jwt_metadata.namespace", &namespace),
        ("jwt_metadata.key", &key),
    ] {
        if v.is_empty() || v.chars().any(char::is_control) {
            return Err(err(
                f,
                "must be a non-empty name without control characters",
            ));
        }
    }
    let tenant = tenant_claim
        .map(|c| claim_path("tenant_claim", c))
        .transpose()?;
    Ok(Claims {
        namespace,
        key,
        tenant,
    })
}

/// Validates `trusted_headers`: `Some(set_by)` when headers may carry identity. `uses_headers`: the
/// configuration names a tenant or group header (its field, for the refusal).
pub(super) fn trusted_headers(
    raw: Option<RawTrusted>,
    uses_headers: Option<&str>,
) -> Result<Option<String>, ConfigError> {
    let set_by = match raw {
        Some(t) => match t.set_by.map(|s| s.trim().to_string()) {
            Some(s) if !s.is_empty() && !s.chars().any(char::is_control) => Some(s),
            _ => return Err(err(
                "trusted_headers.set_by",
                "must name the filter that sets the identity headers and removes the client's copy",
            )),
        },
        None => None,
    };
    match (uses_headers, &set_by) {
        (Some(field), None) => Err(err(
            field,
            "a request header is no identity unless a trusted filter sets it and removes the client's copy: \
             take the tenant and groups from a JWT Envoy verified (tenant_claim, groups[].claim) or from api_keys, \
             or name that filter in trusted_headers.set_by (README \"Security model\")",
        )),
        (None, Some(_)) => Err(err(
            "trusted_headers",
            "no identity header is configured (tenant_header, group_header, groups[].header)",
        )),
        _ => Ok(set_by),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn a_header_is_identity_only_when_the_config_names_who_sets_it() {
        let msg = refusal(&with("", r#","tenant_header":"x-tenant-id""#));
        assert!(
            msg.starts_with("tenant_header: a request header is no identity unless"),
            "{msg}"
        );
        assert!(msg.contains("tenant_claim"), "{msg}");
        let msg = refusal(&with("", r#","group_header":"x-team""#));
        assert!(msg.starts_with("group_header: "), "{msg}");
        let msg = refusal(&with(
            "",
            r#","groups":[{"name":"team","header":"x-team"}]"#,
        ));
        assert!(msg.starts_with("groups[].header: "), "{msg}");
        assert_eq!(
            refusal(&with("", r#","trusted_headers":{"set_by":"ext_authz"}"#)),
            "trusted_headers: no identity header is configured (tenant_header, group_header, groups[].header)"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","tenant_header":"x-t","trusted_headers":{"set_by":" "}"#
            )),
            "trusted_headers.set_by: must name the filter that sets the identity headers and removes the client's copy"
        );
        let c = parse_str(&with(
            "",
            r#","tenant_header":"x-t","trusted_headers":{"set_by":"ext_authz"}"#,
        ))
        .unwrap();
        assert_eq!(c.trusted_headers.as_deref(), Some("ext_authz"));
        assert!(!c.forward_identity_headers);
    }

    #[test]
    fn claims_are_paths_into_the_verified_payload() {
        let c = parse_str(&with("", r#","tenant_claim":"org.tenant""#)).unwrap();
        let path = c.claims.tenant.clone().unwrap();
        assert_eq!(
            c.claims.property(&path),
            [
                "metadata",
                "filter_metadata",
                "envoy.filters.http.jwt_authn",
                "payload",
                "org",
                "tenant"
            ]
        );
        let c = parse_str(&with(
            "",
            r#","tenant_claim":["https://acme.example/t"],"jwt_metadata":{"namespace":"istio_authn","key":"request.auth.claims"}"#,
        ))
        .unwrap();
        let path = c.claims.tenant.clone().unwrap();
        assert_eq!(
            c.claims.property(&path),
            [
                "metadata",
                "filter_metadata",
                "istio_authn",
                "request.auth.claims",
                "https://acme.example/t"
            ]
        );
        assert_eq!(
            refusal(&with("", r#","tenant_claim":"a..b""#)),
            "tenant_claim: '' is not a claim name: 1-256 characters, no control characters"
        );
        assert_eq!(
            refusal(&with("", r#","tenant_claim":[]"#)),
            "tenant_claim: must name 1 to 8 segments"
        );
        assert_eq!(
            refusal(&with("", r#","tenant_claim":5"#)),
            "tenant_claim: invalid type: integer `5`, expected a string or an array of strings"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","groups":[{"name":"team","claim":"team","header":"x-team"}],"trusted_headers":{"set_by":"x"}"#
            )),
            "groups[0]: give claim or header, not both"
        );
    }

    #[test]
    fn a_default_model_is_one_name_or_one_per_route() {
        let c = parse_str(&with("", r#","default_model":"gpt-4.1""#)).unwrap();
        assert_eq!(c.default_model.for_route(Some("any")), Some("gpt-4.1"));
        let c = parse_str(&with(
            "",
            r#","default_model":{"local":"llama","*":"gpt-4.1"}"#,
        ))
        .unwrap();
        assert_eq!(c.default_model.for_route(Some("local")), Some("llama"));
        assert_eq!(c.default_model.for_route(None), Some("gpt-4.1"));
        assert_eq!(
            refusal(&with("", r#","default_model":"gpt-*""#)),
            "default_model: 'gpt-*' must be an exact model name here ('*' patterns are only for rules[].model, limits[].model and models)"
        );
        assert_eq!(
            refusal(&with("", r#","default_model":"""#)),
            "default_model: must name a model"
        );
    }
}
