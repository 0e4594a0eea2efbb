#!/usr/bin/env bash
# Instructions per KB of `estimate` per corpus class, natively under callgrind (deterministic): builds
# examples/estimate-instr.rs (release) and prints `class | KB each | instructions/KB`.
# Usage: scripts/estimate-instr.sh [binary]   (a binary built before, to compare two versions)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
	cargo build -q --release --example estimate-instr -p tokengate
	bin=target/release/examples/estimate-instr
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --collect-atstart=no --toggle-collect='estimate_instr::measure' \
	--dump-after='estimate_instr::measure' --callgrind-out-file="$out/cg.%p" "$bin" >"$out/sets" 2>/dev/null
# One dump per measured call, numbered in call order: cg.<pid>.1, .2, …
i=0
echo "| class | KB each | instructions/KB |"
echo "|---|---:|---:|"
while read -r name kb bytes; do
	i=$((i + 1))
	ir=$(grep -h '^summary:' "$out"/cg.*."$i" | awk '{print $2}')
	awk -v n="$name" -v kb="$kb" -v ir="$ir" -v b="$bytes" 'BEGIN { printf "| %s | %s | %.0f |\n", n, kb, ir / (b / 1024) }'
done <"$out/sets"
