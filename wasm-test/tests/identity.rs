//! Tenant identity a client cannot forge, through the SHIPPED `envoy/envoy.yaml`.
//!
//! The bootstrap is rendered as shipped, with only ports and paths changed (listener, admin, the `provider`,
//! `provider_fallback` and `webdis` clusters, the wasm path and the access log file), so the filter chain
//! under test is the one users run: `jwt_authn` (a valid token in `x-tokengate-jwt` writes its payload to
//! the dynamic metadata; a bad one is refused with 401), then tokengate with the shipped plugin
//! configuration (`tenant_claim: tenant`, `api_key_tenants: true`, monthly quotas in Redis behind Webdis).
//! No request header carries identity: a client's `x-tenant-id` names nobody.
//!
//! Charges are read where they land: the quota counters in Redis (`tg:q:{<tenant>}:<month>`) and the
//! audit record of the access log (`tenant=…`). Test tokens are HS256, minted (tests/jwt) with the demo
//! key of the shipped `local_jwks`.

mod jwt;
mod shipped;

use std::time::{SystemTime, UNIX_EPOCH};

use jwt::{base64url, base64url_decode, hex, hmac_sha256, mint, shipped_demo_key};
use serde_json::json;
use sha2::{Digest, Sha256};
use shipped::ShippedEnvoy;
use wasm_test::{
    free_port, mock_provider, redis_cmd, MockProvider, RedisServer, RespValue, Webdis,
};

/// The whole stack: mock provider, Redis, Webdis and the shipped Envoy.
struct Stack {
    mock: MockProvider,
    redis: RedisServer,
    _webdis: Webdis,
    envoy: ShippedEnvoy,
}

impl Stack {
    fn start() -> Stack {
        let mock = mock_provider!();
        let redis = RedisServer::start();
        let webdis = Webdis::start(redis.port);
        // The fallback cluster points at a port nobody listens on: these tests never open a breaker.
        let envoy = ShippedEnvoy::start(mock.port, free_port(), webdis.port);
        Stack {
            mock,
            redis,
            _webdis: webdis,
            envoy,
        }
    }

    /// Redis keys of one tenant's quota (`tg:q:{<tenant>}*`).
    fn quota_keys(&self, tenant: &str) -> Vec<String> {
        match redis_cmd(self.redis.port, &["KEYS", &format!("tg:q:{{{tenant}}}*")]) {
            Ok(RespValue::Array(Some(items))) => items.iter().filter_map(|v| v.as_str()).collect(),
            other => panic!("KEYS: {other:?}"),
        }
    }

    /// What the tenant was charged this month (`tg:q:{<tenant>}:<YYYY-MM>`), 0 when absent.
    fn used_this_month(&self, tenant: &str) -> i64 {
        self.quota_keys(tenant)
            .iter()
            .filter(|k| {
                let month = k.rsplit(':').next().unwrap_or("");
                month.len() == 7 && month.as_bytes().get(4) == Some(&b'-')
            })
            .map(|k| {
                redis_cmd(self.redis.port, &["GET", k])
                    .ok()
                    .and_then(|v| v.as_int())
                    .unwrap_or(0)
            })
            .sum()
    }
}

// ---------------------------------------------------------------------------------------------
// Tenants and tokens
// ---------------------------------------------------------------------------------------------

/// The tenant the filter derives from an API key: `key:<first 16 hex of SHA-256(key)>`.
fn key_tenant(key: &str) -> String {
    format!("key:{}", &hex(&Sha256::digest(key.as_bytes()))[..16])
}

/// The tenant of an access log line's audit record (`… audit=tenant=<t> model=…`).
fn audit_tenant(line: &str) -> Option<&str> {
    line.split(" audit=")
        .nth(1)?
        .split(' ')
        .find_map(|part| part.strip_prefix("tenant="))
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn helpers_match_known_values() {
    // RFC 4231 test case 2 and the base64url alphabet.
    assert_eq!(
        hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    assert_eq!(base64url(b"\xfb\xff"), "-_8");
    assert_eq!(base64url_decode("-_8"), b"\xfb\xff");
    assert_eq!(base64url_decode(&base64url(b"tokengate!")), b"tokengate!");
    assert!(key_tenant("sk-alice").starts_with("key:") && key_tenant("sk-alice").len() == 20);
}

#[test]
fn a_client_sent_tenant_header_names_nobody_and_the_api_key_tenant_is_charged() {
    let s = Stack::start();
    let alice = key_tenant("sk-alice");
    let r = s.envoy.chat(
        &[
            ("authorization", "Bearer sk-alice"),
            ("x-tenant-id", "demo-quota"),
        ],
        64,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        s.used_this_month(&alice) > 0,
        "alice's key tenant {alice} was not charged; keys: {:?}",
        s.quota_keys(&alice)
    );
    assert_eq!(
        s.quota_keys("demo-quota"),
        Vec::<String>::new(),
        "the client-chosen tenant demo-quota was touched"
    );
    let lines = s.envoy.audit_lines(1);
    assert_eq!(
        lines
            .iter()
            .filter_map(|l| audit_tenant(l))
            .collect::<Vec<_>>(),
        [alice.as_str()],
        "audit: {lines:?}"
    );
    let seen = s.mock.requests();
    assert_eq!(seen.len(), 1);
}

#[test]
fn a_forged_key_tenant_header_does_not_charge_the_keys_owner() {
    let s = Stack::start();
    let bob = key_tenant("sk-bob");
    let mallory = key_tenant("sk-mallory");
    for _ in 0..3 {
        let r = s.envoy.chat(
            &[
                ("authorization", "Bearer sk-mallory"),
                ("x-tenant-id", bob.as_str()),
            ],
            64,
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        s.quota_keys(&bob),
        Vec::<String>::new(),
        "bob's key tenant was charged for mallory's requests"
    );
    assert!(s.used_this_month(&mallory) > 0, "mallory was not charged");
    // Without a key, the forged header alone is no identity at all: the filter's 401.
    let r = s.envoy.chat(&[("x-tenant-id", bob.as_str())], 64);
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(s.quota_keys(&bob), Vec::<String>::new());
}

#[test]
fn a_junk_bearer_key_next_to_a_real_x_api_key_names_no_tenant() {
    // Anthropic bills the x-api-key; a junk bearer token beside it must not become the tenant that is
    // charged (a fresh one per request would escape every limit).
    let s = Stack::start();
    let junk = key_tenant("junk-1");
    let real = key_tenant("sk-ant-real");
    let body = json!({"model": "claude-sonnet-4.5", "max_tokens": 64,
                      "messages": [{"role": "user", "content": "Say hello."}]});
    let r = wasm_test::http::post(
        s.envoy.port,
        "/v1/messages",
        &[
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "sk-ant-real"),
            ("authorization", "Bearer junk-1"),
        ],
        body.to_string().as_bytes(),
    )
    .expect("POST /v1/messages");
    assert_eq!(r.status, 401, "{}", r.text());
    let j: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
    assert_eq!(j["type"], "error", "Anthropic's shape: {j}");
    assert_eq!(j["error"]["type"], "authentication_error", "{j}");
    assert!(s.mock.requests().is_empty(), "nothing reached the provider");
    assert_eq!(s.quota_keys(&junk), Vec::<String>::new());
    assert_eq!(s.quota_keys(&real), Vec::<String>::new());
    // The same header twice with different keys: the upstream may read either line.
    let r = wasm_test::http::post(
        s.envoy.port,
        "/v1/messages",
        &[
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "sk-ant-aaa"),
            ("x-api-key", "sk-ant-bbb"),
        ],
        body.to_string().as_bytes(),
    )
    .expect("POST /v1/messages");
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(s.mock.requests().is_empty(), "nothing reached the provider");
    // `Authorization` twice (bb13): Envoy joins the two lines into one value, `Bearer k1,Bearer
    // k2`, which was charged to a third tenant, a new one for every second key.
    let joined = key_tenant("sk-a,Bearer sk-b");
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let r = wasm_test::http::post(
            s.envoy.port,
            path,
            &[
                ("content-type", "application/json"),
                ("anthropic-version", "2023-06-01"),
                ("authorization", "Bearer sk-a"),
                ("authorization", "Bearer sk-b"),
            ],
            body.to_string().as_bytes(),
        )
        .expect("POST");
        assert_eq!(r.status, 401, "{path}: {}", r.text());
        assert_eq!(
            r.header("x-tokengate-reason"),
            Some("missing_tenant"),
            "{path}"
        );
    }
    assert!(s.mock.requests().is_empty(), "nothing reached the provider");
    assert_eq!(s.quota_keys(&joined), Vec::<String>::new());
    // The same key in both headers is one identity.
    let r = s.envoy.chat(
        &[
            ("authorization", "Bearer sk-ant-real"),
            ("x-api-key", "sk-ant-real"),
        ],
        64,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(s.used_this_month(&real) > 0);
}

#[test]
fn rotating_tenant_headers_does_not_escape_an_exhausted_tenant() {
    let s = Stack::start();
    let carol = key_tenant("sk-carol");
    // The operator's override: carol's month allows 10 tokens, less than any request.
    let set = redis_cmd(
        s.redis.port,
        &["SET", &format!("tg:q:{{{carol}}}:limit"), "10"],
    );
    assert_eq!(set, Ok(RespValue::Simple("OK".into())));
    let r = s.envoy.chat(&[("authorization", "Bearer sk-carol")], 64);
    assert_eq!(r.status, 429, "{}", r.text());
    for i in 0..8 {
        let forged = format!("rotated-{i}");
        let r = s.envoy.chat(
            &[
                ("authorization", "Bearer sk-carol"),
                ("x-tenant-id", forged.as_str()),
            ],
            64,
        );
        assert_eq!(r.status, 429, "x-tenant-id {forged}: {}", r.text());
        assert_eq!(s.quota_keys(&forged), Vec::<String>::new());
    }
    assert_eq!(
        s.mock.requests().len(),
        0,
        "an exhausted tenant reached the provider"
    );
}

#[test]
fn a_valid_jwt_sets_the_tenant_even_when_the_client_sent_the_header() {
    let s = Stack::start();
    let key = shipped_demo_key();
    let token = mint(
        &key,
        json!({"sub": "u1", "tenant": "team-jwt", "group": "research"}),
    );
    let r = s.envoy.chat(
        &[
            ("authorization", "Bearer sk-alice"),
            ("x-tenant-id", "demo-quota"),
            ("x-tokengate-group", "admins"),
            ("x-tokengate-jwt", token.as_str()),
        ],
        64,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        s.used_this_month("team-jwt") > 0,
        "team-jwt was not charged"
    );
    assert_eq!(s.quota_keys("demo-quota"), Vec::<String>::new());
    assert_eq!(s.quota_keys(&key_tenant("sk-alice")), Vec::<String>::new());
    let lines = s.envoy.audit_lines(1);
    assert_eq!(
        lines
            .iter()
            .filter_map(|l| audit_tenant(l))
            .collect::<Vec<_>>(),
        ["team-jwt"],
        "audit: {lines:?}"
    );
    let seen = s.mock.requests();
    assert_eq!(seen.len(), 1);
    // No verified claim leaks upstream (none is copied into a header), and the token is not forwarded.
    for (k, v) in &seen[0].headers {
        assert!(
            !v.contains("team-jwt") && !v.contains("research"),
            "the provider saw a claim in {k}: {v}"
        );
    }
    assert_eq!(seen[0].header("x-tokengate-jwt"), None);
    assert_eq!(s.envoy.stat("http.tokengate.jwt_authn.allowed"), 1);
}

#[test]
fn a_verified_claim_that_is_not_an_id_is_refused_with_403() {
    // Before: claim_to_headers turned a number into its text and a list into a comma-joined header;
    // a claim of the wrong type could charge an unintended tenant.
    let s = Stack::start();
    let key = shipped_demo_key();
    for (claim, status) in [
        (json!(12.5), 403),
        (json!(["a", "b"]), 403),
        (json!({"id": "a"}), 403),
        (json!(true), 403),
        (json!("two words"), 403),
        (json!(4242), 200),
        (json!(["only-one"]), 200),
    ] {
        let token = mint(&key, json!({"sub": "u1", "tenant": claim}));
        let r = s.envoy.chat(&[("x-tokengate-jwt", token.as_str())], 16);
        assert_eq!(r.status, status, "tenant claim {claim}: {}", r.text());
        if status == 403 {
            assert_eq!(
                r.header("x-tokengate-reason"),
                Some("invalid_identity_claim"),
                "{claim}"
            );
        }
    }
    assert!(s.used_this_month("4242") > 0);
    assert!(s.used_this_month("only-one") > 0);
    assert_eq!(s.mock.requests().len(), 2);
}

#[test]
fn a_verified_claim_naming_a_key_tenant_is_refused_with_403_and_charges_nobody() {
    // Before: a token whose tenant claim was `key:<hash>` was admitted and charged to that key's tenant
    // (the README says a `key:` tenant cannot be named).
    let s = Stack::start();
    let key = shipped_demo_key();
    let bob = key_tenant("sk-bob");
    for claim in [bob.as_str(), "key:0123456789abcdef", "KEY:x"] {
        let token = mint(&key, json!({"sub": "u1", "tenant": claim}));
        let r = s.envoy.chat(&[("x-tokengate-jwt", token.as_str())], 16);
        assert_eq!(r.status, 403, "tenant claim {claim}: {}", r.text());
        assert_eq!(
            r.header("x-tokengate-reason"),
            Some("forbidden_tenant"),
            "{claim}"
        );
        let j: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
        assert_eq!(j["error"]["code"], "forbidden_tenant", "{j}");
    }
    assert!(s.mock.requests().is_empty(), "nothing reached the provider");
    assert_eq!(s.quota_keys(&bob), Vec::<String>::new());
    assert_eq!(s.quota_keys("key:0123456789abcdef"), Vec::<String>::new());
}

#[test]
fn a_token_with_a_bad_signature_or_wrong_issuer_gets_401_from_jwt_authn() {
    let s = Stack::start();
    let good = shipped_demo_key();
    let mut wrong = good.clone();
    wrong[0] ^= 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let cases = [
        ("bad signature", mint(&wrong, json!({"tenant": "team-jwt"}))),
        (
            "wrong issuer",
            mint(&good, json!({"tenant": "team-jwt", "iss": "someone-else"})),
        ),
        (
            "expired",
            mint(&good, json!({"tenant": "team-jwt", "exp": now - 600})),
        ),
        ("not a JWT", "not-a-token".to_string()),
        ("alg none", {
            let h = base64url(br#"{"alg":"none","typ":"JWT"}"#);
            let p = base64url(
                json!({"tenant": "team-jwt", "iss": "tokengate-demo", "aud": "tokengate", "exp": now + 300})
                    .to_string()
                    .as_bytes(),
            );
            format!("{h}.{p}.")
        }),
    ];
    for (what, token) in &cases {
        let r = s.envoy.chat(
            &[
                ("authorization", "Bearer sk-alice"),
                ("x-tenant-id", "team-jwt"),
                ("x-tokengate-jwt", token.as_str()),
            ],
            16,
        );
        assert_eq!(r.status, 401, "{what}: {}", r.text());
        // jwt_authn's own answer (plain text), not the filter's JSON missing_tenant.
        assert!(
            r.text().starts_with("Jwt"),
            "{what}: 401 not from jwt_authn: {}",
            r.text()
        );
    }
    assert_eq!(
        s.envoy.stat("http.tokengate.jwt_authn.denied"),
        cases.len() as u64
    );
    assert_eq!(s.mock.requests().len(), 0);
    assert_eq!(s.quota_keys("team-jwt"), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// The official SDKs of the other families (the shipped chain, their own credentials)
// ---------------------------------------------------------------------------------------------

/// The shipped chain with a plugin configuration of hashed key tenants and Azure's deployment map.
fn families_envoy(mock: &MockProvider, dir: &wasm_test::TempDir) -> ShippedEnvoy {
    let cfg = json!({
        "tenant_claim": "tenant", "api_key_tenants": true,
        "rules": [{"name": "all", "tenant": "*", "model": "*",
                   "tokens_per_second": 1_000_000, "burst": 100_000_000}],
        "azure_openai": {"deployments": {"dep-1": "gpt-4o"}}
    });
    let shipped = std::fs::read_to_string(wasm_test::repo_root().join("envoy/envoy.yaml"))
        .expect("envoy.yaml");
    let file = dir.path().join("envoy.yaml");
    std::fs::write(&file, shipped::with_plugin_config(&shipped, &cfg)).expect("write envoy.yaml");
    ShippedEnvoy::start_file(&file, mock.port, free_port(), free_port())
}

#[test]
fn each_sdk_is_charged_as_the_credential_its_provider_checks_and_a_forged_key_header_changes_nothing(
) {
    // The tester's finding: with hashed key tenants, `x-api-key: r1` next to google-genai's
    // x-goog-api-key was charged as a fresh tenant key:<hash(r1)>, r2 as another.
    let mock = mock_provider!();
    let dir = wasm_test::TempDir::new("identity-families");
    let envoy = families_envoy(&mock, &dir);
    let cases: [(&str, &[&str], &str); 5] = [
        ("azure-chat", &["--model", "dep-1"], "azure-real-key"),
        ("gemini-generate", &[], "AIza-real-key"),
        ("gemini-generate", &["--key-in-query"], "AIza-real-key"),
        ("vertex-generate", &[], "ya29.real-oauth-token"),
        ("bedrock-converse", &[], "AKIAREALEXAMPLE1"),
    ];
    let forged: [&[&str]; 5] = [
        &[],
        &["--header", "x-api-key=r1"],
        &["--header", "x-api-key=r2"],
        &["--header", "api-key=r3"],
        &["--header", "x-goog-api-key=r4"],
    ];
    let mut calls = Vec::new();
    let mut want = Vec::new();
    for (scenario, args, cred) in cases {
        for extra in forged {
            // Azure's own header, Gemini's own header: forging them is two keys (below), not ignored.
            let own = match scenario {
                "azure-chat" => "api-key=",
                "bedrock-converse" => "",
                _ => "x-goog-api-key=",
            };
            if !own.is_empty() && extra.iter().any(|a| a.starts_with(own)) {
                continue;
            }
            let mut a = vec!["--tenant", "", "--api-key", cred];
            a.extend_from_slice(args);
            a.extend_from_slice(extra);
            calls.push(wasm_test::sdk::call(scenario, &a));
            want.push((scenario, extra, key_tenant(cred)));
        }
    }
    let got = wasm_test::sdk::drive(envoy.port, &calls);
    for (g, (scenario, extra, _)) in got.iter().zip(&want) {
        assert_eq!(g["ok"], true, "{scenario} {extra:?}: {g}");
    }
    let lines = envoy.audit_lines(want.len());
    let tenants: Vec<&str> = lines.iter().filter_map(|l| audit_tenant(l)).collect();
    let expected: Vec<&str> = want.iter().map(|w| w.2.as_str()).collect();
    assert_eq!(tenants, expected, "audit: {lines:?}");
    assert_eq!(mock.requests().len(), want.len());

    // The family's own credentials that differ: which one the provider checks is not known, so no
    // tenant is charged (401, nothing reaches the provider).
    let two: [(&str, &[&str]); 4] = [
        (
            "gemini-generate",
            &["--header", "authorization=Bearer forged"],
        ),
        (
            "gemini-generate",
            &["--key-in-query", "--header", "authorization=Bearer forged"],
        ),
        (
            "azure-chat",
            &[
                "--model",
                "dep-1",
                "--header",
                "authorization=Bearer forged",
            ],
        ),
        ("vertex-generate", &["--header", "x-goog-api-key=forged"]),
    ];
    let calls: Vec<Vec<String>> = two
        .iter()
        .map(|(scenario, extra)| {
            let mut a = vec![
                "--tenant",
                "",
                "--api-key",
                "real-key",
                "--max-retries",
                "0",
            ];
            a.extend_from_slice(extra);
            wasm_test::sdk::call(scenario, &a)
        })
        .collect();
    let got = wasm_test::sdk::drive(envoy.port, &calls);
    for (g, (scenario, extra)) in got.iter().zip(&two) {
        assert_eq!(g["ok"], false, "{scenario} {extra:?}: {g}");
        assert_eq!(g["status_code"], 401, "{scenario} {extra:?}: {g}");
    }
    assert_eq!(
        mock.requests().len(),
        want.len(),
        "nothing more reached the provider"
    );
}
