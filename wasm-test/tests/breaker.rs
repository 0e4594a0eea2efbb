//! The circuit breaker (README "Circuit breaker") as a client sees it, through the release
//! tokengate.wasm in a real Envoy (concurrency 2) in front of mock providers that fail on demand
//! (`x-mock-status`, `x-mock-delay-ms`, `x-mock-cut-after`, `x-mock-retry-after`).
//!
//! Breaker outcomes are recorded in `on_log`, i.e. when Envoy finishes the stream; before asserting on
//! the state a test waits (bounded) for the transition counter, never for a fixed "long enough" sleep.
//! Recoveries are kept at 1–3 s so that every test finishes in a few seconds; every loop is bounded in
//! count and time.

use serde_json::{json, Value};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use wasm_test::tg::{self, assert_error, chat, header_u64, rule, rule_with};
use wasm_test::{http, mock_provider, Envoy, EnvoyOpts, MockProvider};

/// The model most tests send.
const MODEL: &str = "gpt-test";

/// How long to wait for an `on_log` outcome to show up in the stats.
const STAT_WAIT: Duration = Duration::from_secs(3);

/// A plugin config with one roomy bucket for everyone and `breaker` as the breaker section.
fn config_with(breaker: Value) -> Value {
    tg::merge(
        tg::config(json!([rule("all", "*", "*", 100_000.0, 1_000_000)])),
        json!({ "breaker": breaker }),
    )
}

/// POST a chat body as tenant `t` with extra headers, on a fresh connection.
fn post(envoy: &Envoy, headers: &[(&str, &str)], body: &[u8]) -> http::Response {
    let mut h = vec![("x-tenant-id", "t"), ("content-type", "application/json")];
    h.extend_from_slice(headers);
    http::post(envoy.port, tg::CHAT, &h, body).unwrap_or_else(|e| panic!("POST {}: {e}", tg::CHAT))
}

/// Sends `n` requests for `model` that the provider answers with `status`; each must have been
/// answered by the provider (not by the filter).
fn upstream_fails(envoy: &Envoy, model: &str, n: usize, status: u16, extra: &[(&str, &str)]) {
    let s = status.to_string();
    let mut h = vec![("x-mock-status", s.as_str())];
    h.extend_from_slice(extra);
    for i in 0..n {
        let r = post(envoy, &h, &chat(model, 10));
        assert_eq!(
            r.status,
            status,
            "failure #{i} must reach the provider; headers {:?} body {}",
            r.headers,
            r.text()
        );
        assert!(
            r.header("x-mock-port").is_some(),
            "failure #{i} answered by the provider: {:?}",
            r.headers
        );
    }
}

/// Waits (bounded) until `tokengate_breaker_opened` reaches `n`, then asserts it is exactly `n`.
fn expect_opened(envoy: &Envoy, n: u64) {
    let got = envoy.wait_stat("tokengate_breaker_opened", n, STAT_WAIT);
    assert_eq!(
        got,
        n,
        "tokengate_breaker_opened; log:\n{}",
        breaker_log(envoy)
    );
}

/// The filter's breaker transition lines from envoy.log.
fn breaker_log(envoy: &Envoy) -> String {
    envoy
        .log()
        .lines()
        .filter(|l| l.contains("breaker tg:cb:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts the 503 of an open breaker (OpenAI's `server_error` with code `circuit_open`, retryable:
/// `retry-after` = max(1, ceil(`tokengate.retry_after`)), `retry-after-ms`, `x-should-retry: true`)
/// and returns `tokengate.retry_after`: the seconds until the breaker lets a request through.
fn assert_circuit_open(r: &http::Response) -> f64 {
    let ours = assert_error(r, 503, "server_error", "circuit_open", "circuit_open");
    let retry_after = ours["retry_after"]
        .as_f64()
        .unwrap_or_else(|| panic!("tokengate.retry_after must be a number: {ours}"));
    assert!(retry_after > 0.0, "retry_after {retry_after} > 0");
    assert!(header_u64(r, "retry-after") >= 1);
    retry_after
}

/// Sends `make()` every `every` until a request is answered by the provider (at most `timeout`).
/// Returns the time from `since` to that admission, the admitted response, and the `retry_after`
/// values of the 503s seen before it.
fn poll_until_admitted(
    envoy: &Envoy,
    headers: &[(&str, &str)],
    since: Instant,
    every: Duration,
    timeout: Duration,
) -> (Duration, http::Response, Vec<f64>) {
    let deadline = Instant::now() + timeout;
    let mut resets = Vec::new();
    for _ in 0..10_000 {
        let r = post(envoy, headers, &chat(MODEL, 10));
        let at = since.elapsed();
        if r.header("x-mock-port").is_some() {
            return (at, r, resets);
        }
        resets.push(assert_circuit_open(&r));
        assert!(
            Instant::now() < deadline,
            "never admitted again within {timeout:?}; log:\n{}",
            breaker_log(envoy)
        );
        thread::sleep(every);
    }
    panic!("poll loop exhausted")
}

/// Lets the provider's connection threads settle before asserting on what it received.
fn settle() {
    thread::sleep(Duration::from_millis(250));
}

fn stream_body(model: &str) -> Vec<u8> {
    json!({"model": model, "stream": true, "max_tokens": 8,
           "messages": [{"role": "user", "content": "Write one short sentence about rivers."}]})
    .to_string()
    .into_bytes()
}

fn post_stream(envoy: &Envoy, extra: &[(&str, &str)]) -> http::StreamResponse {
    let mut h = vec![("x-tenant-id", "t"), ("content-type", "application/json")];
    h.extend_from_slice(extra);
    http::post_stream(
        envoy.port,
        tg::CHAT,
        &h,
        &stream_body(MODEL),
        &http::StreamOpts::default(),
    )
    .unwrap_or_else(|e| panic!("stream POST: {e}"))
}

// ---------------------------------------------------------------------------------------------

#[test]
fn breaker_opens_after_the_failure_threshold() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"failure_threshold": 3, "recovery_ms": 30_000})),
    );

    // Two failures: still closed, the third request still reaches the provider.
    upstream_fails(&envoy, MODEL, 2, 500, &[]);
    settle();
    assert_eq!(
        envoy.stat("tokengate_breaker_opened"),
        0,
        "opened before the threshold"
    );
    // The third failure is the threshold (default keys: both the cluster and the model breaker trip).
    upstream_fails(&envoy, MODEL, 1, 500, &[]);
    expect_opened(&envoy, 2);
    assert!(
        envoy.wait_log(
            "breaker tg:cb:model=gpt-test: closed -> open (failure_threshold)",
            STAT_WAIT
        ),
        "transition log line; got:\n{}",
        breaker_log(&envoy)
    );
    assert!(envoy
        .log()
        .contains("breaker tg:cb:cluster=provider: closed -> open (failure_threshold)"));
    assert_eq!(
        envoy.stat_opt("tokengate_breaker_state.cluster=provider"),
        Some(1),
        "cluster gauge: open"
    );
    assert_eq!(
        envoy.stat_opt("tokengate_breaker_state.model=gpt-test"),
        Some(1),
        "model gauge: open"
    );

    mock.reset();
    // A healthy request now gets the breaker's 503, not the provider.
    let r = post(&envoy, &[], &chat(MODEL, 10));
    let retry_after = assert_circuit_open(&r);
    assert!(
        retry_after <= 30.0 && retry_after > 25.0,
        "retry_after {retry_after} ≈ recovery 30 s"
    );
    assert_eq!(header_u64(&r, "retry-after"), retry_after.ceil() as u64);
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("provider"),
        "the message names the open cluster: {msg}"
    );
    assert_eq!(envoy.stat("tokengate_breaker_short_circuited"), 1);
    // No bucket headers: nothing was charged for a request that was never sent.
    assert!(
        r.header("x-tokengate-estimated-tokens").is_none(),
        "{:?}",
        r.headers
    );
    settle();
    assert!(
        mock.requests().is_empty(),
        "the provider received {:?}",
        mock.requests()
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn while_open_rejects_fast_and_the_provider_receives_nothing() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 30_000})),
    );
    upstream_fails(&envoy, MODEL, 2, 502, &[]);
    expect_opened(&envoy, 1);
    mock.reset();

    // The upstream would take 2 s to answer; the breaker answers at once.
    let mut times = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        let r = post(&envoy, &[("x-mock-delay-ms", "2000")], &chat(MODEL, 10));
        times.push(t0.elapsed());
        assert_circuit_open(&r);
    }
    times.sort();
    let (p50, max) = (times[times.len() / 2], times[times.len() - 1]);
    println!(
        "time to 503 circuit_open over {} requests: p50 {p50:?}, max {max:?}",
        times.len()
    );
    assert!(
        max < Duration::from_millis(200),
        "short-circuit took {max:?} (upstream delay 2000 ms)"
    );
    assert_eq!(envoy.stat("tokengate_breaker_short_circuited"), 20);
    settle();
    // Rejected in the headers phase: not even the request headers reached the provider.
    assert!(
        mock.requests().is_empty(),
        "complete requests at the provider: {:?}",
        mock.requests()
    );
    assert!(
        mock.incomplete_requests().is_empty(),
        "request headers reached the provider: {:?}",
        mock.incomplete_requests()
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn half_open_admits_exactly_n_probes_under_concurrent_load() {
    let mock = mock_provider!();
    // Refill 1 token/s: the bucket shows whether rejected requests were refunded.
    let burst = 100_000;
    let mut cfg = tg::config(json!([rule("all", "*", "*", 1.0, burst)]));
    cfg["breaker"] = json!({"keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 1000,
                            "half_open_max_calls": 2, "probe_timeout_ms": 5000});
    let envoy = tg::start(&mock, cfg);
    let started = Instant::now();
    upstream_fails(&envoy, MODEL, 2, 500, &[]);
    expect_opened(&envoy, 1);
    let opened_at = Instant::now();
    mock.reset();
    thread::sleep(
        Duration::from_millis(1000).saturating_sub(opened_at.elapsed())
            + Duration::from_millis(200),
    );

    // 16 concurrent, slow (1 s) but healthy requests over two workers: exactly two are probes.
    // (1 s rather than 0.5 s so that no request can arrive after a probe already closed the breaker.)
    const N: usize = 16;
    let port = envoy.port;
    let barrier = Arc::new(Barrier::new(N));
    let results: Vec<(http::Response, Duration)> = thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|_| {
                let barrier = barrier.clone();
                s.spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    let r = http::post(
                        port,
                        tg::CHAT,
                        &[
                            ("x-tenant-id", "t"),
                            ("content-type", "application/json"),
                            ("x-mock-delay-ms", "1000"),
                        ],
                        &chat(MODEL, 10),
                    )
                    .unwrap_or_else(|e| panic!("concurrent POST: {e}"));
                    (r, t0.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let admitted: Vec<_> = results
        .iter()
        .filter(|(r, _)| r.header("x-mock-port").is_some())
        .collect();
    let rejected: Vec<_> = results
        .iter()
        .filter(|(r, _)| r.header("x-mock-port").is_none())
        .collect();
    let slowest_reject = rejected.iter().map(|(_, d)| *d).max().unwrap_or_default();
    println!(
        "half-open with half_open_max_calls 2: {} admitted (statuses {:?}), {} rejected (slowest rejection {slowest_reject:?})",
        admitted.len(),
        admitted.iter().map(|(r, _)| r.status).collect::<Vec<_>>(),
        rejected.len()
    );
    for (r, _) in &rejected {
        let retry_after = assert_circuit_open(r);
        assert!(
            retry_after <= 5.0,
            "half-open rejection resets when the permits expire: {retry_after}"
        );
    }
    for (r, _) in &admitted {
        assert_eq!(
            r.status,
            200,
            "probe answered by the provider: {}",
            r.text()
        );
    }
    settle();
    let reached = mock.count("/chat/completions");
    println!("requests that reached the provider: {reached}");
    assert_eq!(admitted.len(), 2, "probes admitted");
    assert_eq!(
        reached, 2,
        "exactly half_open_max_calls requests reach the provider"
    );
    assert_eq!(envoy.stat("tokengate_breaker_probes"), 2);
    assert_eq!(envoy.stat("tokengate_breaker_half_opened"), 1);
    assert_eq!(
        envoy.wait_stat("tokengate_breaker_closed", 1, STAT_WAIT),
        1,
        "a probe success closed it"
    );
    assert_eq!(
        envoy.stat("tokengate_breaker_short_circuited"),
        (N - 2) as u64
    );
    // Closed again: everything flows. Only the requests actually sent were charged (2 failures, 2
    // probes, this one): the 14 rejected ones were refunded or never charged.
    let r = post(&envoy, &[], &chat(MODEL, 10));
    assert_eq!(r.status, 200, "{}", r.text());
    let cost = header_u64(&r, "x-tokengate-estimated-tokens");
    let left = header_u64(&r, "x-ratelimit-remaining-tokens");
    let refill = started.elapsed().as_secs() + 1;
    assert!(
        left + 5 * cost >= burst && left + 5 * cost <= burst + refill,
        "remaining {left}: burst {burst} − 5 × {cost} + ≤ {refill} s of refill"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn probe_success_closes_the_breaker() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(
            json!({"keys": ["model"], "failure_threshold": 3, "recovery_ms": 1000,
                           "backoff_multiplier": 2.0, "half_open_max_calls": 1}),
        ),
    );
    upstream_fails(&envoy, MODEL, 3, 500, &[]);
    let opened_at = Instant::now();
    expect_opened(&envoy, 1);

    // Healthy requests: rejected until the recovery, then one probe that closes it.
    let (after, r, resets) = poll_until_admitted(
        &envoy,
        &[],
        opened_at,
        Duration::from_millis(50),
        Duration::from_secs(5),
    );
    println!(
        "first open lasted {after:?} (recovery 1000 ms), {} rejections before",
        resets.len()
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !resets.is_empty() && resets[0] <= 1.0,
        "first rejection's retry_after {:?}",
        resets.first()
    );
    assert!(
        after >= Duration::from_millis(950) && after < Duration::from_millis(1600),
        "{after:?}"
    );
    assert_eq!(
        envoy.wait_stat("tokengate_breaker_closed", 1, STAT_WAIT),
        1,
        "log:\n{}",
        breaker_log(&envoy)
    );
    assert!(
        envoy
            .log()
            .contains("breaker tg:cb:model=gpt-test: half_open -> closed (probes_succeeded)"),
        "{}",
        breaker_log(&envoy)
    );
    assert_eq!(envoy.stat("tokengate_breaker_half_opened"), 1);
    assert_eq!(
        envoy.stat_opt("tokengate_breaker_state.model=gpt-test"),
        Some(0),
        "gauge: closed"
    );

    // Closed with an empty window: threshold − 1 new failures do not re-open it.
    for _ in 0..3 {
        assert_eq!(post(&envoy, &[], &chat(MODEL, 10)).status, 200);
    }
    upstream_fails(&envoy, MODEL, 2, 500, &[]);
    settle();
    assert_eq!(
        envoy.stat("tokengate_breaker_opened"),
        1,
        "the window was cleared on close"
    );
    assert_eq!(post(&envoy, &[], &chat(MODEL, 10)).status, 200);
    // And the backoff was reset: the next open lasts recovery_ms again, not 2×.
    let failed_at = Instant::now();
    upstream_fails(&envoy, MODEL, 1, 500, &[]);
    expect_opened(&envoy, 2);
    let r = post(&envoy, &[], &chat(MODEL, 10));
    if r.status == 200 {
        // A loaded machine took longer than recovery_ms to get here: the breaker let the probe
        // through, which a doubled recovery (2 s) would not have done yet.
        let after = failed_at.elapsed();
        assert!(
            after >= Duration::from_millis(950) && after < Duration::from_secs(2),
            "admitted {after:?} after the failure: recovery_ms is 1 s, doubled 2 s"
        );
    } else {
        let retry_after = assert_circuit_open(&r);
        assert!(
            retry_after <= 1.0,
            "recovery back to recovery_ms after a close: retry_after {retry_after}"
        );
    }
    tg::assert_no_panic(&envoy);
}

#[test]
fn probe_failure_reopens_it_with_a_longer_recovery() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(
            json!({"keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 1000,
                           "backoff_multiplier": 2.0, "half_open_max_calls": 1}),
        ),
    );
    upstream_fails(&envoy, MODEL, 2, 500, &[]);
    let opened_at = Instant::now();
    expect_opened(&envoy, 1);

    // The provider is still failing: the first admitted request (the probe) fails.
    let (first, r, _) = poll_until_admitted(
        &envoy,
        &[("x-mock-status", "500")],
        opened_at,
        Duration::from_millis(50),
        Duration::from_secs(5),
    );
    let reopened_at = Instant::now();
    assert_eq!(r.status, 500, "the probe reached the failing provider");
    expect_opened(&envoy, 2);
    assert!(
        envoy
            .log()
            .contains("breaker tg:cb:cluster=provider: half_open -> open (probe_failed)"),
        "{}",
        breaker_log(&envoy)
    );
    // Re-opened for recovery_ms × 2.
    let retry_after = assert_circuit_open(&post(&envoy, &[], &chat(MODEL, 10)));
    assert!(
        retry_after > 1.5 && retry_after <= 2.0,
        "second recovery is 2 s: retry_after {retry_after}"
    );

    // Now healthy: the next probe succeeds.
    let (second, r, _) = poll_until_admitted(
        &envoy,
        &[],
        reopened_at,
        Duration::from_millis(50),
        Duration::from_secs(6),
    );
    println!("first open lasted {first:?}, second {second:?} (recovery 1000 ms, backoff ×2)");
    assert_eq!(r.status, 200);
    assert!(
        first >= Duration::from_millis(950) && first < Duration::from_millis(1600),
        "first open {first:?}"
    );
    assert!(
        second >= Duration::from_millis(1950) && second < Duration::from_millis(2700),
        "second open {second:?}"
    );
    assert_eq!(envoy.wait_stat("tokengate_breaker_closed", 1, STAT_WAIT), 1);
    assert_eq!(envoy.stat("tokengate_breaker_half_opened"), 2);
    assert_eq!(envoy.stat("tokengate_breaker_probes"), 2);
    tg::assert_no_panic(&envoy);
}

#[test]
fn upstream_429_with_retry_after_keeps_it_open_that_long() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 500})),
    );
    // The provider's own 429 and Retry-After are passed to the client unchanged.
    for _ in 0..2 {
        let r = post(
            &envoy,
            &[("x-mock-status", "429"), ("x-mock-retry-after", "3")],
            &chat(MODEL, 10),
        );
        assert_eq!(r.status, 429);
        assert!(r.header("x-mock-port").is_some());
        assert_eq!(r.header("retry-after"), Some("3"));
        assert_eq!(
            r.json()["error"]["code"],
            "rate_limit_exceeded",
            "the provider's body"
        );
    }
    let opened_at = Instant::now();
    expect_opened(&envoy, 1);
    let retry_after = assert_circuit_open(&post(&envoy, &[], &chat(MODEL, 10)));
    assert!(
        retry_after > 2.5 && retry_after <= 3.0,
        "open for the upstream's Retry-After, not recovery_ms: {retry_after}"
    );
    assert_eq!(
        header_u64(&post(&envoy, &[], &chat(MODEL, 10)), "retry-after"),
        3
    );

    // Well past recovery_ms (500 ms) it is still open.
    thread::sleep(Duration::from_millis(1500).saturating_sub(opened_at.elapsed()));
    let retry_after = assert_circuit_open(&post(&envoy, &[], &chat(MODEL, 10)));
    assert!(
        retry_after > 1.0 && retry_after <= 1.5,
        "retry_after at 1.5 s: {retry_after}"
    );
    let (after, r, _) = poll_until_admitted(
        &envoy,
        &[],
        opened_at,
        Duration::from_millis(50),
        Duration::from_secs(5),
    );
    println!("open after 429 + Retry-After: 3 (recovery_ms 500) lasted {after:?}");
    assert_eq!(r.status, 200);
    assert!(
        after >= Duration::from_millis(2950) && after < Duration::from_millis(3600),
        "{after:?}"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_probe_answered_429_with_retry_after_reopens_for_that_long() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(
            json!({"keys": ["cluster"], "failure_threshold": 1, "recovery_ms": 500,
                           "backoff_multiplier": 2.0, "half_open_max_calls": 1}),
        ),
    );
    upstream_fails(&envoy, MODEL, 1, 500, &[]);
    let opened_at = Instant::now();
    expect_opened(&envoy, 1);
    // The probe meets a rate-limited provider that asks for 3 s: longer than the grown recovery (1 s).
    let probe = [("x-mock-status", "429"), ("x-mock-retry-after", "3")];
    let (after, r, _) = poll_until_admitted(
        &envoy,
        &probe,
        opened_at,
        Duration::from_millis(50),
        Duration::from_secs(3),
    );
    assert_eq!((r.status, r.header("retry-after")), (429, Some("3")));
    assert!(
        after < Duration::from_millis(1000),
        "first open is recovery_ms: {after:?}"
    );
    expect_opened(&envoy, 2);
    let r = post(&envoy, &[], &chat(MODEL, 10));
    let retry_after = assert_circuit_open(&r);
    assert!(
        retry_after > 2.5 && retry_after <= 3.0,
        "re-opened for the probe's Retry-After: retry_after {retry_after}"
    );
    assert_eq!(header_u64(&r, "retry-after"), 3);
    tg::assert_no_panic(&envoy);
}

#[test]
fn stream_cut_midway_counts_as_failure() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"keys": ["model"], "failure_threshold": 2, "recovery_ms": 30_000})),
    );
    // Complete streams are successes, however many.
    for _ in 0..4 {
        let s = post_stream(&envoy, &[]);
        assert_eq!(s.status, 200);
        assert!(s.complete, "complete stream: {:?}", s.error);
        assert_eq!(
            http::sse_data(&s.body()).last().map(String::as_str),
            Some("[DONE]")
        );
    }
    settle();
    assert_eq!(envoy.stat("tokengate_breaker_opened"), 0);

    // Streams the provider cuts after two events (no [DONE], no final chunk).
    for _ in 0..2 {
        let s = post_stream(&envoy, &[("x-mock-cut-after", "2")]);
        assert_eq!(s.status, 200, "the stream had started");
        assert!(!s.complete, "the client sees the cut");
        assert_eq!(
            http::sse_data(&s.body()).len(),
            2,
            "two events then the cut: {}",
            s.text()
        );
    }
    expect_opened(&envoy, 1);
    let r = post(&envoy, &[], &stream_body(MODEL));
    assert_circuit_open(&r);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains(MODEL));
    tg::assert_no_panic(&envoy);
}

#[test]
fn cut_streams_do_not_count_when_count_incomplete_streams_is_off() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(
            json!({"keys": ["model"], "failure_threshold": 2, "recovery_ms": 30_000,
                           "count_incomplete_streams": false}),
        ),
    );
    for _ in 0..4 {
        let s = post_stream(&envoy, &[("x-mock-cut-after", "2")]);
        assert_eq!(s.status, 200, "the stream had started");
        assert!(!s.complete, "the client sees the cut");
    }
    settle();
    assert_eq!(
        envoy.stat("tokengate_breaker_opened"),
        0,
        "log:\n{}",
        breaker_log(&envoy)
    );
    // A failure status still counts with the option off.
    for _ in 0..2 {
        let r = post(&envoy, &[("x-mock-status", "500")], &chat(MODEL, 10));
        assert_eq!(r.status, 500);
    }
    expect_opened(&envoy, 1);
    tg::assert_no_panic(&envoy);
}

#[test]
fn compressed_answers_neither_hide_usage_nor_trip_the_breaker() {
    let mock = mock_provider!();
    let cfg = tg::merge(
        tg::config(json!([rule_with(
            rule("all", "*", "*", 100_000.0, 1_000_000),
            json!({"refund_unused": true})
        )])),
        json!({"breaker": {"keys": ["model"], "failure_threshold": 2, "recovery_ms": 30_000}}),
    );
    let envoy = tg::start(&mock, cfg);
    // A client that accepts gzip (the OpenAI SDKs do): the filter asks the provider for identity, so
    // the usage is read and the unused reservation (1024 default output, 16 used) is given back.
    let body = br#"{"model":"gpt-test","messages":[{"role":"user","content":"Say hello"}]}"#;
    let r = post(&envoy, &[("accept-encoding", "gzip")], body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-encoding"), None);
    assert!(r.json()["usage"]["total_tokens"].as_u64().is_some());
    settle();
    let got = mock.requests();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].header("accept-encoding"),
        None,
        "removed before the provider"
    );
    let credited = envoy.wait_stat("tokengate_tokens_credited", 1000, STAT_WAIT);
    assert!(credited >= 1000, "unused output given back: {credited}");
    // A provider that compresses anyway: complete streams must not read as cut ones (they used to
    // open the breaker), and their unknown usage gives nothing back.
    for _ in 0..3 {
        let s = post_stream(&envoy, &[("x-mock-gzip", "1")]);
        assert_eq!(s.status, 200);
        assert_eq!(s.header("content-encoding"), Some("gzip"));
    }
    settle();
    assert_eq!(
        envoy.stat("tokengate_breaker_opened"),
        0,
        "log:\n{}",
        breaker_log(&envoy)
    );
    assert_eq!(envoy.stat("tokengate_tokens_credited"), credited);
    tg::assert_no_panic(&envoy);
}

#[test]
fn client_4xx_does_not_count() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"failure_threshold": 2, "recovery_ms": 30_000})),
    );
    for status in [400u16, 404, 400, 404, 422, 401] {
        let r = post(
            &envoy,
            &[("x-mock-status", &status.to_string())],
            &chat(MODEL, 10),
        );
        assert_eq!(r.status, status, "the provider's 4xx is passed on");
        assert!(r.header("x-mock-port").is_some());
        assert_eq!(r.json()["error"]["code"], "mock_error");
    }
    settle();
    assert_eq!(
        envoy.stat("tokengate_breaker_opened"),
        0,
        "log:\n{}",
        breaker_log(&envoy)
    );
    let r = post(&envoy, &[], &chat(MODEL, 10));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.count("/chat/completions"), 7);
    tg::assert_no_panic(&envoy);
}

#[test]
fn cross_cluster_fallback_reaches_the_second_mock_cluster() {
    let primary = mock_provider!();
    let fallback = mock_provider!();
    let cfg = config_with(json!({
        "keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 30_000,
        "cluster_fallbacks": {"provider": {"cluster": "provider_fallback", "route": "fallback"}}}));
    let envoy = tg::start_opts(EnvoyOpts::new(primary.port, cfg).fallback(fallback.port));
    // Closed: everything goes to the primary, without a fallback header.
    let r = post(&envoy, &[], &chat(MODEL, 10));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-mock-port"),
        Some(primary.port.to_string().as_str())
    );
    assert!(r.header("x-tokengate-fallback").is_none());
    upstream_fails(&envoy, MODEL, 2, 503, &[]);
    expect_opened(&envoy, 1);
    primary.reset();
    assert!(fallback.requests().is_empty());

    let r = post(&envoy, &[("x-mock-id", "whoever")], &chat(MODEL, 10));
    assert_eq!(
        r.status,
        200,
        "answered through the fallback; headers {:?} body {}",
        r.headers,
        r.text()
    );
    assert_eq!(
        r.header("x-mock-port"),
        Some(fallback.port.to_string().as_str()),
        "served by the fallback mock"
    );
    assert_eq!(r.header("x-mock-served-by"), Some("whoever"));
    assert_eq!(
        r.header("x-tokengate-fallback"),
        Some("provider -> provider_fallback")
    );
    assert!(
        r.header("x-tokengate-estimated-tokens").is_some(),
        "still metered"
    );
    assert_eq!(r.json()["model"], MODEL);
    settle();
    assert!(
        primary.requests().is_empty(),
        "the open primary received {:?}",
        primary.requests()
    );
    assert!(primary.incomplete_requests().is_empty());
    let got = fallback.requests();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].header("x-tokengate-route"),
        None,
        "the route config removes the filter's header once the route is chosen"
    );
    assert_eq!(
        got[0].json(),
        serde_json::from_slice::<Value>(&chat(MODEL, 10)).unwrap()
    );
    assert_eq!(envoy.stat("tokengate_breaker_fallbacks"), 1);
    tg::assert_no_panic(&envoy);
}

#[test]
fn same_cluster_model_fallback_reaches_the_provider_with_the_new_model() {
    let mock = mock_provider!();
    let mut cfg = tg::config(json!([
        // Refill 1 token/s: the remaining tokens show which bucket was charged.
        rule("gpt", "*", "gpt-4.1", 1.0, 50_000),
        rule("ds", "*", "deepseek-v3.2", 1.0, 70_000),
        rule("rest", "*", "*", 1.0, 90_000)
    ]));
    cfg["breaker"] = json!({"keys": ["model"], "failure_threshold": 2, "recovery_ms": 30_000,
                            "model_fallbacks": {"gpt-4.1": "deepseek-v3.2"}});
    let envoy = tg::start(&mock, cfg);
    // deepseek is healthy; only gpt-4.1 requests fail.
    let r = post(&envoy, &[], &chat("deepseek-v3.2", 10));
    assert_eq!(r.status, 200);
    let ds_left = header_u64(&r, "x-ratelimit-remaining-tokens");
    upstream_fails(&envoy, "gpt-4.1", 2, 500, &[]);
    expect_opened(&envoy, 1);
    mock.reset();

    let sent = chat("gpt-4.1", 10);
    let r = post(&envoy, &[], &sent);
    assert_eq!(r.status, 200, "headers {:?} body {}", r.headers, r.text());
    assert!(r.header("x-mock-port").is_some());
    assert_eq!(
        r.header("x-tokengate-fallback"),
        Some("gpt-4.1 -> deepseek-v3.2")
    );
    assert_eq!(
        r.json()["model"],
        "deepseek-v3.2",
        "the provider served the fallback model"
    );
    // The deepseek bucket was charged, not gpt-4.1's.
    let cost = header_u64(&r, "x-tokengate-estimated-tokens");
    assert_eq!(
        header_u64(&r, "x-ratelimit-limit-tokens"),
        70_000,
        "the fallback model's rule"
    );
    let left = header_u64(&r, "x-ratelimit-remaining-tokens");
    assert!(
        left + cost >= ds_left && left + cost <= ds_left + 10,
        "deepseek bucket {ds_left} -> {left} after a charge of {cost} (≤ 10 s of refill at 1/s)"
    );
    settle();
    let got = mock.requests();
    assert_eq!(got.len(), 1);
    let mut expect: Value = serde_json::from_slice(&sent).unwrap();
    expect["model"] = json!("deepseek-v3.2");
    assert_eq!(
        got[0].json(),
        expect,
        "the whole body arrives, only the model changed: {}",
        got[0].body
    );
    assert!(mock.incomplete_requests().is_empty());
    // The connection to the provider is still sound for the next request (no stale content-length).
    let r = post(&envoy, &[], &chat("other-model", 10));
    assert_eq!(
        (r.status, r.json()["model"].clone()),
        (200, json!("other-model"))
    );
    assert_eq!(envoy.stat("tokengate_breaker_fallbacks"), 1);
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_fallback_target_with_an_open_breaker_is_not_used() {
    let primary = mock_provider!();
    let fallback = mock_provider!();
    let cfg = config_with(json!({
        "keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 30_000,
        "cluster_fallbacks": {"provider": {"cluster": "provider_fallback", "route": "fallback"}}}));
    let envoy = tg::start_opts(EnvoyOpts::new(primary.port, cfg).fallback(fallback.port));
    upstream_fails(&envoy, MODEL, 2, 500, &[]);
    expect_opened(&envoy, 1);
    // Now requests go to the fallback, which fails too.
    for _ in 0..2 {
        let r = post(&envoy, &[("x-mock-status", "500")], &chat(MODEL, 10));
        assert_eq!(r.status, 500);
        assert_eq!(
            r.header("x-mock-port"),
            Some(fallback.port.to_string().as_str())
        );
        assert_eq!(
            r.header("x-tokengate-fallback"),
            Some("provider -> provider_fallback")
        );
    }
    expect_opened(&envoy, 2);
    primary.reset();
    fallback.reset();
    let r = post(&envoy, &[], &chat(MODEL, 10));
    let retry_after = assert_circuit_open(&r);
    assert!(retry_after > 25.0 && retry_after <= 30.0, "{retry_after}");
    assert!(r.header("x-tokengate-fallback").is_none());
    settle();
    assert!(primary.requests().is_empty() && primary.incomplete_requests().is_empty());
    assert!(fallback.requests().is_empty() && fallback.incomplete_requests().is_empty());
    tg::assert_no_panic(&envoy);
}

#[test]
fn an_open_fallback_model_is_not_used_either() {
    let mock = mock_provider!();
    let cfg = config_with(
        json!({"keys": ["model"], "failure_threshold": 2, "recovery_ms": 30_000,
                                 "model_fallbacks": {"gpt-4.1": "deepseek-v3.2"}}),
    );
    let envoy = tg::start(&mock, cfg);
    upstream_fails(&envoy, "gpt-4.1", 2, 500, &[]);
    upstream_fails(&envoy, "deepseek-v3.2", 2, 500, &[]);
    expect_opened(&envoy, 2);
    mock.reset();
    let r = post(&envoy, &[], &chat("gpt-4.1", 10));
    assert_circuit_open(&r);
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("gpt-4.1"), "names the requested model: {msg}");
    assert!(r.header("x-tokengate-fallback").is_none());
    // A model without a breaker problem still passes.
    assert_eq!(post(&envoy, &[], &chat(MODEL, 10)).status, 200);
    settle();
    let got = mock.requests();
    assert_eq!(
        got.len(),
        1,
        "only the healthy model's request completed at the provider: {got:?}"
    );
    assert_eq!(got[0].json()["model"], MODEL);
    tg::assert_no_panic(&envoy);
}

#[test]
fn bad_breaker_config_is_refused_at_load() {
    let mock = mock_provider!();
    let base = tg::config(json!([rule("all", "*", "*", 1.0, 1000)]));
    let cases = [
        (
            "breaker.half_open_max_calls",
            json!({"half_open_max_calls": 0}),
        ),
        ("probe_permits", json!({"probe_permits": 2})),
        (
            "breaker.failure_statuses",
            json!({"failure_statuses": [[400, 499]]}),
        ),
        ("breaker.keys[0]", json!({"keys": ["provider"]})),
        (
            "breaker.half_open_successes_to_close",
            json!({"half_open_max_calls": 2, "half_open_successes_to_close": 3}),
        ),
        (
            "breaker.max_recovery_ms",
            json!({"recovery_ms": 5000, "max_recovery_ms": 1000}),
        ),
        (
            "breaker.cluster_fallbacks.provider",
            json!({"cluster_fallbacks": {"provider": {"cluster": "provider", "route": "x"}}}),
        ),
    ];
    for (field, breaker) in cases {
        let cfg = tg::merge(base.clone(), json!({ "breaker": breaker }));
        let log = Envoy::start_expect_failure(EnvoyOpts::new(mock.port, cfg.clone()));
        let naming: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("invalid configuration") && l.contains(field))
            .collect();
        assert!(
            !naming.is_empty(),
            "no log line names {field:?} for {cfg}:\n{log}"
        );
        println!("{field}: {}", naming[0]);
    }
    // The unknown field is rejected as unknown, not ignored.
    let cfg = tg::merge(base, json!({"breaker": {"probe_permits": 2}}));
    let log = Envoy::start_expect_failure(EnvoyOpts::new(mock.port, cfg));
    assert!(log.contains("unknown field `probe_permits`"), "{log}");
    assert!(mock.requests().is_empty());
}

#[test]
fn connect_failure_counts() {
    let dead_port = {
        let m: MockProvider = mock_provider!();
        m.port
    }; // dropped: nobody listens there any more
    let envoy = tg::start_opts(EnvoyOpts::new(
        dead_port,
        config_with(json!({"keys": ["cluster"], "failure_threshold": 3, "recovery_ms": 30_000})),
    ));
    // Envoy's own 503s for the connection failure (plain text, not the breaker's JSON).
    for i in 0..3 {
        let r = post(&envoy, &[], &chat(MODEL, 10));
        assert_eq!(r.status, 503, "#{i}: {}", r.text());
        assert!(
            r.text().contains("upstream connect error"),
            "#{i} is Envoy's connect failure: {}",
            r.text()
        );
        assert!(r.header("x-mock-port").is_none());
    }
    expect_opened(&envoy, 1);
    let t0 = Instant::now();
    let r = post(&envoy, &[], &chat(MODEL, 10));
    println!(
        "connect failures opened the breaker; next 503 in {:?}",
        t0.elapsed()
    );
    let retry_after = assert_circuit_open(&r);
    assert!(retry_after > 25.0 && retry_after <= 30.0, "{retry_after}");
    assert!(envoy
        .log()
        .contains("breaker tg:cb:cluster=provider: closed -> open (failure_threshold)"));
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_client_hanging_up_mid_stream_does_not_count() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"keys": ["model"], "failure_threshold": 2, "recovery_ms": 30_000})),
    );
    // The provider streams slowly; the client goes away after the first bytes, 4 times.
    for _ in 0..4 {
        let mut h = vec![("x-tenant-id", "t"), ("content-type", "application/json")];
        h.push(("x-mock-chunk-delay-ms", "300"));
        let opts = http::StreamOpts {
            abort_after_bytes: Some(1),
            ..Default::default()
        };
        let s = http::post_stream(envoy.port, tg::CHAT, &h, &stream_body(MODEL), &opts).unwrap();
        assert_eq!(s.status, 200);
        assert!(s.aborted && !s.complete);
    }
    thread::sleep(Duration::from_millis(600));
    assert_eq!(
        envoy.stat("tokengate_breaker_opened"),
        0,
        "the client's hang-up is not the provider's failure:\n{}",
        breaker_log(&envoy)
    );
    let r = post(&envoy, &[], &stream_body(MODEL));
    assert_eq!(r.status, 200, "{}", r.text());
    tg::assert_no_panic(&envoy);
}

#[test]
fn non_stream_body_cut_counts_as_failure() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"keys": ["model"], "failure_threshold": 2, "recovery_ms": 30_000})),
    );
    // The provider sends its headers and half the JSON body, then closes.
    for _ in 0..2 {
        let res = http::post(
            envoy.port,
            tg::CHAT,
            &[
                ("x-tenant-id", "t"),
                ("content-type", "application/json"),
                ("x-mock-cut-after", "1"),
            ],
            &chat(MODEL, 10),
        );
        assert!(
            res.is_err(),
            "the client cannot get a complete body: {res:?}"
        );
    }
    expect_opened(&envoy, 1);
    assert_circuit_open(&post(&envoy, &[], &chat(MODEL, 10)));
    tg::assert_no_panic(&envoy);
}

#[test]
fn upstream_reset_counts() {
    let mock = mock_provider!();
    let envoy = tg::start(
        &mock,
        config_with(json!({"keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 30_000})),
    );
    // The provider reads the request and closes the connection without answering: Envoy's 503 (UC).
    for _ in 0..2 {
        let r = post(&envoy, &[("x-mock-reset", "1")], &chat(MODEL, 10));
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.header("x-mock-port").is_none());
        assert!(
            r.text().contains("reset reason: connection termination"),
            "Envoy's own reply: {}",
            r.text()
        );
    }
    expect_opened(&envoy, 1);
    assert_circuit_open(&post(&envoy, &[], &chat(MODEL, 10)));
    tg::assert_no_panic(&envoy);
}

// FAILS: Envoy 1.40 gives an upstream response timeout the response code details
// `response_timeout` (envoy.log: "Sending local reply with details response_timeout", access log flag
// UT); breaker::FailurePolicy::default().failure_reasons lists `upstream_response_timeout` instead, and
// classify() returns "counts neither way" for any other local reason before it looks at the 504, so
// route timeouts never open the breaker.
#[test]
fn upstream_timeout_counts() {
    let mock = mock_provider!();
    let mut opts = EnvoyOpts::new(
        mock.port,
        config_with(json!({"keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 30_000})),
    );
    opts.route_timeout_ms = 300;
    let envoy = tg::start_opts(opts);
    // Slower than the route timeout: Envoy's 504 (UT).
    for _ in 0..2 {
        let t0 = Instant::now();
        let r = post(&envoy, &[("x-mock-delay-ms", "1500")], &chat(MODEL, 10));
        assert_eq!(r.status, 504, "{}", r.text());
        assert_eq!(r.text(), "upstream request timeout");
        assert!(
            t0.elapsed() < Duration::from_millis(1200),
            "answered at the route timeout"
        );
    }
    expect_opened(&envoy, 1);
    assert_circuit_open(&post(&envoy, &[], &chat(MODEL, 10)));
    tg::assert_no_panic(&envoy);
}
