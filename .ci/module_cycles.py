#!/usr/bin/env python3
"""Fails when two modules of one crate depend on each other, directly or
round a loop (DESIGN.md: dependencies run one way).

A module is a file (`a/mod.rs` and `a.rs` are module `a`; inline modules such
as `mod tests { .. }` belong to their file). An edge A -> B is a path in A's
code that names B: `crate::..`, `super::..`, `self::..`, or a child module by
its bare name. `mod x;` declarations are not edges, and the crate root (the
module map) has no outgoing edges; a `pub use` in a module is an edge of that
module, and a path through a re-export is an edge to where the item lives.
Test code (`#[cfg(test)]` modules, inline or in files of their own) is left
out: a test may use whatever it tests.

Usage: module_cycles.py CRATE_SRC_DIR...   (prints the module graph's cycles)
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """Blanks out comments, string and char literals, keeping line breaks."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if text[i] == "\n" else "")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            i = text.index("'", i + 2) + 1
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_blocks(code):
    """Removes `#[cfg(test)] mod x { .. }` blocks (braces matched)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", code)
        if not m:
            return code
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        code = code[:m.start()] + code[i:]


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                prefix, inner = tree[:i], tree[i + 1:tree.rindex("}")]
                parts, d, start = [], 0, 0
                for j, cj in enumerate(inner):
                    if cj == "{":
                        d += 1
                    elif cj == "}":
                        d -= 1
                    elif cj == "," and d == 0:
                        parts.append(inner[start:j])
                        start = j + 1
                parts.append(inner[start:])
                out = []
                for p in parts:
                    if p:
                        out += [prefix + q if q != "self" else prefix.rstrip(":") for q in expand_use(p)]
                return out
            depth += 1
    return [re.sub(r"\bas" + IDENT + "$", "", tree).split(" as ")[0]]


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path tuple -> file
        for root, _, names in os.walk(src):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(root, name), src)
                parts = rel[:-3].split(os.sep)
                if parts == ["main"] and os.path.exists(os.path.join(src, "lib.rs")):
                    continue  # beside a library, the binary is a crate of its own
                if parts[-1] == "mod" or parts in (["lib"], ["main"]):
                    parts = parts[:-1]
                self.files[tuple(parts)] = os.path.join(root, name)
        self.code = {m: strip_comments_and_strings(open(f).read()) for m, f in self.files.items()}
        for m in list(self.code):
            for child in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", self.code.get(m, "")):
                self.files.pop(m + (child,), None)
                self.code.pop(m + (child,), None)
        self.code = {m: drop_test_blocks(c) for m, c in self.code.items() if m in self.files}
        self.reexports = {m: self.pub_uses(m) for m in self.files}

    def pub_uses(self, mod):
        """name -> absolute path of each `pub use` of a module."""
        out = {}
        for m in re.finditer(r"\bpub(\([^)]*\))?\s+use\s+([^;]+);", self.code[mod]):
            for p in expand_use(m.group(2)):
                path = self.absolute(mod, p.split("::"))
                if path:
                    out[path[-1]] = path
        return out

    def absolute(self, mod, segs):
        """Absolute module path of `segs` as written in `mod`, or None."""
        if segs[0] == "crate":
            return segs[1:]
        if segs[0] == "self":
            return list(mod) + segs[1:]
        if segs[0] == "super":
            base = list(mod)
            while segs and segs[0] == "super":
                base, segs = base[:-1], segs[1:]
            return base + segs
        if tuple(mod) + (segs[0],) in self.files:
            return list(mod) + segs  # a child module by its bare name
        return None

    def target(self, segs, hops=0):
        """The file module that an absolute path names."""
        for k in range(len(segs), -1, -1):
            mod = tuple(segs[:k])
            if mod in self.files:
                rest = segs[k:]
                if rest and hops < 4 and rest[0] in self.reexports[mod]:
                    return self.target(self.reexports[mod][rest[0]] + rest[1:], hops + 1)
                return mod
        return ()

    def edges(self, mod):
        code = self.code[mod]
        if mod == ():
            return set()
        # Inline modules (`mod tests { .. }`) sit inside the file: their
        # `super` is the file's own module.
        code = re.sub(r"\bmod\s+" + IDENT + r"\s*;", "", code)
        inline = re.search(r"\bmod\s+" + IDENT + r"\s*\{", code)
        if inline:
            code = code[:inline.end()] + re.sub(r"\bsuper::", "self::", code[inline.end():])
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            paths += expand_use(m.group(1))
        code_wo_use = re.sub(r"\buse\s+[^;]+;", "", code)
        paths += re.findall(r"(?<![A-Za-z0-9_:])((?:crate|super|self|" + IDENT + r")(?:::" + IDENT + ")+)", code_wo_use)
        out = set()
        for p in paths:
            segs = [s for s in p.split("::") if s and s != "*"]
            path = self.absolute(mod, segs) if segs else None
            if path is None:
                continue
            t = self.target(path)
            if t != mod and t != ():
                out.add(t)
        return out


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def name(mod):
    return "::".join(mod) or "crate"


def main(dirs):
    bad = 0
    for d in dirs:
        crate = Crate(d)
        graph = {m: crate.edges(m) for m in crate.files}
        found = cycles(graph)
        edges = sum(len(e) for e in graph.values())
        print(f"{d}: {len(graph)} modules, {edges} edges, {len(found)} cycles")
        for comp in found:
            bad += 1
            members = set(comp)
            print("  cycle: " + ", ".join(name(m) for m in comp))
            for m in comp:
                for t in sorted(graph[m] & members):
                    print(f"    {name(m)} -> {name(t)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["src", "raft/src", "store/src"]))
