#!/usr/bin/env python3
"""How tokengate writes a tenant id, model name or budget account into a Redis key (src/keys.rs,
`sanitize`): every byte outside [A-Za-z0-9._:-] as %XX (upper-case hex); over 128 bytes, the first
whole bytes up to 111 then `~` and the FNV-1a-64 of the raw value in 16 hex digits; empty as `~`.

    python3 scripts/key-part.py 'alice@example.com'          # alice%40example.com
    redis-cli -p 6380 SET "tg:q:{$(python3 scripts/key-part.py 'alice@example.com')}:limit" 100000
"""
import sys

MAX = 128


def encode(raw: bytes, limit: int) -> str:
    out = ""
    for b in raw:
        safe = chr(b).isascii() and (chr(b).isalnum() or chr(b) in "._:-")
        piece = chr(b) if safe else "%%%02X" % b
        if len(out) + len(piece) > limit:
            break
        out += piece
    return out


def fnv1a(raw: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in raw:
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h


def key_part(value: str) -> str:
    raw = value.encode("utf-8")
    if not raw:
        return "~"
    full = encode(raw, 1 << 30)
    if len(full) <= MAX:
        return full
    return encode(raw, MAX - 17) + "~" + "%016x" % fnv1a(raw)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: key-part.py <tenant id | model | budget account>")
    print(key_part(sys.argv[1]))
