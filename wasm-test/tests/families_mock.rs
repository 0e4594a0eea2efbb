//! The other families' official clients against the mock provider directly (no Envoy): each speaks
//! its family on its paths — `openai.AzureOpenAI` (deployments), `google-genai` (Gemini API key mode
//! and Vertex AI mode with fake OAuth credentials; SSE streams), `boto3` bedrock-runtime (`converse`,
//! `converse_stream` over the AWS event stream, fake SigV4 credentials) — and the SDK parses every
//! answer, reports the usage the mock's ledger served, and sends the paths the filter meters. The
//! Envoy suites then only add the filter.

use serde_json::{json, Value};
use wasm_test::faults::ledger;
use wasm_test::{mock_provider, sdk};

/// What the mock answers for an output limit of 8 (`t0 t1 … t7 `).
const TEXT8: &str = "t0 t1 t2 t3 t4 t5 t6 t7 ";

/// Runs `calls` (argument lists) through the driver against `port`; one result per call.
fn drive(port: u16, calls: &[Vec<&str>]) -> Vec<Value> {
    let calls: Vec<Vec<String>> = calls.iter().map(|c| sdk::call(c[0], &c[1..])).collect();
    sdk::drive(port, &calls)
}

#[test]
fn every_familys_official_client_talks_to_the_mock_provider() {
    let mock = mock_provider!();
    let calls: Vec<Vec<&str>> = vec![
        vec!["azure-chat", "--model", "dep-1"],
        vec!["azure-chat-stream", "--model", "dep-1"],
        vec!["gemini-generate"],
        vec!["gemini-stream"],
        vec!["vertex-generate"],
        vec!["vertex-stream"],
        vec!["bedrock-converse"],
        vec!["bedrock-converse-stream"],
        vec!["gemini-error", "--header", "x-mock-status=429"],
        vec![
            "bedrock-error",
            "--header",
            "x-mock-status=429",
            "--max-retries",
            "0",
        ],
    ];
    let got = drive(mock.port, &calls);
    for (c, g) in calls.iter().zip(&got).take(8) {
        assert_eq!(g["ok"], true, "{c:?}: {g}");
        assert_eq!(g["text"], TEXT8, "{c:?}: {g}");
    }
    // "Say hello." is 10 bytes: 2 prompt tokens by the mock's rule; 8 generated.
    assert_eq!(got[0]["usage"]["prompt_tokens"], 2, "{}", got[0]);
    assert_eq!(got[0]["usage"]["completion_tokens"], 8);
    assert_eq!(got[1]["usage"]["completion_tokens"], 8, "{}", got[1]);
    for g in &got[2..6] {
        assert_eq!(g["usage"]["prompt_token_count"], 2, "{g}");
        assert_eq!(g["usage"]["candidates_token_count"], 8, "{g}");
        assert_eq!(g["usage"]["total_token_count"], 10, "{g}");
    }
    assert_eq!(got[3]["chunks"], 4, "one SSE event per piece: {}", got[3]);
    for g in &got[6..8] {
        assert_eq!(
            g["usage"],
            json!({"inputTokens": 2, "outputTokens": 8, "totalTokens": 10}),
            "{g}"
        );
        assert_eq!(g["stop_reason"], "max_tokens", "{g}");
    }
    assert_eq!(
        got[7]["events"],
        json!([
            "messageStart",
            "contentBlockDelta",
            "contentBlockDelta",
            "contentBlockDelta",
            "contentBlockDelta",
            "contentBlockStop",
            "messageStop",
            "metadata"
        ]),
        "boto3 decoded the event stream (CRCs checked): {}",
        got[7]
    );
    // Injected errors in each family's shape.
    assert_eq!(got[8]["exception"], "ClientError", "{}", got[8]);
    assert_eq!(got[8]["status"], "RESOURCE_EXHAUSTED", "{}", got[8]);
    assert_eq!(got[9]["exception"], "ThrottlingException", "{}", got[9]);
    assert_eq!(
        got[9]["request_id"]
            .as_str()
            .map(|s| s.starts_with("mock-req-")),
        Some(true)
    );

    // The paths the filter meters, as the SDKs send them.
    let paths: Vec<String> = mock.requests().iter().map(|r| r.path.clone()).collect();
    let want = [
        "/openai/deployments/dep-1/chat/completions?api-version=2024-10-21",
        "/openai/deployments/dep-1/chat/completions?api-version=2024-10-21",
        "/v1/models/gemini-2.5-flash:generateContent",
        "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        "/v1beta1/projects/tg-project/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent",
        "/v1beta1/projects/tg-project/locations/us-central1/publishers/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
        "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream",
    ];
    assert_eq!(&paths[..8], &want[..], "{paths:#?}");
    // Each request's body is its family's (no `model` in Azure's, Gemini's or Bedrock's bodies but
    // the SDK's own choice) and its credentials are the fake ones.
    let reqs = mock.requests();
    assert!(
        reqs[0].header("api-key") == Some("azure-test-key"),
        "{:?}",
        reqs[0].headers
    );
    assert_eq!(reqs[2].header("x-goog-api-key"), Some("fake-gemini-key"));
    assert_eq!(
        reqs[4].header("authorization"),
        Some("Bearer fake-oauth-token")
    );
    assert!(reqs[6]
        .header("authorization")
        .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLEFAKE/")));
    assert!(reqs[2].json().get("contents").is_some());
    assert_eq!(
        reqs[2].json().pointer("/generationConfig/maxOutputTokens"),
        Some(&json!(8))
    );
    assert_eq!(
        reqs[6].json().pointer("/inferenceConfig/maxTokens"),
        Some(&json!(8))
    );
    // The ledger served what the SDKs reported: 2 + 8 per answer.
    let l = ledger(&mock);
    let tokens: Vec<u64> = l.answers.iter().map(|r| r.tokens).collect();
    assert_eq!(&tokens[..8], &[10; 8], "{tokens:?}");
}
