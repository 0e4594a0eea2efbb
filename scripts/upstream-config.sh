#!/usr/bin/env bash
# Writes an Envoy bootstrap for a real provider: envoy/envoy.yaml (or $1) with cluster `provider` pointed at
# $UPSTREAM_URL, written to $2. Used by scripts/run.sh (`UPSTREAM_URL=... make run`); tested by
# wasm-test/tests/validate_configs.rs.
#
#   UPSTREAM_URL      scheme://host[:port][/base-path], required. host: a DNS name, an IPv4 address or an IPv6
#                     literal in brackets (http://[::1]:8000). A base path ending in /v1 is the same as one
#                     without: clients already send /v1/... (http://localhost:11434/v1 == http://localhost:11434).
#                     Any other base path is prefixed to every request path (https://host/openai ->
#                     /openai/v1/chat/completions).
#   UPSTREAM_API_KEY  optional: when set, Envoy sends `authorization: Bearer <key>` to the provider (replacing
#                     the client's); unset, the client's headers go through unchanged (a local vLLM or Ollama
#                     needs no key).
#   UPSTREAM_CA       CA bundle for https (default /etc/ssl/certs/ca-certificates.crt).
#
# Prints one line describing the provider. The output file holds the key: it is written with mode 600.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { printf 'upstream-config: %s\n' "$*" >&2; exit 1; }

in=${1:-envoy/envoy.yaml}
out=${2:?usage: scripts/upstream-config.sh <in envoy.yaml> <out envoy.yaml>}
url=${UPSTREAM_URL:?UPSTREAM_URL is not set}

# scheme://host[:port][/path]; host is [v6], dotted v4 or a DNS name.
re='^(https?)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:([0-9]{1,5}))?(/[A-Za-z0-9._~/%-]*)?$'
[[ "$url" =~ $re ]] ||
    die "UPSTREAM_URL must look like http(s)://host[:port][/path] (IPv6 in brackets), got: $url"
scheme=${BASH_REMATCH[1]}
host=${BASH_REMATCH[2]}
port=${BASH_REMATCH[4]}
base=${BASH_REMATCH[5]}
# Trailing slashes, then one trailing /v1 (clients send /v1/...), then trailing slashes again.
while [[ "$base" == */ ]]; do base=${base%/}; done
if [[ "$base" == */v1 || "$base" == /v1 ]]; then base=${base%/v1}; fi
while [[ "$base" == */ ]]; do base=${base%/}; done
if [ -z "$port" ]; then
    if [ "$scheme" = https ]; then port=443; else port=80; fi
fi
[ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "UPSTREAM_URL port out of range: $port"

ip_kind=""
if [[ "$host" == \[*\] ]]; then
    address=${host#[}; address=${address%]}
    ip_kind=v6
    authority="$host"
elif [[ "$host" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    address=$host
    ip_kind=v4
    authority=$host
else
    address=$host
    authority=$host
fi
# The Host header the provider expects: the port only when it is not the scheme's default.
if { [ "$scheme" = https ] && [ "$port" != 443 ]; } || { [ "$scheme" = http ] && [ "$port" != 80 ]; }; then
    authority="$authority:$port"
fi

ca=${UPSTREAM_CA:-/etc/ssl/certs/ca-certificates.crt}
[ "$scheme" = http ] || [ -f "$ca" ] || die "CA bundle $ca not found (install ca-certificates or set UPSTREAM_CA)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
umask 077

# Cluster type: an IP literal needs no DNS.
if [ -n "$ip_kind" ]; then echo "    type: STATIC" > "$tmp/type"; else echo "    type: STRICT_DNS" > "$tmp/type"; fi

{
    if [ -z "$ip_kind" ]; then printf '    dns_lookup_family: V4_PREFERRED\n'; fi
    if [ "$scheme" = https ]; then
        cat <<EOT
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
EOT
        if [ -z "$ip_kind" ]; then printf '        sni: %s\n' "$host"; fi
        cat <<EOT
        common_tls_context:
          validation_context:
            trusted_ca: { filename: $ca }
            match_typed_subject_alt_names:
            - san_type: $([ -n "$ip_kind" ] && echo IP_ADDRESS || echo DNS)
              matcher: { exact: "$address" }
EOT
    fi
} > "$tmp/tls"

: > "$tmp/headers"
if [ -n "${UPSTREAM_API_KEY:-}" ]; then
    # The key goes into a YAML double-quoted string.
    key_escaped=$(printf '%s' "$UPSTREAM_API_KEY" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')
    cat > "$tmp/headers" <<EOT
                request_headers_to_add:
                - header: { key: authorization, value: "Bearer $key_escaped" }
                  append_action: OVERWRITE_IF_EXISTS_OR_ADD
EOT
fi
{
    printf '                  host_rewrite_literal: "%s"\n' "$authority"
    if [ -n "$base" ]; then printf '                  prefix_rewrite: "%s/"\n' "$base"; fi
} > "$tmp/route"

for marker in provider-type provider-address provider-tls provider-route-headers provider-route-extra; do
    grep -q "# tokengate:$marker\$" "$in" || die "$in has no '# tokengate:$marker' line"
done
sed -e "/# tokengate:provider-type\$/{r $tmp/type
d}" \
    -e "s|socket_address: { address: [^,]*, port_value: [0-9]* }  # tokengate:provider-address|socket_address: { address: \"$address\", port_value: $port }|" \
    -e "/# tokengate:provider-tls\$/r $tmp/tls" \
    -e "/# tokengate:provider-route-headers\$/r $tmp/headers" \
    -e "/# tokengate:provider-route-extra\$/r $tmp/route" \
    "$in" > "$out"
grep -q "address: \"$address\", port_value: $port }" "$out" || die "could not rewrite the provider address in $out"

printf 'provider %s://%s:%s (path prefix %s, TLS %s, authorization %s)\n' "$scheme" "$host" "$port" \
    "${base:-none}" "$([ "$scheme" = https ] && echo "yes" || echo no)" \
    "$([ -n "${UPSTREAM_API_KEY:-}" ] && echo "added by Envoy" || echo "from the client")"
