use super::*;

const NOW_MS: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

fn headers(r: &LocalReply) -> Vec<(&str, &str)> {
    r.headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn body(r: &LocalReply) -> &str {
    std::str::from_utf8(&r.body).unwrap()
}

fn bucket_limits() -> Limits {
    Limits {
        tokens: Some(Trio {
            limit: 2000,
            remaining: 120,
            reset_s: 0.9401,
        }),
        requests: Some(Trio {
            limit: 600,
            remaining: 14,
            reset_s: 4.6,
        }),
        ..Limits::default()
    }
}

#[test]
fn go_durations_match_what_time_parse_duration_reads() {
    let cases = [
        (0, "0s"),
        (1, "1ms"),
        (20, "20ms"),
        (999, "999ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (1251, "1.251s"),
        (1010, "1.01s"),
        (59_999, "59.999s"),
        (60_000, "1m0s"),
        (90_500, "1m30.5s"),
        (360_000, "6m0s"),
        (3_600_000, "1h0m0s"),
        (3_661_001, "1h1m1.001s"),
        (u64::MAX, "5124095576030h25m51.615s"),
    ];
    for (ms, want) in cases {
        assert_eq!(go_duration(ms).as_str(), want, "{ms}");
    }
    assert_eq!(ceil_ms(0.0001), 1);
    assert_eq!(ceil_ms(-1.0), 0);
    assert_eq!(ceil_ms(f64::NAN), 0);
    assert_eq!(ceil_ms(f64::INFINITY), 0);
}

#[test]
fn rfc3339_times_are_utc_and_cross_month_year_and_leap_days() {
    let cases = [
        (0, "1970-01-01T00:00:00Z"),
        (951_782_400, "2000-02-29T00:00:00Z"),
        (1_709_251_199, "2024-02-29T23:59:59Z"),
        (1_709_251_200, "2024-03-01T00:00:00Z"),
        (1_767_225_599, "2025-12-31T23:59:59Z"),
        (1_767_225_600, "2026-01-01T00:00:00Z"),
        (-1, "1969-12-31T23:59:59Z"),
        (253_402_300_799, "9999-12-31T23:59:59Z"),
    ];
    for (s, want) in cases {
        assert_eq!(rfc3339(s).as_str(), want, "{s}");
    }
}

#[test]
fn an_openai_bucket_refusal_is_exactly_openais_shape() {
    let r = Refusal {
        retry_after_s: Some(1.2501),
        limits: Some(bucket_limits()),
        estimated: Some(900),
        limit_name: Some("team-a".into()),
        ..Refusal::new(
            Class::TokensPerSecond,
            "Rate limit reached for tenant 't' on tokens per second (rule 'team-a').",
        )
    };
    let out = render(Family::OpenAi, &r, "req-1", NOW_MS);
    assert_eq!(out.status, 429);
    assert_eq!(
        headers(&out),
        [
            ("content-type", "application/json"),
            ("x-request-id", "req-1"),
            ("x-tokengate-reason", "tokens_per_second_exceeded"),
            ("retry-after", "2"),
            ("retry-after-ms", "1251"),
            ("x-should-retry", "true"),
            ("x-ratelimit-limit-requests", "600"),
            ("x-ratelimit-remaining-requests", "14"),
            ("x-ratelimit-reset-requests", "4.6s"),
            ("x-ratelimit-limit-tokens", "2000"),
            ("x-ratelimit-remaining-tokens", "120"),
            ("x-ratelimit-reset-tokens", "941ms"),
            ("x-tokengate-estimated-tokens", "900"),
            ("x-tokengate-limit", "team-a"),
        ]
    );
    assert_eq!(
        body(&out),
        r#"{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached for tenant 't' on tokens per second (rule 'team-a'). Please try again in 1.251s.","param":null,"type":"tokens"},"tokengate":{"estimated_tokens":900,"limit":"team-a","reason":"tokens_per_second_exceeded","retry_after":1.251}}"#
    );
}

#[test]
fn an_anthropic_bucket_refusal_is_exactly_anthropics_shape() {
    let r = Refusal {
        retry_after_s: Some(0.2),
        limits: Some(bucket_limits()),
        ..Refusal::new(Class::TokensPerSecond, "Slow down.")
    };
    let out = render(Family::Anthropic, &r, "req-2", NOW_MS + 500);
    assert_eq!(out.status, 429);
    assert_eq!(
        headers(&out),
        [
            ("content-type", "application/json"),
            ("request-id", "req-2"),
            ("x-tokengate-reason", "tokens_per_second_exceeded"),
            ("retry-after", "1"),
            ("retry-after-ms", "200"),
            ("x-should-retry", "true"),
            ("anthropic-ratelimit-requests-limit", "600"),
            ("anthropic-ratelimit-requests-remaining", "14"),
            // now + 0.5 s + 4.6 s = 5.1 s, rounded up.
            ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:06Z"),
            ("anthropic-ratelimit-tokens-limit", "2000"),
            ("anthropic-ratelimit-tokens-remaining", "120"),
            ("anthropic-ratelimit-tokens-reset", "2026-01-01T00:00:02Z"),
        ]
    );
    assert_eq!(
        body(&out),
        r#"{"error":{"details":{"error_code":"tokens_per_second_exceeded"},"message":"Slow down.","type":"rate_limit_error"},"request_id":"req-2","tokengate":{"reason":"tokens_per_second_exceeded","retry_after":0.2},"type":"error"}"#
    );
}

#[test]
fn a_spent_quota_forbids_retries_and_keeps_its_reset_out_of_retry_after() {
    let q = QuotaView {
        limit: 120_000,
        remaining: 0,
        reset_unix_s: 1_769_904_000, // 2026-02-01
        reset_in_s: 2_678_400,
        currency: None,
    };
    let r = Refusal {
        retry_after_s: Some(2_678_400.0),
        quota: Some(q),
        ..Refusal::new(Class::QuotaExceeded, "The monthly token quota is used up.")
    };
    let out = render(Family::OpenAi, &r, "q-1", NOW_MS);
    assert_eq!(out.status, 429);
    assert_eq!(
        headers(&out),
        [
            ("content-type", "application/json"),
            ("x-request-id", "q-1"),
            ("x-tokengate-reason", "monthly_quota_exceeded"),
            ("x-should-retry", "false"),
            ("x-tokengate-quota-limit", "120000"),
            ("x-tokengate-quota-remaining", "0"),
            ("x-tokengate-quota-reset", "2678400"),
        ]
    );
    assert_eq!(
        body(&out),
        r#"{"error":{"code":"insufficient_quota","message":"The monthly token quota is used up.","param":null,"type":"insufficient_quota"},"tokengate":{"quota":{"limit":120000,"remaining":0,"reset_at":"2026-02-01T00:00:00Z","reset_in":2678400},"reason":"monthly_quota_exceeded"}}"#
    );
    let out = render(Family::Anthropic, &r, "q-2", NOW_MS);
    assert_eq!(out.status, 429);
    assert!(out
        .headers
        .iter()
        .all(|(k, _)| !k.starts_with("retry-after")));
    assert_eq!(
        body(&out),
        r#"{"error":{"details":{"error_code":"monthly_quota_exceeded"},"message":"The monthly token quota is used up.","type":"rate_limit_error"},"request_id":"q-2","tokengate":{"quota":{"limit":120000,"remaining":0,"reset_at":"2026-02-01T00:00:00Z","reset_in":2678400},"reason":"monthly_quota_exceeded"},"type":"error"}"#
    );
}

/// The contract table, written out by hand: class, OpenAI status/type/code, Anthropic status/type,
/// retryable.
const TABLE: [(Class, u32, &str, &str, u32, &str, bool); 21] = [
    (
        Class::InvalidClaim,
        403,
        "invalid_request_error",
        "invalid_identity_claim",
        403,
        "permission_error",
        false,
    ),
    (
        Class::IdentityConflict,
        401,
        "invalid_request_error",
        "identity_conflict",
        401,
        "authentication_error",
        false,
    ),
    (
        Class::ModelRequired,
        400,
        "invalid_request_error",
        "model_required",
        400,
        "invalid_request_error",
        false,
    ),
    (
        Class::UnknownDeployment,
        400,
        "invalid_request_error",
        "unknown_deployment",
        400,
        "invalid_request_error",
        false,
    ),
    (
        Class::TokensPerSecond,
        429,
        "tokens",
        "rate_limit_exceeded",
        429,
        "rate_limit_error",
        true,
    ),
    (
        Class::RequestsPerMinute,
        429,
        "requests",
        "rate_limit_exceeded",
        429,
        "rate_limit_error",
        true,
    ),
    (
        Class::ConcurrencyLimit,
        429,
        "requests",
        "rate_limit_exceeded",
        429,
        "rate_limit_error",
        true,
    ),
    (
        Class::QuotaExceeded,
        429,
        "insufficient_quota",
        "insufficient_quota",
        429,
        "rate_limit_error",
        false,
    ),
    (
        Class::QuotaLeased,
        429,
        "tokens",
        "rate_limit_exceeded",
        429,
        "rate_limit_error",
        true,
    ),
    (
        Class::CostExceedsBurst,
        413,
        "invalid_request_error",
        "cost_exceeds_burst",
        413,
        "request_too_large",
        false,
    ),
    (
        Class::BodyTooLarge,
        413,
        "invalid_request_error",
        "request_too_large",
        413,
        "request_too_large",
        false,
    ),
    (
        Class::InvalidBody,
        400,
        "invalid_request_error",
        "invalid_body",
        400,
        "invalid_request_error",
        false,
    ),
    (
        Class::OutputLimitTooLarge,
        400,
        "invalid_request_error",
        "output_limit_too_large",
        400,
        "invalid_request_error",
        false,
    ),
    (
        Class::ThinkingBudgetDoesNotFit,
        400,
        "invalid_request_error",
        "thinking_budget_does_not_fit",
        400,
        "invalid_request_error",
        false,
    ),
    (
        Class::MissingTenant,
        401,
        "invalid_request_error",
        "missing_tenant",
        401,
        "authentication_error",
        false,
    ),
    (
        Class::ForbiddenTenant,
        403,
        "invalid_request_error",
        "forbidden_tenant",
        403,
        "permission_error",
        false,
    ),
    (
        Class::PathNotMetered,
        403,
        "invalid_request_error",
        "path_not_metered",
        403,
        "permission_error",
        false,
    ),
    (
        Class::BackgroundNotMetered,
        400,
        "invalid_request_error",
        "background_not_metered",
        400,
        "invalid_request_error",
        false,
    ),
    (
        Class::CircuitOpen,
        503,
        "server_error",
        "circuit_open",
        529,
        "overloaded_error",
        true,
    ),
    (
        Class::QuotaUnavailable,
        503,
        "server_error",
        "quota_unavailable",
        503,
        "api_error",
        true,
    ),
    (
        Class::LimiterUnavailable,
        503,
        "server_error",
        "rate_limiter_unavailable",
        503,
        "api_error",
        true,
    ),
];

#[test]
fn every_class_renders_exactly_for_both_families() {
    for (class, status, otype, ocode, astatus, atype, retry) in TABLE {
        let reason = class.reason();
        let r = Refusal {
            retry_after_s: Some(3.5),
            ..Refusal::new(class, "m")
        };
        let retry_headers: &[(&str, &str)] = if retry {
            &[
                ("retry-after", "4"),
                ("retry-after-ms", "3500"),
                ("x-should-retry", "true"),
            ]
        } else {
            &[("x-should-retry", "false")]
        };
        let ours = if retry {
            format!(r#"{{"reason":"{reason}","retry_after":3.5}}"#)
        } else {
            format!(r#"{{"reason":"{reason}"}}"#)
        };

        let out = render(Family::OpenAi, &r, "id", NOW_MS);
        assert_eq!(out.status, status, "{class:?}");
        let mut want = vec![
            ("content-type", "application/json"),
            ("x-request-id", "id"),
            ("x-tokengate-reason", reason),
        ];
        want.extend_from_slice(retry_headers);
        assert_eq!(headers(&out), want, "{class:?}");
        let message = if retry {
            "m Please try again in 3.5s."
        } else {
            "m"
        };
        assert_eq!(
            body(&out),
            format!(
                r#"{{"error":{{"code":"{ocode}","message":"{message}","param":null,"type":"{otype}"}},"tokengate":{ours}}}"#
            ),
            "{class:?}"
        );

        let out = render(Family::Anthropic, &r, "id", NOW_MS);
        assert_eq!(out.status, astatus, "{class:?}");
        let mut want = vec![
            ("content-type", "application/json"),
            ("request-id", "id"),
            ("x-tokengate-reason", reason),
        ];
        want.extend_from_slice(retry_headers);
        assert_eq!(headers(&out), want, "{class:?}");
        assert_eq!(
            body(&out),
            format!(
                r#"{{"error":{{"details":{{"error_code":"{reason}"}},"message":"m","type":"{atype}"}},"request_id":"id","tokengate":{ours},"type":"error"}}"#
            ),
            "{class:?}"
        );
        assert_eq!(class.retryable(), retry);
    }
}

#[test]
fn a_retryable_refusal_without_a_time_says_one_second() {
    let out = render(
        Family::OpenAi,
        &Refusal::new(Class::LimiterUnavailable, "x"),
        "id",
        NOW_MS,
    );
    let h = headers(&out);
    assert!(h.contains(&("retry-after", "1")) && h.contains(&("retry-after-ms", "1000")));
    let out = render(
        Family::OpenAi,
        &Refusal {
            retry_after_s: Some(0.0001),
            ..Refusal::new(Class::TokensPerSecond, "x")
        },
        "id",
        NOW_MS,
    );
    let h = headers(&out);
    assert!(h.contains(&("retry-after", "1")) && h.contains(&("retry-after-ms", "1")));
}

#[test]
fn messages_are_escaped_json() {
    let out = render(
        Family::Anthropic,
        &Refusal::new(Class::InvalidBody, "bad \"json\"\n"),
        "i\"d",
        NOW_MS,
    );
    let v: Value = serde_json::from_slice(&out.body).unwrap();
    assert_eq!(v["error"]["message"], "bad \"json\"\n");
    assert_eq!(v["request_id"], "i\"d");
}

#[test]
fn limit_headers_of_a_snapshot_per_family() {
    let snap = Snapshot {
        limit_tokens: 2000.7,
        remaining_tokens: 120,
        reset_tokens_s: 0.0,
        requests: None,
    };
    let l = Limits::from(&snap);
    let mut got = Vec::new();
    limit_headers(Family::OpenAi, &l, NOW_MS, |k, v| {
        got.push(format!("{k}: {v}"))
    });
    assert_eq!(
        got,
        [
            "x-ratelimit-limit-tokens: 2000",
            "x-ratelimit-remaining-tokens: 120",
            "x-ratelimit-reset-tokens: 0s"
        ]
    );
    // Input/output-token trios exist only in Anthropic's headers.
    let l = Limits {
        input_tokens: Some(Trio {
            limit: 10,
            remaining: 9,
            reset_s: 60.0,
        }),
        output_tokens: Some(Trio {
            limit: 5,
            remaining: 4,
            reset_s: 0.001,
        }),
        ..l
    };
    let mut got = Vec::new();
    limit_headers(Family::OpenAi, &l, NOW_MS, |k, _| got.push(k.to_string()));
    assert_eq!(got.len(), 3);
    let mut got = Vec::new();
    limit_headers(Family::Anthropic, &l, NOW_MS, |k, v| {
        got.push(format!("{k}: {v}"))
    });
    assert_eq!(
        got,
        [
            "anthropic-ratelimit-tokens-limit: 2000",
            "anthropic-ratelimit-tokens-remaining: 120",
            "anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:00Z",
            "anthropic-ratelimit-input-tokens-limit: 10",
            "anthropic-ratelimit-input-tokens-remaining: 9",
            "anthropic-ratelimit-input-tokens-reset: 2026-01-01T00:01:00Z",
            "anthropic-ratelimit-output-tokens-limit: 5",
            "anthropic-ratelimit-output-tokens-remaining: 4",
            "anthropic-ratelimit-output-tokens-reset: 2026-01-01T00:00:01Z",
        ]
    );
}

#[test]
fn the_trio_with_the_least_remaining_is_reported_whole() {
    let ours = bucket_limits(); // tokens 120 left, requests 14 left
                                // The provider has fewer tokens left (the binding one) but more requests: its token trio stays,
                                // our request trio replaces its request trio whole.
    let provider = [
        ("x-ratelimit-limit-tokens", "30000"),
        ("x-ratelimit-remaining-tokens", "100"),
        ("x-ratelimit-reset-tokens", "6m0s"),
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-ratelimit-reset-requests", "120ms"),
    ];
    let e = merge_provider_headers(Family::OpenAi, &provider, &ours, NOW_MS);
    let set: Vec<(&str, &str)> = e
        .set
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        set,
        [
            ("x-ratelimit-limit-requests", "600"),
            ("x-ratelimit-remaining-requests", "14"),
            ("x-ratelimit-reset-requests", "4.6s"),
        ]
    );
    // Equal remaining: the provider's stays. More remaining at the provider: ours replaces it.
    let provider = [
        ("x-ratelimit-limit-tokens", "30000"),
        ("x-ratelimit-remaining-tokens", "120"),
        ("x-ratelimit-reset-tokens", "1s"),
    ];
    let e = merge_provider_headers(Family::OpenAi, &provider, &ours, NOW_MS);
    assert!(e.set.iter().all(|(k, _)| k.ends_with("-requests")), "{e:?}");
    // A partial or unreadable provider trio is replaced whole by ours.
    for provider in [
        &[("x-ratelimit-remaining-tokens", "5")][..],
        &[
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "5.5"),
            ("x-ratelimit-reset-tokens", "1s"),
        ],
    ] {
        let e = merge_provider_headers(Family::OpenAi, provider, &ours, NOW_MS);
        let names: Vec<&str> = e.set.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            names.contains(&"x-ratelimit-limit-tokens")
                && names.contains(&"x-ratelimit-remaining-tokens")
                && names.contains(&"x-ratelimit-reset-tokens"),
            "{names:?}"
        );
    }
    // Resources we do not report keep the provider's headers; the other family's names are ignored.
    let only_tokens = Limits {
        requests: None,
        ..ours
    };
    let provider = [
        ("anthropic-ratelimit-tokens-limit", "80000"),
        ("anthropic-ratelimit-tokens-remaining", "50"),
        ("anthropic-ratelimit-tokens-reset", "2026-01-01T00:00:10Z"),
        ("x-ratelimit-remaining-tokens", "1"),
    ];
    let e = merge_provider_headers(Family::Anthropic, &provider, &only_tokens, NOW_MS);
    assert_eq!(e, HeaderEdits::default(), "the provider's 50 < our 120");
    let e = merge_provider_headers(Family::OpenAi, &provider, &only_tokens, NOW_MS);
    assert_eq!(e.set.len(), 3, "no complete OpenAI trio: ours");
}

/// Every class: Gemini's (status, `google.rpc.Code`) and Bedrock's (status, exception).
const FAMILIES: [(Class, u32, &str, u32, &str); 21] = [
    (
        Class::InvalidClaim,
        403,
        "PERMISSION_DENIED",
        403,
        "AccessDeniedException",
    ),
    (
        Class::IdentityConflict,
        401,
        "UNAUTHENTICATED",
        403,
        "AccessDeniedException",
    ),
    (
        Class::ModelRequired,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::TokensPerSecond,
        429,
        "RESOURCE_EXHAUSTED",
        429,
        "ThrottlingException",
    ),
    (
        Class::RequestsPerMinute,
        429,
        "RESOURCE_EXHAUSTED",
        429,
        "ThrottlingException",
    ),
    (
        Class::ConcurrencyLimit,
        429,
        "RESOURCE_EXHAUSTED",
        429,
        "ThrottlingException",
    ),
    (
        Class::QuotaLeased,
        429,
        "RESOURCE_EXHAUSTED",
        429,
        "ThrottlingException",
    ),
    (
        Class::QuotaExceeded,
        429,
        "RESOURCE_EXHAUSTED",
        400,
        "ServiceQuotaExceededException",
    ),
    (
        Class::CostExceedsBurst,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::BodyTooLarge,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::InvalidBody,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::OutputLimitTooLarge,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::ThinkingBudgetDoesNotFit,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::BackgroundNotMetered,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::UnknownDeployment,
        400,
        "INVALID_ARGUMENT",
        400,
        "ValidationException",
    ),
    (
        Class::MissingTenant,
        401,
        "UNAUTHENTICATED",
        403,
        "AccessDeniedException",
    ),
    (
        Class::ForbiddenTenant,
        403,
        "PERMISSION_DENIED",
        403,
        "AccessDeniedException",
    ),
    (
        Class::PathNotMetered,
        403,
        "PERMISSION_DENIED",
        403,
        "AccessDeniedException",
    ),
    (
        Class::CircuitOpen,
        503,
        "UNAVAILABLE",
        503,
        "ServiceUnavailableException",
    ),
    (
        Class::QuotaUnavailable,
        503,
        "UNAVAILABLE",
        503,
        "ServiceUnavailableException",
    ),
    (
        Class::LimiterUnavailable,
        503,
        "UNAVAILABLE",
        503,
        "ServiceUnavailableException",
    ),
];

#[test]
fn every_class_renders_in_geminis_and_bedrocks_shapes() {
    for (class, gstatus, gcode, bstatus, bname) in FAMILIES {
        let reason = class.reason();
        let retry = class.retryable();
        let r = Refusal {
            retry_after_s: Some(1.2501),
            limit_name: Some("rule-a".into()),
            ..Refusal::new(class, "m")
        };
        let out = render(Family::Gemini, &r, "id", NOW_MS);
        assert_eq!(out.status, gstatus, "{class:?}");
        assert_eq!(class.status(Family::Gemini), gstatus);
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(v["error"]["code"], gstatus, "{class:?}");
        assert_eq!(v["error"]["status"], gcode, "{class:?}");
        let message = if retry {
            "m Please retry in 1.251s."
        } else {
            "m"
        };
        assert_eq!(v["error"]["message"], message, "{class:?}");
        let details = v["error"]["details"].as_array().unwrap();
        assert_eq!(
            details[0],
            json!({"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                   "reason": reason.to_ascii_uppercase(), "domain": "tokengate",
                   "metadata": {"reason": reason, "limit": "rule-a"}}),
            "{class:?}"
        );
        let retry_info = details
            .iter()
            .find(|d| d["@type"] == "type.googleapis.com/google.rpc.RetryInfo");
        assert_eq!(
            retry_info.map(|d| d["retryDelay"].clone()),
            retry.then(|| json!("1.251s")),
            "{class:?}"
        );
        let h = headers(&out);
        assert!(h.contains(&("x-request-id", "id")), "{class:?}");
        assert_eq!(
            h.iter().any(|(k, _)| *k == "retry-after"),
            retry,
            "{class:?}"
        );

        let out = render(Family::Bedrock, &r, "id", NOW_MS);
        assert_eq!(out.status, bstatus, "{class:?}");
        assert_eq!(class.status(Family::Bedrock), bstatus);
        assert_eq!(
            body(&out),
            if retry {
                format!(
                    r#"{{"message":"m","tokengate":{{"limit":"rule-a","reason":"{reason}","retry_after":1.251}}}}"#
                )
            } else {
                format!(r#"{{"message":"m","tokengate":{{"limit":"rule-a","reason":"{reason}"}}}}"#)
            },
            "{class:?}"
        );
        let h = headers(&out);
        assert!(h.contains(&("x-amzn-requestid", "id")), "{class:?}");
        assert!(h.contains(&("x-amzn-errortype", bname)), "{class:?}");
        assert_eq!(
            h.contains(&("x-amz-retry-after", "1251")),
            retry,
            "{class:?}: botocore's standard mode waits x-amz-retry-after (ms)"
        );
    }
    // A spent quota says so in Google's terms too, without a RetryInfo.
    let q = render(
        Family::Gemini,
        &Refusal::new(Class::QuotaExceeded, "spent"),
        "id",
        NOW_MS,
    );
    let v: Value = serde_json::from_slice(&q.body).unwrap();
    assert_eq!(
        v["error"]["details"][1]["@type"],
        "type.googleapis.com/google.rpc.QuotaFailure"
    );
    assert_eq!(v["error"]["details"].as_array().unwrap().len(), 2);
}

#[test]
fn gemini_and_bedrock_answers_report_limits_in_openais_header_names() {
    for family in [Family::Gemini, Family::Bedrock] {
        let r = Refusal {
            limits: Some(bucket_limits()),
            ..Refusal::new(Class::TokensPerSecond, "x")
        };
        let out = render(family, &r, "id", NOW_MS);
        let h = headers(&out);
        assert!(
            h.contains(&("x-ratelimit-remaining-tokens", "120")),
            "{family:?}"
        );
        assert!(
            h.contains(&("x-ratelimit-reset-requests", "4.6s")),
            "{family:?}"
        );
    }
}

#[test]
fn unmetered_paths_of_the_new_families_are_answered_in_their_shape() {
    for (path, want) in [
        (
            "/v1beta/models/text-embedding-004:embedcontent",
            Some(Family::Gemini),
        ),
        (
            "/v1/projects/p/locations/l/publishers/google/models/i:predict",
            Some(Family::Gemini),
        ),
        (
            "/model/amazon.titan-embed-text-v2%3a0/x",
            Some(Family::Bedrock),
        ),
        ("/async-invoke", Some(Family::Bedrock)),
        ("/v1/batches", None),
        ("/v1/messages/batches", None),
    ] {
        assert_eq!(Family::of_unmetered_path(path), want, "{path}");
    }
}

#[test]
fn the_family_follows_the_api() {
    assert_eq!(Family::of(ApiKind::GeminiGenerate), Family::Gemini);
    assert_eq!(Family::of(ApiKind::GeminiStream), Family::Gemini);
    for k in [
        ApiKind::BedrockConverse,
        ApiKind::BedrockConverseStream,
        ApiKind::BedrockInvoke,
        ApiKind::BedrockInvokeStream,
    ] {
        assert_eq!(Family::of(k), Family::Bedrock);
    }
    assert_eq!(Family::of(ApiKind::AnthropicMessages), Family::Anthropic);
    for k in [
        ApiKind::ChatCompletions,
        ApiKind::Completions,
        ApiKind::Embeddings,
        ApiKind::Responses,
    ] {
        assert_eq!(Family::of(k), Family::OpenAi);
    }
}
