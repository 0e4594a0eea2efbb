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

/// The new families' paths and bodies (Azure deployment and v1, Gemini, Vertex AI, Claude on Vertex,
/// Bedrock).
const AZURE: &str = "/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21";
const AZURE_V1: &str = "/openai/v1/chat/completions";
const GEMINI: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const VERTEX: &str =
    "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent";
const VERTEX_CLAUDE: &str =
    "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-3-5-haiku:rawPredict";
const CONVERSE: &str = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse";
const SIGV4: &str = "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20261207/us-east-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=0123abcd";

fn body_for(path: &str) -> String {
    if path.contains(":rawPredict") {
        r#"{"anthropic_version":"vertex-2023-10-16","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#.into()
    } else if path.contains(":generateContent") {
        json!({"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 5}})
            .to_string()
    } else if path.contains("/converse") {
        json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}], "inferenceConfig": {"maxTokens": 5}})
            .to_string()
    } else {
        chat("gpt-4o", "hi", 5)
    }
}

/// The tenant a request is charged as (`Err`: the status and audit decision of its refusal).
fn tenant_of(
    e: &crate::flow::fake::FakeEnvoy,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<String, String> {
    let mut c = e.send(path, headers, &body_for(path));
    if !c.forwarded {
        clean(&c);
        assert!(!c.upstream_started);
        assert!(matches!(c.status(), Some(401 | 403)), "{:?}", c.status());
        return Err(c.audit_field("decision").unwrap_or_default());
    }
    e.respond(&mut c, 200, &[], &["{}"]);
    clean(&c);
    Ok(c.audit_field("tenant").unwrap_or_default())
}

fn key_envoy() -> crate::flow::fake::FakeEnvoy {
    envoy(json!({"rules": [rule(10.0, 1e6)], "azure_openai": {"deployments": {"gpt4o": "gpt-4o"}}}))
}

#[test]
fn each_family_charges_the_credential_its_provider_checks_and_ignores_the_others() {
    // The tester's repro: x-goog-api-key REAL with x-api-key r1, then r2, were two fresh tenants.
    let e = key_envoy();
    let real = crate::identity::tenant_from_key("REAL");
    let akid = crate::identity::tenant_from_key("AKIAIOSFODNN7EXAMPLE");
    let sigv4_b = SIGV4.replace("0123abcd", "ffff9999");
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a String);
    let cases: Vec<Case> = vec![
        (GEMINI, vec![("x-goog-api-key", "REAL")], &real),
        (
            GEMINI,
            vec![("x-goog-api-key", "REAL"), ("x-api-key", "r1")],
            &real,
        ),
        (
            GEMINI,
            vec![
                ("x-goog-api-key", "REAL"),
                ("x-api-key", "r2"),
                ("api-key", "r3"),
            ],
            &real,
        ),
        (
            "/v1beta/models/gemini-2.5-flash:generateContent?key=REAL",
            vec![("x-api-key", "r1")],
            &real,
        ),
        // Percent-encoding, the parameter's case, the same key twice: one key as Google reads it.
        (
            "/v1beta/models/gemini-2.5-flash:generateContent?alt=sse&KEY=R%45AL&key=REAL",
            vec![("x-goog-api-key", "REAL")],
            &real,
        ),
        (
            VERTEX,
            vec![("authorization", "Bearer REAL"), ("x-api-key", "r1")],
            &real,
        ),
        (
            VERTEX_CLAUDE,
            vec![("authorization", "Bearer REAL"), ("x-api-key", "r1")],
            &real,
        ),
        (AZURE, vec![("api-key", "REAL"), ("x-api-key", "r1")], &real),
        (
            AZURE,
            vec![("authorization", "Bearer REAL"), ("x-api-key", "r1")],
            &real,
        ),
        (
            AZURE_V1,
            vec![
                ("api-key", "REAL"),
                ("x-api-key", "r1"),
                ("x-goog-api-key", "r2"),
            ],
            &real,
        ),
        (
            CONVERSE,
            vec![("authorization", SIGV4), ("x-api-key", "r1")],
            &akid,
        ),
        // Another signature by the same access key: the same tenant.
        (CONVERSE, vec![("authorization", sigv4_b.as_str())], &akid),
        (
            CONVERSE,
            vec![("authorization", "Bearer REAL"), ("x-api-key", "r1")],
            &real,
        ),
        // OpenAI-compatible and Anthropic paths read as before: the family's own headers.
        (
            "/v1/chat/completions",
            vec![
                ("authorization", "Bearer REAL"),
                ("x-goog-api-key", "r1"),
                ("api-key", "r2"),
            ],
            &real,
        ),
        (
            "/v1/messages",
            vec![("x-api-key", "REAL"), ("x-goog-api-key", "r1")],
            &real,
        ),
    ];
    for (path, headers, want) in &cases {
        assert_eq!(
            tenant_of(&e, path, headers).as_ref(),
            Ok(*want),
            "{path} {headers:?}"
        );
    }
    // A header the provider ignores names no tenant on its own.
    for (path, headers) in [
        (GEMINI, vec![("x-api-key", "r1")]),
        (GEMINI, vec![("api-key", "r1")]),
        (AZURE, vec![("x-api-key", "r1")]),
        (AZURE_V1, vec![("x-goog-api-key", "r1")]),
        (CONVERSE, vec![("x-api-key", "r1")]),
        (
            CONVERSE,
            vec![(
                "authorization",
                "AWS4-HMAC-SHA256 SignedHeaders=host, Signature=00",
            )],
        ),
        ("/v1/chat/completions", vec![("api-key", "r1")]),
        ("/v1/chat/completions?key=r1", vec![]),
    ] {
        assert_eq!(
            tenant_of(&e, path, &headers),
            Err("no_tenant".to_string()),
            "{path} {headers:?}"
        );
    }
}

#[test]
fn the_same_familys_credentials_that_differ_are_two_keys() {
    let e = key_envoy();
    let two = Err("two_api_keys".to_string());
    let other_akid = SIGV4.replace("AKIAIOSFODNN7EXAMPLE", "AKIAOTHER");
    let joined = format!("{SIGV4}, {other_akid}");
    for (path, headers) in [
        (GEMINI, vec![("x-goog-api-key", "REAL"), ("authorization", "Bearer other")]),
        ("/v1beta/models/gemini-2.5-flash:generateContent?key=other", vec![("x-goog-api-key", "REAL")]),
        ("/v1beta/models/gemini-2.5-flash:generateContent?key=a&key=b", vec![]),
        ("/v1beta/models/gemini-2.5-flash:generateContent?key=a;%6Bey=b", vec![]),
        ("/v1beta/models/gemini-2.5-flash:generateContent?access_token=a&key=b", vec![]),
        (GEMINI, vec![("x-goog-api-key", "a"), ("x-goog-api-key", "b")]),
        (GEMINI, vec![("x-goog-api-key", "a, b")]),
        (VERTEX, vec![("authorization", "Bearer a"), ("authorization", "Bearer b")]),
        (AZURE, vec![("api-key", "REAL"), ("authorization", "Bearer other")]),
        (AZURE, vec![("api-key", "a"), ("api-key", "b")]),
        (CONVERSE, vec![("authorization", SIGV4), ("authorization", other_akid.as_str())]),
        (CONVERSE, vec![("authorization", joined.as_str())]),
        (CONVERSE, vec![("authorization", "AWS4-HMAC-SHA256 Credential=A/x, Credential=B/y, Signature=0")]),
        ("/model/m/converse?X-Amz-Credential=AKIAOTHER%2F20261207%2Fus-east-1%2Fbedrock%2Faws4_request", vec![("authorization", SIGV4)]),
    ] {
        assert_eq!(tenant_of(&e, path, &headers), two, "{path} {headers:?}");
    }
    // The same credential in two places, or twice: one key.
    let real = Ok(crate::identity::tenant_from_key("REAL"));
    for (path, headers) in [
        (
            "/v1beta/models/gemini-2.5-flash:generateContent?key=REAL",
            vec![("x-goog-api-key", "REAL")],
        ),
        (
            AZURE,
            vec![("api-key", "REAL"), ("authorization", "Bearer REAL")],
        ),
        (
            GEMINI,
            vec![("x-goog-api-key", "REAL"), ("x-goog-api-key", "REAL")],
        ),
    ] {
        assert_eq!(tenant_of(&e, path, &headers), real, "{path} {headers:?}");
    }
    let joined = format!("{SIGV4}, {SIGV4}");
    assert_eq!(
        tenant_of(&e, CONVERSE, &[("authorization", joined.as_str())]),
        Ok(crate::identity::tenant_from_key("AKIAIOSFODNN7EXAMPLE"))
    );
}

#[test]
fn listed_keys_are_read_where_each_family_puts_them() {
    let e = envoy(json!({
    "rules": [rule(10.0, 1e6)],
    "azure_openai": {"deployments": {"gpt4o": "gpt-4o"}},
    "api_keys": {
        "alice": [digest("AIza-alice")],
        "bob": [digest("AKIAIOSFODNN7EXAMPLE")],
        "carol": [digest("azure-carol")],
    }}));
    let ok = |t: &str| Ok(t.to_string());
    assert_eq!(
        tenant_of(
            &e,
            GEMINI,
            &[("x-goog-api-key", "AIza-alice"), ("x-api-key", "junk")]
        ),
        ok("alice")
    );
    assert_eq!(
        tenant_of(
            &e,
            "/v1beta/models/gemini-2.5-flash:generateContent?key=AIza-alice",
            &[]
        ),
        ok("alice")
    );
    assert_eq!(
        tenant_of(
            &e,
            CONVERSE,
            &[("authorization", SIGV4), ("x-api-key", "junk")]
        ),
        ok("bob")
    );
    assert_eq!(
        tenant_of(
            &e,
            AZURE,
            &[("api-key", "azure-carol"), ("x-api-key", "junk")]
        ),
        ok("carol")
    );
    // A listed key in a header the provider ignores is no key there.
    assert_eq!(
        tenant_of(&e, GEMINI, &[("x-api-key", "AIza-alice")]),
        Err("no_tenant".to_string())
    );
    assert_eq!(
        tenant_of(&e, GEMINI, &[("x-goog-api-key", "AIza-mallory")]),
        Err("unknown_api_key".to_string())
    );
}

#[test]
fn a_verified_claim_naming_a_key_tenant_is_refused_as_the_header_is() {
    let mut e = envoy(json!({"tenant_claim": "tenant", "rules": [rule(10.0, 1e6)]}));
    let forged = crate::identity::tenant_from_key("sk-bob");
    for t in [forged.as_str(), "key:0123456789abcdef", "KEY:x"] {
        verified(&mut e, &[("tenant", t.as_bytes())]);
        let c = e.send("/v1/chat/completions", &[], &chat("m", "hi", 5));
        clean(&c);
        assert_eq!(c.status(), Some(403), "{t}");
        assert_eq!(c.reply_json()["error"]["code"], "forbidden_tenant");
        assert_eq!(
            c.audit_field("decision").as_deref(),
            Some("forbidden_tenant")
        );
        assert!(!c.upstream_started);
    }
    verified(&mut e, &[("tenant", b"keyholder")]);
    assert_eq!(
        tenant_of(&e, "/v1/chat/completions", &[]),
        Ok("keyholder".to_string())
    );
}
