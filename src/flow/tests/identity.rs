//! Who pays and which model a request is charged as, from what Envoy verified: JWT claims in dynamic
//! metadata, trusted headers only where configured, API keys checked whatever names the tenant, the
//! body's model (or a configured default) over anything the client says in a header.

use super::*;
use crate::flow::Metric;

/// The property path of a claim of the default `jwt_metadata` (as the fake keys properties).
fn claim_prop(claim: &str) -> String {
    format!("metadata.filter_metadata.envoy.filters.http.jwt_authn.payload.{claim}")
}

/// Envoy verified a token whose claims are `claims` (strings) for the next requests.
fn verified(e: &mut crate::flow::fake::FakeEnvoy, claims: &[(&str, &[u8])]) {
    e.props.retain(|k, _| !k.starts_with("metadata."));
    for (c, v) in claims {
        e.props.insert(claim_prop(c), v.to_vec());
    }
}

fn digest(key: &str) -> String {
    crate::identity::key_digest(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_tenant_and_groups_come_from_verified_claims_and_a_header_cannot_change_them() {
    let mut e = envoy(json!({
        "tenant_claim": "tenant",
        "groups": [{"name": "org", "claim": "org"}, {"name": "team", "claim": ["org.x", "team"]}],
        "limits": [{"name": "org", "scope": "org", "tokens_per_second": 1, "burst": 100}]}));
    verified(
        &mut e,
        &[
            ("tenant", b"alice"),
            ("org", b"acme"),
            ("org.x.team", b"search"),
        ],
    );
    // A client's own headers name nothing: no header is configured as identity.
    let c = e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", "mallory"), ("x-tokengate-org", "other")],
        &chat("m", "hi", 5),
    );
    clean(&c);
    assert!(c.forwarded);
    assert_eq!(c.audit_field("tenant").as_deref(), Some("alice"));
    assert!(
        e.store.keys().iter().any(|k| k.contains(":org=acme")),
        "{:?}",
        e.store.keys()
    );
    // The org's bucket (100 tokens) is alice's org's, whatever the header said: drained by her.
    let c = e.send(
        "/v1/chat/completions",
        &[],
        &chat("m", &"hi ".repeat(60), 30),
    );
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-limit"), Some("org"));
}

#[test]
fn a_claim_that_is_not_an_id_is_refused_and_a_number_is_its_decimal_text() {
    let mut e = envoy(json!({"tenant_claim": "tenant", "rules": [rule(10.0, 1e6)]}));
    verified(&mut e, &[("tenant", &1.5f64.to_le_bytes())]);
    let c = e.send("/v1/chat/completions", &[], &chat("m", "hi", 5));
    assert_eq!(c.status(), Some(403));
    assert_eq!(c.reply_json()["error"]["code"], "invalid_identity_claim");
    assert_eq!(c.audit_field("decision").as_deref(), Some("invalid_claim"));
    verified(&mut e, &[("tenant", b"two words")]);
    assert_eq!(
        e.send("/v1/chat/completions", &[], &chat("m", "hi", 5))
            .status(),
        Some(403)
    );
    verified(&mut e, &[("tenant", &42f64.to_le_bytes())]);
    let c = e.send("/v1/chat/completions", &[], &chat("m", "hi", 5));
    assert!(c.forwarded);
    assert_eq!(c.audit_field("tenant").as_deref(), Some("42"));
    assert_eq!(e.metric(Metric::RequestsRejectedNoTenant), 2);
}

#[test]
fn without_a_verified_token_the_api_key_names_the_tenant() {
    let mut e = envoy(json!({"tenant_claim": "tenant", "rules": [rule(10.0, 1e6)]}));
    verified(&mut e, &[]);
    let c = e.send(
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-1")],
        &chat("m", "hi", 5),
    );
    assert!(c.forwarded);
    assert_eq!(
        c.audit_field("tenant"),
        Some(crate::identity::tenant_from_key("sk-1"))
    );
}

#[test]
fn with_api_keys_a_verified_token_does_not_let_an_unlisted_or_foreign_key_through() {
    // Before: a verified JWT plus a made-up key was admitted and the key forwarded.
    let mut e = envoy(json!({
        "tenant_claim": "tenant",
        "api_keys": {"alice": [digest("sk-alice")], "bob": [digest("sk-bob")]},
        "rules": [rule(10.0, 1e6)]}));
    verified(&mut e, &[("tenant", b"alice")]);
    let c = e.send(
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-made-up")],
        &chat("m", "hi", 5),
    );
    assert_eq!(c.status(), Some(401));
    assert_eq!(
        c.audit_field("decision").as_deref(),
        Some("unknown_api_key")
    );
    // Bob's key with alice's token: the key is bob's, the token alice's.
    let c = e.send(
        "/v1/chat/completions",
        &[("x-api-key", "sk-bob")],
        &chat("m", "hi", 5),
    );
    assert_eq!(c.status(), Some(401));
    assert_eq!(c.reply_json()["error"]["code"], "identity_conflict");
    // Her own key, or none: hers.
    for h in [&[("x-api-key", "sk-alice")][..], &[]] {
        let c = e.send("/v1/chat/completions", h, &chat("m", "hi", 5));
        assert!(c.forwarded, "{:?}", c.reply_json());
        assert_eq!(c.audit_field("tenant").as_deref(), Some("alice"));
    }
    // Two keys: refused whatever names the tenant.
    let c = e.send(
        "/v1/chat/completions",
        &[
            ("x-api-key", "sk-alice"),
            ("authorization", "Bearer sk-bob"),
        ],
        &chat("m", "hi", 5),
    );
    assert_eq!(c.status(), Some(401));
}

#[test]
fn trusted_identity_headers_are_not_sent_upstream_unless_asked() {
    let cfg = |forward: bool| {
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "ext_authz"},
               "groups": [{"name": "team", "header": "x-team"}],
               "forward_identity_headers": forward, "rules": [rule(10.0, 1e6)]})
    };
    let e = envoy(cfg(false));
    let c = e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", "alice"), ("x-team", "search")],
        &chat("m", "hi", 5),
    );
    clean(&c);
    assert_eq!(c.audit_field("tenant").as_deref(), Some("alice"));
    assert!(
        !c.headers
            .iter()
            .any(|(k, _)| k == "x-tenant-id" || k == "x-team"),
        "{:?}",
        c.headers
    );
    // Also on a path that is not metered.
    let c = e.send(
        "/v1/models",
        &[(":method", "GET"), ("x-tenant-id", "alice")],
        "",
    );
    assert!(!c.headers.iter().any(|(k, _)| k == "x-tenant-id"));
    let e = envoy(cfg(true));
    let c = e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", "alice")],
        &chat("m", "hi", 5),
    );
    assert!(c.headers.iter().any(|(k, _)| k == "x-tenant-id"));
}

#[test]
fn the_body_model_is_charged_and_the_model_header_cannot_change_it() {
    // Before: the same request without `model` (or with x-tokengate-model naming another) passed a
    // drained model limit.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "limits": [{"name": "gpt", "model": "gpt-4.1", "tokens_per_second": 1, "burst": 60}]}),
    );
    let c = e.send(
        "/v1/chat/completions",
        &[TENANT],
        &chat("gpt-4.1", "hi", 40),
    );
    assert!(c.forwarded);
    // Drained: the header naming another model does not help, the body's model decides.
    let c = e.send(
        "/v1/chat/completions",
        &[TENANT, ("x-tokengate-model", "cheap")],
        &chat("gpt-4.1", "hi", 40),
    );
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-limit"), Some("gpt"));
    // No model in the body, none configured: refused, not charged as no model.
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}).to_string();
    let c = e.send(
        "/v1/chat/completions",
        &[TENANT, ("x-tokengate-model", "cheap")],
        &body,
    );
    assert_eq!(c.status(), Some(400));
    assert_eq!(c.reply_json()["error"]["code"], "model_required");
}

#[test]
fn a_body_without_a_model_is_charged_as_its_routes_default_model() {
    let mut e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "default_model": {"local-llama": "llama-3.1-8b", "*": "gpt-4.1"},
        "limits": [{"name": "gpt", "model": "gpt-4.1", "tokens_per_second": 1, "burst": 60}]}),
    );
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}).to_string();
    let c = e.send("/v1/chat/completions", &[TENANT], &body);
    assert!(c.forwarded);
    assert_eq!(c.audit_field("model").as_deref(), Some("gpt-4.1"));
    // gpt-4.1's limit is drained by it.
    assert_eq!(
        e.send("/v1/chat/completions", &[TENANT], &body).status(),
        Some(429)
    );
    e.props
        .insert("xds.route_name".to_string(), b"local-llama".to_vec());
    let c = e.send("/v1/chat/completions", &[TENANT], &body);
    assert!(c.forwarded);
    assert_eq!(c.audit_field("model").as_deref(), Some("llama-3.1-8b"));
}

#[test]
fn a_path_model_decides_over_the_body_and_an_unknown_deployment_is_refused() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "azure_openai": {"deployments": {"prod-4o": "gpt-4o"}},
        "rules": [rule(10.0, 1e6)]}),
    );
    let body = json!({"model": "something-else", "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
    let c = e.send(
        "/openai/deployments/prod-4o/chat/completions?api-version=2024-10-21",
        &[TENANT],
        &body,
    );
    assert!(c.forwarded);
    assert_eq!(c.audit_field("model").as_deref(), Some("gpt-4o"));
    let c = e.send(
        "/openai/deployments/other/chat/completions",
        &[TENANT],
        &body,
    );
    assert_eq!(c.status(), Some(400));
    assert_eq!(c.reply_json()["error"]["code"], "unknown_deployment");
    assert!(!c.upstream_started);
}
