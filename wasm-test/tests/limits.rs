//! `limits` through real Envoy (issue 13): every matching limit charged all or nothing, at tenant, group
//! and shared scope, in this Envoy's shared data and in Redis (`global`), requests in flight, shadow mode.
//!
//! Envoy runs with 2 workers (the harness default) in front of the mock provider; the global test runs two
//! Envoys sharing one Redis behind Webdis; the JWT test runs the SHIPPED filter chain (`envoy/envoy.yaml`:
//! client copies of the identity headers removed, `jwt_authn` setting them from a verified token) with a
//! plugin configuration of limits. Loads are bounded in time and count and on loopback only.
//!
//! Bounds are checked on what clients were admitted: the sum of `x-tokengate-estimated-tokens` of the 200s
//! (what each bucket was charged), per subject of every limit, against `burst + tokens_per_second ×
//! elapsed` (the buckets are created full at the first request, after the clock started). Requests in
//! flight are counted at the mock provider (`x-mock-concurrency`): from the moment it has a request's body
//! until it answered it or the client went away.

mod jwt;
mod shipped;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};
use wasm_test::http::{self, StreamOpts};
use wasm_test::{
    free_port, mock_provider, tg, Envoy, EnvoyOpts, MockProvider, RedisServer, Webdis,
};

const MODEL: &str = "gpt-test";
/// The trusted header naming a request's team (`group_header`).
const TEAM: &str = "x-tokengate-team";
/// Requests per client thread at most, whatever the duration.
const MAX_PER_CLIENT: usize = 2000;
/// A refused client waits this long before asking again (bounds the request rate of the load).
const BACKOFF: Duration = Duration::from_millis(10);

/// A token-bucket limit.
fn limit(name: &str, scope: &str, rate: f64, burst: u64) -> Value {
    json!({"name": name, "scope": scope, "tokens_per_second": rate, "burst": burst})
}

/// Tenants from `x-tenant-id`, one group level from [`TEAM`], these limits and no rules.
fn config(limits: Value) -> Value {
    json!({"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test client: it is the trusted filter"}, "forward_identity_headers": true, "api_key_tenants": false, "group_header": TEAM,
           "limits": limits})
}

fn start(mock: &MockProvider, cfg: Value) -> Envoy {
    tg::start_opts(EnvoyOpts::new(mock.port, cfg))
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

/// One client thread: a tenant of a team sending chat requests to one Envoy on a keep-alive connection,
/// as fast as it is answered (`pace` zero) or one every `pace`.
#[derive(Clone)]
struct Client {
    port: u16,
    tenant: &'static str,
    team: &'static str,
    max_tokens: u64,
    pace: Duration,
}

impl Client {
    fn new(port: u16, tenant: &'static str, team: &'static str) -> Client {
        Client {
            port,
            tenant,
            team,
            max_tokens: 200,
            pace: Duration::ZERO,
        }
    }
}

/// One answer.
#[derive(Clone, Debug)]
struct Outcome {
    tenant: &'static str,
    team: &'static str,
    status: u16,
    /// `x-tokengate-estimated-tokens` (what an admitted request was charged).
    cost: u64,
    /// `x-tokengate-limit` of a refusal: the limit that refused.
    limit: Option<String>,
}

/// The answers of a load and how long it took.
struct Run {
    outcomes: Vec<Outcome>,
    elapsed_s: f64,
}

impl Run {
    /// Tokens admitted for the requests `pick` selects.
    fn admitted(&self, pick: impl Fn(&Outcome) -> bool) -> u64 {
        self.outcomes
            .iter()
            .filter(|o| o.status == 200 && pick(o))
            .map(|o| o.cost)
            .sum()
    }

    /// Requests refused by the limit `name`.
    fn refused_by(&self, name: &str) -> usize {
        self.outcomes
            .iter()
            .filter(|o| o.limit.as_deref() == Some(name))
            .count()
    }

    /// Tokens asked for by the requests `pick` selects (the cost of any admitted request stands for
    /// the refused ones: every request of a client has the same body).
    fn asked(&self, pick: impl Fn(&Outcome) -> bool) -> u64 {
        let cost = self
            .outcomes
            .iter()
            .find(|o| o.status == 200 && pick(o))
            .map_or(0, |o| o.cost);
        cost * self.outcomes.iter().filter(|o| pick(o)).count() as u64
    }

    /// Every status other than 200 and 429, with the limit that refused.
    fn unexpected(&self) -> Vec<(u16, Option<String>)> {
        self.outcomes
            .iter()
            .filter(|o| o.status != 200 && o.status != 429)
            .map(|o| (o.status, o.limit.clone()))
            .collect()
    }

    fn tokens_per(&self, key: impl Fn(&Outcome) -> &'static str) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for o in self.outcomes.iter().filter(|o| o.status == 200) {
            *m.entry(key(o)).or_insert(0) += o.cost;
        }
        m
    }
}

/// Runs every client in its own thread for `duration` (and at most [`MAX_PER_CLIENT`] requests each).
fn drive(clients: &[Client], duration: Duration) -> Run {
    let start = Instant::now();
    let handles: Vec<_> = clients
        .iter()
        .cloned()
        .map(|c| {
            thread::spawn(move || {
                let mut conn = http::Client::new(c.port);
                let body = tg::chat(MODEL, c.max_tokens);
                let headers = [
                    ("x-tenant-id", c.tenant),
                    (TEAM, c.team),
                    ("content-type", "application/json"),
                ];
                let mut out = Vec::new();
                while start.elapsed() < duration && out.len() < MAX_PER_CLIENT {
                    let r = conn
                        .post(tg::CHAT, &headers, &body)
                        .unwrap_or_else(|e| panic!("{} POST: {e}", c.tenant));
                    out.push(Outcome {
                        tenant: c.tenant,
                        team: c.team,
                        status: r.status,
                        cost: r
                            .header("x-tokengate-estimated-tokens")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0),
                        limit: r.header("x-tokengate-limit").map(str::to_string),
                    });
                    if r.status != 200 {
                        thread::sleep(BACKOFF);
                    }
                    thread::sleep(c.pace);
                }
                out
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.extend(h.join().expect("client thread"));
    }
    Run {
        outcomes,
        elapsed_s: start.elapsed().as_secs_f64(),
    }
}

/// Asserts `admitted ≤ burst + rate × elapsed`; returns that bound.
fn assert_within(what: &str, admitted: u64, rate: f64, burst: u64, elapsed_s: f64) -> f64 {
    let bound = burst as f64 + rate * elapsed_s;
    assert!(
        admitted as f64 <= bound,
        "{what}: admitted {admitted} tokens > burst + rate x elapsed = {bound:.0} ({elapsed_s:.2} s)"
    );
    bound
}

// ---------------------------------------------------------------------------------------------
// Composed bucket limits: tenant ⊂ team ⊂ provider
// ---------------------------------------------------------------------------------------------

/// Tenants and their teams of the composed-limit loads: red and blue have three tenants each (more than
/// their team allows), green one (its own limit binds).
const TENANTS: [(&str, &str); 7] = [
    ("r1", "red"),
    ("r2", "red"),
    ("r3", "red"),
    ("b1", "blue"),
    ("b2", "blue"),
    ("b3", "blue"),
    ("g1", "green"),
];

/// (name, scope, tokens/s, burst), narrowest first: a refusal names the first limit short of tokens.
/// Each binds: green's one tenant is held by `user`; red's and blue's three tenants (4,500 tokens of
/// burst) by `team` (2,500) from the start; the teams' bursts (6,500) fit the provider's 7,000, but they
/// refill at 1,600 tokens/s against its 600, so `provider` binds from about 0.5 s on (without it, 15 %
/// more would be admitted in 2 s).
const COMPOSED: [(&str, &str, f64, u64); 3] = [
    ("user", "tenant", 400.0, 1500),
    ("team", "group", 600.0, 2500),
    ("provider", "shared", 600.0, 7000),
];

fn composed_limits(global: bool) -> Value {
    Value::Array(
        COMPOSED
            .iter()
            .map(|(name, scope, rate, burst)| {
                let mut l = limit(name, scope, *rate, *burst);
                l["global"] = json!(global);
                if *scope == "shared" {
                    l["model"] = json!(MODEL);
                }
                l
            })
            .collect(),
    )
}

/// Every limit's bound holds for every one of its subjects at once, each limit refused some requests,
/// and the binding one (provider) was used to at least 75 % of its bound (the load reached it, and a
/// refusal by one limit did not waste the tokens the others had taken: they were given back).
fn assert_composed_bounds(run: &Run) {
    let el = run.elapsed_s;
    assert!(run.unexpected().is_empty(), "{:?}", run.unexpected());
    let [(_, _, user_rate, user_burst), (_, _, team_rate, team_burst), (_, _, prov_rate, prov_burst)] =
        COMPOSED;
    let per_tenant = run.tokens_per(|o| o.tenant);
    let per_team = run.tokens_per(|o| o.team);
    let total = run.admitted(|_| true);
    println!(
        "{} requests in {el:.2} s; admitted tokens per tenant {per_tenant:?}, per team {per_team:?}, \
         in all {total}; refused by user {}, team {}, provider {}",
        run.outcomes.len(),
        run.refused_by("user"),
        run.refused_by("team"),
        run.refused_by("provider")
    );
    for (tenant, _) in TENANTS {
        let got = per_tenant.get(tenant).copied().unwrap_or(0);
        assert_within(&format!("tenant {tenant}"), got, user_rate, user_burst, el);
        assert!(got > 0, "tenant {tenant} got nothing: {per_tenant:?}");
    }
    for team in ["red", "blue", "green"] {
        let got = per_team.get(team).copied().unwrap_or(0);
        assert_within(&format!("team {team}"), got, team_rate, team_burst, el);
    }
    let bound = assert_within("provider", total, prov_rate, prov_burst, el);
    assert!(
        total as f64 >= 0.75 * bound,
        "admitted {total} tokens in all, far below the provider's {bound:.0}: the load did not reach it"
    );
    for name in ["user", "team", "provider"] {
        assert!(run.refused_by(name) > 0, "limit {name} never refused");
    }
}

#[test]
fn tenant_team_and_provider_limits_all_hold_at_once_with_two_workers() {
    let mock = mock_provider!();
    let envoy = start(&mock, config(composed_limits(false)));
    let clients: Vec<Client> = TENANTS
        .iter()
        .map(|(t, team)| Client::new(envoy.port, t, team))
        .collect();
    let run = drive(&clients, Duration::from_millis(2000));
    assert_composed_bounds(&run);
    assert_eq!(
        envoy.stat("tokengate_requests_limited_tokens"),
        run.outcomes.iter().filter(|o| o.status == 429).count() as u64
    );
    assert_eq!(envoy.stat("tokengate_cas_exhausted"), 0);
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_noisy_tenant_gets_its_share_and_no_more_while_quiet_tenants_get_theirs() {
    let mock = mock_provider!();
    let (user_rate, user_burst) = (300.0, 1200);
    let envoy = start(
        &mock,
        config(json!([
            limit("user", "tenant", user_rate, user_burst),
            limit("team", "group", 1200.0, 5000),
            limit("provider", "shared", 3000.0, 10000),
        ])),
    );
    // The noisy tenant hammers from three connections; a quiet tenant of its team and one of another
    // team ask for ~40 tokens every 150 ms, well inside their own share.
    let mut clients = vec![Client::new(envoy.port, "noisy", "red"); 3];
    for (tenant, team) in [("quiet-red", "red"), ("quiet-blue", "blue")] {
        clients.push(Client {
            max_tokens: 20,
            pace: Duration::from_millis(150),
            ..Client::new(envoy.port, tenant, team)
        });
    }
    let run = drive(&clients, Duration::from_millis(2000));
    let el = run.elapsed_s;
    assert!(run.unexpected().is_empty(), "{:?}", run.unexpected());
    let noisy = run.admitted(|o| o.tenant == "noisy");
    let asked = run.asked(|o| o.tenant == "noisy");
    println!(
        "{el:.2} s: noisy asked {asked} tokens, was admitted {noisy}; quiet: {:?}",
        run.tokens_per(|o| o.tenant)
    );
    let share = assert_within("noisy tenant", noisy, user_rate, user_burst, el);
    assert!(
        noisy as f64 >= 0.75 * share,
        "the noisy tenant got {noisy} tokens, far below its share {share:.0}"
    );
    // Unchecked it would have taken the whole provider (and starved everyone).
    assert!(
        asked as f64 > 10_000.0 + 3000.0 * el,
        "the noisy tenant asked only {asked} tokens: not noisy enough to show anything"
    );
    for quiet in ["quiet-red", "quiet-blue"] {
        let mine: Vec<&Outcome> = run.outcomes.iter().filter(|o| o.tenant == quiet).collect();
        assert!(mine.len() >= 8, "{quiet}: only {} requests", mine.len());
        let refused: Vec<_> = mine
            .iter()
            .filter(|o| o.status != 200)
            .map(|o| (o.status, o.limit.clone()))
            .collect();
        assert!(
            refused.is_empty(),
            "{quiet} asked for less than its share and was refused: {refused:?}"
        );
    }
    assert_eq!(run.refused_by("team") + run.refused_by("provider"), 0);
    tg::assert_no_panic(&envoy);
}

#[test]
fn global_limits_hold_across_two_envoys_sharing_one_redis() {
    let mock = mock_provider!();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let cfg = tg::merge(
        config(composed_limits(true)),
        json!({"global_buckets": {"cluster": "webdis", "timeout_ms": 1000, "on_failure": "closed"}}),
    );
    let envoys: Vec<Envoy> = (0..2)
        .map(|_| {
            let mut o = EnvoyOpts::new(mock.port, cfg.clone()).webdis(webdis.port);
            o.ready_timeout = Duration::from_secs(60);
            tg::start_opts(o)
        })
        .collect();
    // Every tenant sends through both Envoys: either one alone could admit its whole burst.
    let clients: Vec<Client> = envoys
        .iter()
        .flat_map(|e| TENANTS.iter().map(|(t, team)| Client::new(e.port, t, team)))
        .collect();
    let run = drive(&clients, Duration::from_millis(2000));
    assert_composed_bounds(&run);
    let per_envoy: Vec<u64> = envoys
        .iter()
        .map(|e| e.stat("tokengate_requests_admitted"))
        .collect();
    assert!(
        per_envoy.iter().all(|n| *n > 0),
        "both Envoys admitted: {per_envoy:?}"
    );
    for e in &envoys {
        assert_eq!(e.stat("tokengate_global_shim_errors"), 0);
        assert!(e.stat("tokengate_global_charged") > 0);
        tg::assert_no_panic(e);
    }
}

// ---------------------------------------------------------------------------------------------
// Groups from a verified JWT (the shipped filter chain)
// ---------------------------------------------------------------------------------------------

#[test]
fn a_team_claim_of_a_verified_jwt_drives_the_team_limit_and_a_forged_team_header_does_not() {
    let mock = mock_provider!();
    // The shipped chain: jwt_authn writes a verified token's payload to the dynamic metadata; the
    // tenant and the `team` level are its `tenant` and `group` claims. No header carries identity.
    let cfg = json!({
        "tenant_claim": "tenant", "api_key_tenants": true,
        "groups": [{"name": "team", "claim": "group"}],
        "limits": [{"name": "team", "scope": "team", "tokens_per_second": 0.001, "burst": 1000}]
    });
    let shipped = std::fs::read_to_string(wasm_test::repo_root().join("envoy/envoy.yaml"))
        .expect("envoy.yaml");
    let dir = wasm_test::TempDir::new("limits-jwt");
    let file = dir.path().join("envoy.yaml");
    std::fs::write(&file, shipped::with_plugin_config(&shipped, &cfg)).expect("write envoy.yaml");
    let envoy = shipped::ShippedEnvoy::start_file(&file, mock.port, free_port(), free_port());
    let key = jwt::shipped_demo_key();
    let token = |tenant: &str, team: &str| {
        jwt::mint(
            &key,
            json!({"sub": tenant, "tenant": tenant, "group": team}),
        )
    };
    let (alice, bob, carol) = (
        token("alice", "red"),
        token("bob", "red"),
        token("carol", "blue"),
    );
    let remaining = |r: &http::Response| tg::header_u64(r, "x-ratelimit-remaining-tokens");

    // Team blue's bucket, as carol's first request leaves it.
    let r = envoy.chat(&[("x-tokengate-jwt", carol.as_str())], 10);
    assert_eq!(r.status, 200, "{}", r.text());
    let blue_left = remaining(&r);
    // alice spends team red's 1,000 tokens; her third request does not fit.
    for _ in 0..2 {
        let r = envoy.chat(&[("x-tokengate-jwt", alice.as_str())], 400);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let refused = |r: &http::Response, who: &str| {
        let ours = tg::assert_error(
            r,
            429,
            "tokens",
            "rate_limit_exceeded",
            "tokens_per_second_exceeded",
        );
        assert_eq!(r.header("x-tokengate-limit"), Some("team"), "{who}");
        assert_eq!(ours["limit"], "team", "{who}");
    };
    refused(
        &envoy.chat(&[("x-tokengate-jwt", alice.as_str())], 400),
        "alice",
    );
    // bob is another tenant of team red: refused by the team's limit too.
    refused(
        &envoy.chat(&[("x-tokengate-jwt", bob.as_str())], 400),
        "bob",
    );
    // alice forging team blue next to her token: still team red.
    refused(
        &envoy.chat(
            &[
                ("x-tokengate-jwt", alice.as_str()),
                ("x-tokengate-group", "blue"),
            ],
            400,
        ),
        "alice forging blue",
    );
    // Without a token a client-sent team header names nothing: no team, so no team limit; and blue is
    // not charged for it.
    for _ in 0..3 {
        let r = envoy.chat(
            &[
                ("authorization", "Bearer sk-mallory"),
                ("x-tokengate-group", "blue"),
            ],
            400,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.header("x-ratelimit-remaining-tokens"),
            None,
            "no limit applies to a request without a team"
        );
    }
    let r = envoy.chat(&[("x-tokengate-jwt", carol.as_str())], 10);
    assert_eq!(r.status, 200, "{}", r.text());
    let cost = tg::estimated(&r);
    assert_eq!(
        remaining(&r),
        blue_left - cost,
        "team blue was charged only for carol's requests"
    );
    // Requests without a token count as allowed too (`allow_missing`).
    assert_eq!(envoy.stat("http.tokengate.jwt_authn.allowed"), 10);
    assert_eq!(envoy.stat("http.tokengate.jwt_authn.denied"), 0);
    let served = mock.requests();
    assert_eq!(served.len(), 7, "refused requests never reach the provider");
    // No verified claim reaches the provider (none is copied into a header).
    assert!(served
        .iter()
        .all(|r| r.headers.values().all(|v| v != "red" && v != "carol")));
}

// ---------------------------------------------------------------------------------------------
// Requests in flight
// ---------------------------------------------------------------------------------------------

/// How a client of the in-flight test ends its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Reads the whole stream.
    Complete,
    /// Closes the connection once the first bytes of the stream arrived.
    AbortMidStream,
    /// Gives up 150 ms into a (400 ms) wait for the response.
    AbortBeforeResponse,
    /// Waits for a slow (150 ms) JSON answer.
    Slow,
}

/// What an in-flight client saw.
#[derive(Debug)]
enum Seen {
    /// Admitted; `left_us`: when the client went away (just before it closed the connection), for the
    /// aborting ones.
    Served {
        end: End,
        tag: String,
        left_us: Option<u64>,
    },
    Refused(Option<String>),
    Other(u16),
}

/// Tags the in-flight requests (`x-mock-tag`), to join the mock's record with the client's.
static TAGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One request of the in-flight test for `tenant`, counted by the mock in `all` and `<tenant>`.
fn in_flight_request(port: u16, tenant: &str, end: End) -> Seen {
    let tag = format!(
        "if-{}",
        TAGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let groups = format!("all,{tenant}");
    let mut headers = vec![
        ("x-tenant-id", tenant),
        ("content-type", "application/json"),
        ("x-mock-concurrency", groups.as_str()),
        ("x-mock-tag", tag.as_str()),
        ("x-mock-chunk-delay-ms", "40"),
    ];
    match end {
        End::AbortBeforeResponse => headers.push(("x-mock-delay-ms", "400")),
        End::Slow => headers.push(("x-mock-delay-ms", "150")),
        End::Complete | End::AbortMidStream => {}
    }
    let body = json!({"model": MODEL, "max_tokens": 8, "stream": end != End::Slow,
                      "messages": [{"role": "user", "content": "Count to eight."}]})
    .to_string();
    if matches!(end, End::AbortMidStream | End::AbortBeforeResponse) {
        let (status, limit, left_us) =
            abort(port, &headers, &body, end).unwrap_or_else(|e| panic!("{tenant} {end:?}: {e}"));
        return match status {
            200 => Seen::Served {
                end,
                tag,
                left_us: Some(left_us),
            },
            429 => Seen::Refused(limit),
            other => Seen::Other(other),
        };
    }
    let opts = StreamOpts {
        timeout: Duration::from_secs(5),
        ..StreamOpts::default()
    };
    match http::post_stream(port, tg::CHAT, &headers, body.as_bytes(), &opts) {
        Err(e) => panic!("{tenant} {end:?}: {e}"),
        Ok(r) if r.status == 429 => {
            Seen::Refused(r.header("x-tokengate-limit").map(str::to_string))
        }
        Ok(r) if r.status == 200 => {
            assert!(r.complete, "{tenant} {end:?}: cut short: {:?}", r.error);
            Seen::Served {
                end,
                tag,
                left_us: None,
            }
        }
        Ok(r) => Seen::Other(r.status),
    }
}

/// Sends a request on its own connection and goes away: at the first body byte of a 200
/// (`AbortMidStream`), or after 150 ms without a response (`AbortBeforeResponse`, which then reports
/// 200: it was not refused). Returns the status, `x-tokengate-limit` and when the client left (taken
/// just before the connection is closed).
fn abort(
    port: u16,
    headers: &[(&str, &str)],
    body: &str,
    end: End,
) -> Result<(u16, Option<String>, u64), String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    let mut req = format!("POST {} HTTP/1.1\r\nhost: 127.0.0.1\r\n", tg::CHAT);
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += &format!("content-length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let wait = match end {
        End::AbortBeforeResponse => Duration::from_millis(150),
        _ => Duration::from_secs(5),
    };
    let deadline = Instant::now() + wait;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            if end == End::AbortBeforeResponse && buf.is_empty() {
                let at = wasm_test::unix_micros();
                drop(s);
                return Ok((200, None, at));
            }
            return Err(format!(
                "no complete answer: {:?}",
                String::from_utf8_lossy(&buf)
            ));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match s.read(&mut chunk) {
            Ok(0) => return Err(format!("closed: {:?}", String::from_utf8_lossy(&buf))),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e.to_string()),
        }
        let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("bad head {head:?}"))?;
        let limit = head
            .lines()
            .find_map(|l| l.strip_prefix("x-tokengate-limit:"))
            .map(|v| v.trim().to_string());
        if status != 200 {
            return Ok((status, limit, 0));
        }
        if end == End::AbortBeforeResponse {
            return Err("answered before the client gave up".to_string());
        }
        if buf.len() > head_end + 4 {
            let at = wasm_test::unix_micros();
            drop(s);
            return Ok((200, None, at));
        }
    }
}

/// Waits (≤ 5 s) until `done` holds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: still not after 5 s");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn in_flight_limits_hold_at_the_provider_under_client_aborts_and_free_every_slot() {
    let mock = mock_provider!();
    // At most 2 requests in flight per tenant and 4 through this Envoy; three tenants of four clients
    // each.
    let envoy = start(
        &mock,
        json!({"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test client: it is the trusted filter"}, "forward_identity_headers": true, "api_key_tenants": false, "limits": [
            {"name": "per-user", "max_in_flight": 2},
            {"name": "conc", "scope": "shared", "max_in_flight": 4}]}),
    );
    let tenants = ["a", "b", "c"];
    let ends = [
        End::Complete,
        End::AbortMidStream,
        End::AbortBeforeResponse,
        End::Slow,
    ];
    let start = Instant::now();
    let handles: Vec<_> = (0..12)
        .map(|i| {
            let (port, tenant) = (envoy.port, tenants[i % 3]);
            thread::spawn(move || {
                let mut seen = Vec::new();
                while start.elapsed() < Duration::from_millis(2500) && seen.len() < 200 {
                    let end = ends[(i + seen.len()) % ends.len()];
                    let s = in_flight_request(port, tenant, end);
                    if matches!(s, Seen::Refused(_)) {
                        thread::sleep(Duration::from_millis(15));
                    }
                    seen.push(s);
                }
                seen
            })
        })
        .collect();
    let seen: Vec<Seen> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("client thread"))
        .collect();
    let count = |f: &dyn Fn(&Seen) -> bool| seen.iter().filter(|s| f(s)).count();
    let served = |e: End| count(&|s| matches!(s, Seen::Served { end, .. } if *end == e));
    let refused = |n: &str| count(&|s| matches!(s, Seen::Refused(Some(x)) if x == n));
    println!(
        "{} requests: complete {}, aborted mid-stream {}, aborted before the response {}, slow {}; \
         refused by conc {}, by per-user {}",
        seen.len(),
        served(End::Complete),
        served(End::AbortMidStream),
        served(End::AbortBeforeResponse),
        served(End::Slow),
        refused("conc"),
        refused("per-user"),
    );
    let other: Vec<String> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Other(status) => Some(format!("status {status}")),
            Seen::Refused(None) => Some("429 without x-tokengate-limit".to_string()),
            _ => None,
        })
        .collect();
    assert!(other.is_empty(), "{other:?}");
    for e in ends {
        assert!(served(e) > 0, "no request ended {e:?}");
    }
    assert!(refused("conc") > 0 && refused("per-user") > 0);
    // Everything ended: Envoy has no stream left and the mock no request.
    wait_until("Envoy streams ended", || {
        envoy.stat("http.ingress.downstream_rq_active") == 0
    });
    wait_until("the mock answered everything", || {
        mock.concurrency("all").active == 0
    });
    // A request is in flight from the moment the provider has its body until the provider answered it
    // (its last bytes, recorded before they are sent) or its client went away (recorded before the
    // client closed its connection: the slot cannot be given back earlier). The mock sees a close a
    // little later (Envoy runs on_log, which gives the slot back, just before the router closes the
    // upstream connection, and then the mock has to wake up): `gone` spans end at the client's time.
    let left: BTreeMap<String, u64> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Served {
                tag,
                left_us: Some(t),
                ..
            } => Some((tag.clone(), *t)),
            _ => None,
        })
        .collect();
    let end = |s: &wasm_test::Span| match (s.to_us, left.get(&s.tag)) {
        (Some(to), Some(l)) => Some(to.min(*l)),
        (to, _) => to,
    };
    let all = mock.concurrency("all");
    // Every refusal a client saw is counted; so may be a request whose client gave up before any answer
    // (after 150 ms: on a loaded machine the refusal can come later) and that never reached the mock.
    let at_mock: std::collections::BTreeSet<&str> =
        all.spans.iter().map(|s| s.tag.as_str()).collect();
    let unknown = seen
        .iter()
        .filter(|s| {
            matches!(s, Seen::Served { end: End::AbortBeforeResponse, tag, .. } if !at_mock.contains(tag.as_str()))
        })
        .count() as u64;
    let counted = envoy.stat("tokengate_requests_limited_in_flight");
    let seen_refused = (refused("conc") + refused("per-user")) as u64;
    assert!(
        counted >= seen_refused && counted <= seen_refused + unknown,
        "refusals counted {counted}, seen {seen_refused}, gave up unanswered and never at the mock {unknown}"
    );
    println!(
        "at the mock at once: {} until the mock saw the end, {} until the client went away",
        all.max,
        all.max_at_once(end)
    );
    assert_eq!(
        all.max_at_once(end),
        4,
        "never more than 4 in flight, and the limit was reached: {:?}",
        all.spans
    );
    for t in tenants {
        let c = mock.concurrency(t);
        assert!(c.max_at_once(end) <= 2, "tenant {t}: {:?}", c.spans);
    }

    // No slot leaked: a burst of 4 slow requests all get in, and a fifth is refused while they run.
    let burst: Vec<_> = ["a", "a", "b", "b"]
        .into_iter()
        .map(|tenant| {
            let port = envoy.port;
            thread::spawn(move || {
                http::post(
                    port,
                    tg::CHAT,
                    &[
                        ("x-tenant-id", tenant),
                        ("content-type", "application/json"),
                        ("x-mock-concurrency", "burst"),
                        ("x-mock-delay-ms", "1000"),
                    ],
                    &tg::chat(MODEL, 8),
                )
                .expect("burst POST")
            })
        })
        .collect();
    wait_until("the burst at the provider", || {
        mock.concurrency("burst").active == 4
    });
    let fifth = http::post(
        envoy.port,
        tg::CHAT,
        &[("x-tenant-id", "c"), ("content-type", "application/json")],
        &tg::chat(MODEL, 8),
    )
    .expect("POST");
    let ours = tg::assert_error(
        &fifth,
        429,
        "requests",
        "rate_limit_exceeded",
        "concurrency_limit_exceeded",
    );
    assert_eq!(ours["limit"], "conc");
    for h in burst {
        let r = h.join().expect("burst thread");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    tg::assert_no_panic(&envoy);
}

// ---------------------------------------------------------------------------------------------
// Shadow mode
// ---------------------------------------------------------------------------------------------

#[test]
fn a_shadow_limit_never_refuses_and_counts_what_it_would_have_refused() {
    let mock = mock_provider!();
    let envoy = start(
        &mock,
        json!({"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test client: it is the trusted filter"}, "forward_identity_headers": true, "api_key_tenants": false, "limits": [
            {"name": "trial", "tenant": "acme", "tokens_per_second": 0.001, "burst": 1000, "shadow": true},
            {"name": "conc", "tenant": "slow", "max_in_flight": 1, "shadow": true},
            {"name": "real", "tokens_per_second": 0.001, "burst": 100000}]}),
    );
    // acme: six requests of ~315 tokens against trial's 1,000 (no refill to speak of).
    let mut left = 1000u64;
    let mut would_refuse = 0;
    for _ in 0..6 {
        let r = tg::post_chat(&envoy, "acme", &tg::chat(MODEL, 300));
        let cost = tg::admitted(&r);
        // The headers report the enforced limit only.
        assert_eq!(tg::header_u64(&r, "x-ratelimit-limit-tokens"), 100_000);
        if cost <= left {
            left -= cost;
        } else {
            would_refuse += 1;
        }
    }
    assert_eq!(
        would_refuse, 3,
        "1,000 tokens hold three requests of ~310 (left {left})"
    );
    // slow: a second request while the first is at the provider would exceed conc's one slot.
    let port = envoy.port;
    let first = thread::spawn(move || {
        http::post(
            port,
            tg::CHAT,
            &[
                ("x-tenant-id", "slow"),
                ("content-type", "application/json"),
                ("x-mock-concurrency", "slow"),
                ("x-mock-delay-ms", "800"),
            ],
            &tg::chat(MODEL, 8),
        )
        .expect("POST")
    });
    wait_until("the first slow request at the provider", || {
        mock.concurrency("slow").active == 1
    });
    let second = tg::post_chat(&envoy, "slow", &tg::chat(MODEL, 8));
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(first.join().expect("first").status, 200);
    assert_eq!(
        envoy.stat("tokengate_shadow_refusals"),
        would_refuse + 1,
        "every would-be refusal counted"
    );
    assert_eq!(envoy.stat("tokengate_requests_limited_tokens"), 0);
    assert_eq!(envoy.stat("tokengate_requests_limited_in_flight"), 0);
    assert!(
        envoy.wait_log(
            "shadow limit 'trial' would have refused a request of tenant 'acme'",
            Duration::from_secs(2)
        ),
        "{}",
        envoy.log()
    );
    assert_eq!(mock.count("/chat/completions"), 8);
    tg::assert_no_panic(&envoy);
}
