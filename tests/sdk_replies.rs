//! The answers of `tokengate::reply::render` as the official SDKs see them: a loopback HTTP server
//! serves each class's rendered answer (every family) to the real `openai` and `anthropic` Python SDKs,
//! `openai.AzureOpenAI`, `google-genai` (Gemini API and Vertex AI modes) and `boto3`'s bedrock-runtime
//! (installed into .venv by `make deps`, driven by wasm-test/sdk/driver.py), which must raise their own
//! exception type with the documented attributes, retry what a retry can fix (after `retry-after-ms`,
//! or botocore's `x-amz-retry-after`; google-genai by its own backoff, on status alone, and only when
//! retries are turned on), and return at once on what it cannot.
//!
//! This checks the reply contract itself, before and apart from the request flow; wasm-test/tests/sdk.rs
//! drives the same SDKs through Envoy and the filter.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use tokengate::reply::{render, Class, Family, Limits, LocalReply, QuotaView, Refusal, Trio};

/// Seconds the retryable answers ask to wait (`retry-after-ms: 100`). The SDKs' own backoff would wait
/// at least 0.375 + 0.75 s over two retries, so a total under 1 s shows they obeyed the header.
const RETRY_S: f64 = 0.1;

struct Case {
    reply: LocalReply,
    /// Refusals to give before answering with success (`usize::MAX`: always refuse).
    refusals: usize,
    attempts: usize,
}

type Cases = Arc<Mutex<HashMap<String, Case>>>;

/// A loopback server: `/c/<case>/…` answers with that case's reply.
fn serve(cases: Cases) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let cases = cases.clone();
            thread::spawn(move || answer(conn, &cases));
        }
    });
    port
}

fn answer(conn: TcpStream, cases: &Cases) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    let _ = reader.read_exact(&mut body);
    let id = path.split('/').nth(2).unwrap_or("").to_string();
    let reply = {
        let mut cases = cases.lock().unwrap();
        let case = cases.get_mut(&id).expect("known case");
        case.attempts += 1;
        if case.refusals > 0 {
            case.refusals = case.refusals.saturating_sub(1);
            Some(case.reply.clone())
        } else {
            None
        }
    };
    let (status, headers, body) = match reply {
        Some(r) => (r.status, r.headers, r.body),
        None => (
            200,
            vec![("content-type".to_string(), "application/json".to_string())],
            success(&path),
        ),
    };
    let mut out = format!("HTTP/1.1 {status} Status\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    ));
    let mut conn = conn;
    let _ = conn.write_all(out.as_bytes());
    let _ = conn.write_all(&body);
}

/// A minimal successful answer of the endpoint.
fn success(path: &str) -> Vec<u8> {
    let bare = path.split('?').next().unwrap_or(path);
    let v = if bare.ends_with(":generateContent") {
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]},
                               "finishReason": "STOP"}],
               "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1, "totalTokenCount": 4}})
    } else if bare.ends_with("/converse") {
        json!({"output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
               "stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 1, "totalTokens": 4},
               "metrics": {"latencyMs": 1}})
    } else if path.ends_with("/messages") {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
               "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
               "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 1}})
    } else {
        json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    };
    v.to_string().into_bytes()
}

/// One driver at a time: the tests time the SDKs' waits, which a second Python process on the same
/// two cores would stretch.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs the driver once over `calls` (argument lists) and returns one result per call.
fn drive(calls: &[Vec<String>]) -> Vec<Value> {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv/bin/python");
    let mut child = Command::new(&python)
        .arg(root.join("wasm-test/sdk/driver.py"))
        .arg("batch")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (run `make deps`)", python.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json!(calls).to_string().as_bytes())
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the SDK driver ran over 120 s");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = out.join().unwrap();
    let err = err.join().unwrap();
    let last = out
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .unwrap_or_else(|| panic!("no result from the driver; stdout:\n{out}\nstderr:\n{err}"));
    serde_json::from_str::<Vec<Value>>(last).unwrap()
}

/// The exception class the SDK raises for a status.
fn exception(family: Family, status: u32) -> &'static str {
    match (family, status) {
        (_, 400) => "BadRequestError",
        (_, 401) => "AuthenticationError",
        (_, 403) => "PermissionDeniedError",
        (_, 429) => "RateLimitError",
        (Family::OpenAi, 413) => "APIStatusError",
        (Family::OpenAi, 503) => "InternalServerError",
        (Family::Anthropic, 413) => "ContentTooLargeError",
        (Family::Anthropic, 503) => "ServiceUnavailableError",
        (Family::Anthropic, 529) => "OverloadedError",
        other => panic!("no SDK class known for {other:?}"),
    }
}

const CLASSES: [Class; 17] = [
    Class::InvalidClaim,
    Class::IdentityConflict,
    Class::ModelRequired,
    Class::TokensPerSecond,
    Class::RequestsPerMinute,
    Class::ConcurrencyLimit,
    Class::QuotaExceeded,
    Class::CostExceedsBurst,
    Class::BodyTooLarge,
    Class::InvalidBody,
    Class::OutputLimitTooLarge,
    Class::ThinkingBudgetDoesNotFit,
    Class::MissingTenant,
    Class::ForbiddenTenant,
    Class::CircuitOpen,
    Class::QuotaUnavailable,
    Class::LimiterUnavailable,
];

fn refusal(class: Class) -> Refusal {
    let trio = Trio {
        limit: 1000,
        remaining: 0,
        reset_s: 0.5,
    };
    Refusal {
        // A spent quota's reset is a month away: it must never become a retry-after.
        retry_after_s: Some(if class == Class::QuotaExceeded {
            2_600_000.0
        } else {
            RETRY_S
        }),
        limits: Some(Limits {
            tokens: Some(trio),
            requests: Some(trio),
            ..Limits::default()
        }),
        quota: (class == Class::QuotaExceeded).then_some(QuotaView {
            limit: 1000,
            remaining: 0,
            reset_unix_s: 1_769_904_000,
            reset_in_s: 2_600_000,
            currency: None,
        }),
        estimated: Some(900),
        limit_name: Some("rule-a".into()),
        ..Refusal::new(class, format!("refused: {}", class.reason()))
    }
}

fn family_name(f: Family) -> &'static str {
    match f {
        Family::OpenAi => "openai",
        Family::Anthropic => "anthropic",
        Family::Gemini => "gemini",
        Family::Bedrock => "bedrock",
    }
}

/// One client of the other families: the driver scenario, the family it reads, whether retries are
/// turned on (google-genai has none unless asked).
struct Client {
    scenario: &'static str,
    family: Family,
    retries: bool,
}

const CLIENTS: [Client; 5] = [
    Client {
        scenario: "azure-error",
        family: Family::OpenAi,
        retries: true,
    },
    Client {
        scenario: "gemini-error",
        family: Family::Gemini,
        retries: false,
    },
    Client {
        scenario: "gemini-error",
        family: Family::Gemini,
        retries: true,
    },
    Client {
        scenario: "vertex-error",
        family: Family::Gemini,
        retries: false,
    },
    Client {
        scenario: "bedrock-error",
        family: Family::Bedrock,
        retries: true,
    },
];

#[test]
fn azure_gemini_vertex_and_bedrock_clients_raise_their_own_errors_and_retry_as_documented() {
    let cases: Cases = Arc::new(Mutex::new(HashMap::new()));
    let port = serve(cases.clone());
    let mut calls = Vec::new();
    let mut expect = Vec::new();
    let now_ms = 1_767_225_600_000;
    let mut classes = CLASSES.to_vec();
    classes.extend([
        Class::QuotaLeased,
        Class::UnknownDeployment,
        Class::PathNotMetered,
    ]);
    for (ci, client) in CLIENTS.iter().enumerate() {
        for &class in &classes {
            let id = format!("{ci}-{}-{}", client.scenario, class.reason());
            let request_id = format!("req-{id}");
            let reply = render(client.family, &refusal(class), &request_id, now_ms);
            cases.lock().unwrap().insert(
                id.clone(),
                Case {
                    reply,
                    refusals: usize::MAX,
                    attempts: 0,
                },
            );
            calls.push(vec![
                client.scenario.to_string(),
                "--base-url".into(),
                format!("http://127.0.0.1:{port}/c/{id}"),
                "--max-retries".into(),
                if client.retries { "2" } else { "0" }.into(),
            ]);
            expect.push((ci, class, id, request_id));
        }
    }
    // A refusal then success, for each client that retries.
    for (ci, client) in CLIENTS.iter().enumerate().filter(|(_, c)| c.retries) {
        let id = format!("{ci}-{}-retry-ok", client.scenario);
        let reply = render(client.family, &refusal(Class::TokensPerSecond), "r", now_ms);
        cases.lock().unwrap().insert(
            id.clone(),
            Case {
                reply,
                refusals: 1,
                attempts: 0,
            },
        );
        calls.push(vec![
            client.scenario.replace("-error", "-ok"),
            "--base-url".into(),
            format!("http://127.0.0.1:{port}/c/{id}"),
        ]);
    }
    for c in calls.iter_mut().skip(expect.len()) {
        // The success scenarios of the same clients.
        c[0] = match c[0].as_str() {
            "azure-ok" => "azure-chat",
            "gemini-ok" => "gemini-generate",
            "bedrock-ok" => "bedrock-converse",
            other => panic!("{other}"),
        }
        .to_string();
        c.extend(["--max-retries".to_string(), "2".to_string()]);
    }
    let results = drive(&calls);
    assert_eq!(results.len(), calls.len());
    let cases = cases.lock().unwrap();
    for ((ci, class, id, request_id), got) in expect.iter().zip(&results) {
        let client = &CLIENTS[*ci];
        let status = class.status(client.family);
        let what = format!("{id}: {got}");
        assert_eq!(got["ok"], false, "{what}");
        assert_eq!(got["status_code"], status, "{what}");
        let attempts = cases[id.as_str()].attempts;
        let elapsed = got["elapsed"].as_f64().unwrap();
        let retried = match client.family {
            Family::OpenAi => {
                assert_eq!(
                    got["exception"],
                    exception(Family::OpenAi, status),
                    "{what}"
                );
                assert_eq!(got["request_id"], request_id.as_str(), "{what}");
                let body = render(Family::OpenAi, &refusal(*class), request_id, now_ms).body;
                let body: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(got["code"], body["error"]["code"], "{what}");
                class.retryable()
            }
            Family::Gemini => {
                let want = if status >= 500 {
                    "ServerError"
                } else {
                    "ClientError"
                };
                assert_eq!(got["exception"], want, "{what}");
                assert_eq!(got["status"], class.google().1, "{what}");
                assert!(
                    got["message"].as_str().unwrap().starts_with("refused: "),
                    "{what}"
                );
                // google-genai retries on the status alone (408, 429, 5xx), when turned on.
                client.retries && matches!(status, 429 | 503)
            }
            Family::Bedrock => {
                assert_eq!(got["exception"], class.bedrock().1, "{what}");
                assert_eq!(got["code"], class.bedrock().1, "{what}");
                assert_eq!(got["request_id"], request_id.as_str(), "{what}");
                assert_eq!(
                    got["message"],
                    format!("refused: {}", class.reason()),
                    "{what}"
                );
                class.retryable()
            }
            Family::Anthropic => unreachable!(),
        };
        if retried {
            assert_eq!(attempts, 3, "two retries: {what}");
            assert!(
                elapsed >= 2.0 * RETRY_S || client.family == Family::Gemini,
                "{what}"
            );
            assert!(elapsed < 10.0, "{what}");
        } else {
            assert_eq!(attempts, 1, "no retry: {what}");
            // One attempt says it all; the bound only catches a client that sleeps before raising
            // (loose: a loaded host runs one Python call in over a second).
            assert!(elapsed < 5.0, "returned at once: {elapsed} s: {what}");
        }
        if client.family == Family::OpenAi && retried {
            assert!(elapsed < 1.0, "AzureOpenAI waited retry-after-ms: {what}");
        }
    }
    for got in &results[expect.len()..] {
        assert_eq!(got["ok"], true, "a bucket refusal then success: {got}");
        assert_eq!(got["text"], "hi", "{got}");
    }
    for (ci, client) in CLIENTS.iter().enumerate().filter(|(_, c)| c.retries) {
        let id = format!("{ci}-{}-retry-ok", client.scenario);
        assert_eq!(cases[&id].attempts, 2, "{id}");
    }
}

#[test]
fn every_class_raises_the_sdks_own_exception_and_retries_only_what_a_retry_can_fix() {
    let cases: Cases = Arc::new(Mutex::new(HashMap::new()));
    let port = serve(cases.clone());
    let mut calls = Vec::new();
    let mut expect = Vec::new();
    let now_ms = 1_767_225_600_000;
    for family in [Family::OpenAi, Family::Anthropic] {
        for class in CLASSES {
            let id = format!("{}-{}", family_name(family), class.reason());
            let request_id = format!("req-{id}");
            let reply = render(family, &refusal(class), &request_id, now_ms);
            cases.lock().unwrap().insert(
                id.clone(),
                Case {
                    reply,
                    refusals: usize::MAX,
                    attempts: 0,
                },
            );
            calls.push(vec![
                format!("{}-error", family_name(family)),
                "--base-url".into(),
                format!("http://127.0.0.1:{port}/c/{id}"),
            ]);
            expect.push((family, class, id, request_id));
        }
    }
    // And two that succeed on the retry.
    for family in [Family::OpenAi, Family::Anthropic] {
        let id = format!("{}-retry-ok", family_name(family));
        let reply = render(family, &refusal(Class::TokensPerSecond), "r", now_ms);
        cases.lock().unwrap().insert(
            id.clone(),
            Case {
                reply,
                refusals: 1,
                attempts: 0,
            },
        );
        calls.push(vec![
            format!("{}-error", family_name(family)),
            "--base-url".into(),
            format!("http://127.0.0.1:{port}/c/{id}"),
        ]);
    }
    let results = drive(&calls);
    assert_eq!(results.len(), calls.len());
    let cases = cases.lock().unwrap();
    for ((family, class, id, request_id), got) in expect.iter().zip(&results) {
        let status = class.status(*family);
        let what = format!("{id}: {got}");
        assert_eq!(got["ok"], false, "{what}");
        assert_eq!(got["exception"], exception(*family, status), "{what}");
        assert_eq!(got["status_code"], status, "{what}");
        assert_eq!(got["request_id"], request_id.as_str(), "{what}");
        let body = render(*family, &refusal(*class), request_id, now_ms).body;
        let body: Value = serde_json::from_slice(&body).unwrap();
        match family {
            Family::OpenAi => {
                assert_eq!(got["code"], body["error"]["code"], "{what}");
                assert_eq!(got["type"], body["error"]["type"], "{what}");
                assert_eq!(got["param"], Value::Null, "{what}");
            }
            Family::Anthropic => {
                assert_eq!(got["type"], body["error"]["type"], "{what}");
                assert_eq!(got["error_code"], class.reason(), "{what}");
            }
            Family::Gemini | Family::Bedrock => unreachable!("not in this test"),
        }
        let attempts = cases[id.as_str()].attempts;
        let elapsed = got["elapsed"].as_f64().unwrap();
        if class.retryable() {
            assert_eq!(attempts, 3, "two retries: {what}");
            assert!(
                (2.0 * RETRY_S..1.0).contains(&elapsed),
                "waited retry-after-ms, not the SDK's own backoff: {elapsed} s: {what}"
            );
        } else {
            assert_eq!(attempts, 1, "no retry: {what}");
            // One attempt says it all; the bound only catches a client that sleeps before raising
            // (loose: a loaded host runs one Python call in over a second).
            assert!(elapsed < 5.0, "returned at once: {elapsed} s: {what}");
        }
    }
    for got in &results[expect.len()..] {
        assert_eq!(got["ok"], true, "a bucket refusal then success: {got}");
        assert_eq!(got["text"], "hi", "{got}");
    }
    for family in ["openai", "anthropic"] {
        assert_eq!(cases[&format!("{family}-retry-ok")].attempts, 2);
    }
}
