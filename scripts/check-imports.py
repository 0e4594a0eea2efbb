#!/usr/bin/env python3
"""Fails when files of the crate import each other in a circle.

Every `crate::…`, `super::…` and `self::…` path in a file's code (comments and string literals
left out) is resolved to the file of the longest module prefix it names: an edge from the file to
that one. A `mod x;` declaration is not an import (a parent names its children); a `pub use x::Y`
in a `mod.rs` is. Any strongly connected set of two or more files is a circle, printed with its
edges, and the script exits 1.

    scripts/check-imports.py [SRC_DIR]      (default: src)
"""
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "src"


def module_of(path):
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


def strip(code):
    """The code without comments and string/char literals (so docs and messages add no edges)."""
    out, i, n = [], 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "r" and re.match(r'r#*"', code[i:i + 10]) and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
            m = re.match(r'r(#*)"', code[i:])
            end = code.find('"' + m.group(1), i + len(m.group(0)))
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and code[j] != '"':
                j += 2 if code[j] == "\\" else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", code[i:i + 4]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", code[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main():
    files = {}
    for root, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                p = os.path.join(root, name)
                files[module_of(p)] = p
    edges = {m: set() for m in files}

    def resolve(path):
        for k in range(len(path), -1, -1):
            if path[:k] in files:
                return path[:k]
        return None

    for mod, p in files.items():
        code = strip(open(p, encoding="utf-8").read())
        # `use a::{b::{c, d}, e}` groups expand to every path they name.
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            spec = re.sub(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*", "", m.group(1))
            paths.extend(expand(re.sub(r"\s+", "", spec)))
        for m in re.finditer(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", code):
            paths.append(m.group(1))
        for raw in paths:
            parts = [x for x in raw.split("::") if x]
            if not parts or parts[0] not in ("crate", "super", "self"):
                continue
            base = list(mod)
            if parts[0] == "crate":
                target, rest = [], parts[1:]
            else:
                # `super` of a file `a/b.rs` (module a::b) is `a`; of `a/mod.rs` (module a) is the root.
                target = base
                rest = parts
                while rest and rest[0] in ("super", "self"):
                    if rest[0] == "super":
                        target = target[:-1]
                    rest = rest[1:]
            t = resolve(tuple(target) + tuple(x for x in rest if x not in ("self", "*")))
            if t is not None and t != mod:
                edges[mod].add(t)
    cycles = sccs(edges)
    bad = [c for c in cycles if len(c) > 1]
    for c in bad:
        names = sorted(files[m] for m in c)
        print("import circle between " + ", ".join(names) + ":")
        for m in sorted(c):
            for t in sorted(edges[m]):
                if t in c:
                    print(f"  {files[m]} -> {files[t]}")
    if bad:
        sys.exit(1)
    print(f"check-imports: {len(files)} files, no import circle")


def expand(spec):
    """`a::{b, c::{d, e}}` -> [`a::b`, `a::c::d`, `a::c::e`]."""
    if "{" not in spec:
        return [spec]
    i = spec.index("{")
    prefix, inner = spec[:i], spec[i + 1:spec.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        if part:
            out.extend(expand(prefix + part))
    return out


def sccs(edges):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in edges:
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    main()
