#!/usr/bin/env python3
"""Mints an HS256 JWT for the jwt_authn example of the shipped Envoy configs (DEMO KEY: see envoy/envoy.yaml).

    scripts/demo-token.py TENANT [GROUP] [--config envoy/envoy.yaml] [--ttl SECONDS]

Prints the token. Send it as `x-tokengate-jwt: <token>`: Envoy's jwt_authn verifies it and writes its payload
to the dynamic metadata, where tokengate reads the `tenant` claim (the tenant it charges; `tenant_claim`) and,
when the plugin configuration has a `groups` level reading it, the `group` claim. No header is set or stripped. `make run` and
`make compose-test` use it for the demo tenants. Only the Python standard library.
"""
import argparse
import base64
import hashlib
import hmac
import json
import re
import sys
import time


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def demo_key(config: str) -> bytes:
    with open(config, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*inline_string:\s*'(\{.*\"kty\":\"oct\".*\})'\s*$", line)
            if m:
                jwk = json.loads(m.group(1))["keys"][0]
                k = jwk["k"]
                return base64.urlsafe_b64decode(k + "=" * (-len(k) % 4))
    sys.exit(f"demo-token: no HS256 local_jwks (inline_string with an oct key) in {config}")


def main() -> None:
    p = argparse.ArgumentParser(description="Mint a demo JWT for tokengate's jwt_authn example.")
    p.add_argument("tenant")
    p.add_argument("group", nargs="?")
    p.add_argument("--config", default="envoy/envoy.yaml")
    p.add_argument("--ttl", type=int, default=7 * 86400, help="seconds until exp (default 7 days)")
    a = p.parse_args()
    claims = {"iss": "tokengate-demo", "aud": "tokengate", "sub": a.tenant, "tenant": a.tenant,
              "exp": int(time.time()) + a.ttl}
    if a.group:
        claims["group"] = a.group
    header = {"alg": "HS256", "typ": "JWT", "kid": "tokengate-demo"}
    signing = b64url(json.dumps(header, separators=(",", ":")).encode()) + "." + \
        b64url(json.dumps(claims, separators=(",", ":")).encode())
    sig = hmac.new(demo_key(a.config), signing.encode(), hashlib.sha256).digest()
    print(signing + "." + b64url(sig))


if __name__ == "__main__":
    main()
