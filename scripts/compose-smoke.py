#!/usr/bin/env python3
"""Smoke test of a running envoy/docker-compose.yaml stack (run by scripts/compose-test.sh).

    scripts/compose-smoke.py LISTENER_PORT ADMIN_PORT

Through the stack's Envoy on 127.0.0.1 (mocks, Redis and Webdis behind it), checks the answers of the
shipped configuration: admitted (with the quota reserved in Redis through Webdis), rate-limited (demo-small),
global bucket (demo-global, in Redis), monthly quota (demo-quota), circuit breaker (open after 20 upstream
failures: 503 circuit_open for the model, the fallback cluster for others), identity (a client-sent
x-tenant-id does not pick the tenant; a bad token is refused with 401) and the metrics. Demo tokens are minted
with scripts/demo-token.py from envoy/envoy-docker.yaml's jwt_authn example. Every request has a 15 s timeout.
Ends with `compose-smoke: N passed, M failed` and exits 1 if any failed.
"""
import json
import subprocess
import sys
import urllib.error
import urllib.request

PORT, ADMIN = int(sys.argv[1]), int(sys.argv[2])
URL = f"http://127.0.0.1:{PORT}/v1/chat/completions"
results = []


def token(tenant):
    return subprocess.check_output(
        [sys.executable, "scripts/demo-token.py", tenant, "smoke", "--config", "envoy/envoy-docker.yaml",
         "--ttl", "600"], text=True).strip()


def chat(headers, model="gpt-4.1", max_tokens=64):
    body = json.dumps({"model": model, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "Say hello"}]}).encode()
    req = urllib.request.Request(URL, data=body, method="POST",
                                 headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, dict(r.headers), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode(errors="replace")


def error(body):
    """(type, code, tokengate.reason) of an OpenAI-shaped error body, or (None, None, None)."""
    try:
        doc = json.loads(body)
        err = doc.get("error", {})
        return err.get("type"), err.get("code"), doc.get("tokengate", {}).get("reason")
    except (ValueError, AttributeError):
        return None, None, None


def check(name, ok, detail=""):
    results.append(ok)
    print(f"compose-smoke: {'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}", flush=True)


def lower(h):
    return {k.lower(): v for k, v in h.items()}


# 1. Admitted: the API key's tenant, with a quota reservation in Redis (through Webdis).
st, h, body = chat({"authorization": "Bearer sk-smoke-a"})
h = lower(h)
check("admitted (200, estimate and quota headers)",
      st == 200 and "x-tokengate-estimated-tokens" in h and "x-tokengate-quota-remaining" in h,
      f"{st} {h} {body[:200]}")

# 2. Rate-limited: tenant demo-small (burst 2000) from a JWT; the 2nd 1500-token request gets 429.
t_small = token("demo-small")
codes = [chat({"x-tokengate-jwt": t_small}, max_tokens=1500) for _ in range(2)]
check("rate-limited (demo-small: 200 then 429)",
      [c[0] for c in codes] == [200, 429], f"{[(c[0], c[2][:160]) for c in codes]}")

# 3. Global bucket in Redis: tenant demo-global.
t_global = token("demo-global")
codes = [chat({"x-tokengate-jwt": t_global}, max_tokens=1500) for _ in range(2)]
check("global bucket (demo-global: 200 then 429)",
      [c[0] for c in codes] == [200, 429], f"{[(c[0], c[2][:160]) for c in codes]}")

# 4. Monthly quota: tenant demo-quota (2000 a month): 200, then 429 insufficient_quota.
t_quota = token("demo-quota")
codes = [chat({"x-tokengate-jwt": t_quota}, max_tokens=1500) for _ in range(2)]
check("monthly quota (demo-quota: 200 then 429 insufficient_quota, reason monthly_quota_exceeded)",
      [c[0] for c in codes] == [200, 429]
      and error(codes[1][2]) == ("insufficient_quota", "insufficient_quota", "monthly_quota_exceeded"),
      f"{[(c[0], c[2][:160]) for c in codes]}")

# 5. Identity: a client naming the exhausted tenant in x-tenant-id is not charged to it (header removed);
#    a token with a bad signature is refused by jwt_authn.
st, _, body = chat({"authorization": "Bearer sk-smoke-b", "x-tenant-id": "demo-quota"}, max_tokens=1500)
check("client-sent x-tenant-id ignored (200 on the key's tenant)", st == 200, f"{st} {body[:200]}")
bad = t_quota[:-2] + ("AA" if not t_quota.endswith("AA") else "BB")
st, _, body = chat({"x-tokengate-jwt": bad})
check("bad token signature (401 from jwt_authn)", st == 401 and body.startswith("Jwt"), f"{st} {body[:200]}")

# 6. Circuit breaker: the shipped breaker opens at 50 % failures of at least 20 requests in 30 s, so 20
#    upstream 500s open the breakers of model claude-sonnet-4.5 and cluster provider.
fails = [chat({"authorization": "Bearer sk-smoke-c", "x-mock-status": "500"}, model="claude-sonnet-4.5")[0]
         for _ in range(20)]
st, h, body = chat({"authorization": "Bearer sk-smoke-c"}, model="claude-sonnet-4.5")
check("breaker open (503 circuit_open after 20 failures)",
      fails == [500] * 20 and st == 503 and error(body)[1] == "circuit_open", f"{fails} {st} {body[:200]}")
st, h, body = chat({"authorization": "Bearer sk-smoke-c"})
h = lower(h)
check("cluster fallback (gpt-4.1 served by mock2:8082)",
      st == 200 and h.get("x-mock-port") == "8082", f"{st} {h} {body[:200]}")

# 7. Metrics on the admin port.
with urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/stats/prometheus", timeout=15) as r:
    prom = r.read().decode()
admitted = [ln for ln in prom.splitlines() if ln.startswith("tokengate_requests_admitted")]
check("metrics (tokengate_requests_admitted >= 5)",
      bool(admitted) and float(admitted[0].rsplit(" ", 1)[1]) >= 5, f"{admitted}")

passed = sum(results)
print(f"compose-smoke: {passed} passed, {len(results) - passed} failed")
sys.exit(0 if passed == len(results) else 1)
