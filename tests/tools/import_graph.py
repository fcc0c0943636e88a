#!/usr/bin/env python3
"""The module import graph of a Rust crate, from its `use` lines.

    python3 tests/tools/import_graph.py [SRC_DIR] [--depth N] [--cycles]

SRC_DIR defaults to host/src. Each file is a module (`a/b.rs` and
`a/b/mod.rs` are `a::b`); `--depth N` (default 1) folds modules to their
first N path segments, so `--depth 1` shows how the top-level modules
(`store`, `relay`, `plugin`, ...) depend on each other. An edge A -> B means
a file of A names `crate::B...` (or reaches B through `super::`) in a `use`
line or a path. `--cycles` prints only the strongly connected components
with more than one member: the import cycles at that depth.

It reads text, not the compiler's view: a `use` inside a macro or a fully
qualified path in an expression is counted, a glob re-export is not
followed. Good enough to see the shape and its cycles.
"""

import os
import re
import sys
from collections import defaultdict


def module_of(path, root):
    rel = os.path.relpath(path, root)[: -len(".rs")]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def targets(text, here):
    """The module paths a file names, resolved against its own path."""
    out = set()
    for m in PATH.finditer(text):
        head, rest = m.group(1), [p for p in m.group(2).split("::") if p]
        if head == "crate":
            base = []
        else:
            base = here[:-1]
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
        # `super::super::x` arrives as head=super, rest=[super, x]
        out.add(tuple(base + rest))
    return out


def main(argv):
    root, depth, cycles_only = "host/src", 1, False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--depth":
            depth = int(args.pop(0))
        elif a == "--cycles":
            cycles_only = True
        else:
            root = a
    files = []
    for d, _, names in os.walk(root):
        files += [os.path.join(d, n) for n in names if n.endswith(".rs")]
    modules = {tuple(module_of(f, root)) for f in files}
    known = {m[:depth] for m in modules if m}
    edges = defaultdict(set)
    for f in sorted(files):
        here = module_of(f, root)
        if not here:
            continue
        src = tuple(here[:depth])
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        # Leave `#[cfg(test)] mod tests { ... }` out: tests may import freely.
        cut = text.find("#[cfg(test)]")
        if cut >= 0:
            text = text[:cut]
        for t in targets(text, here):
            # The longest known module prefix of the named path.
            dst = None
            for n in range(min(depth, len(t)), 0, -1):
                if t[:n] in known:
                    dst = t[:n]
                    break
            if dst and dst != src:
                edges[src].add(dst)
    names = sorted(known)
    if not cycles_only:
        for a in names:
            for b in sorted(edges.get(a, ())):
                print(f"{'::'.join(a)} -> {'::'.join(b)}")
    # Tarjan's strongly connected components.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
            comps.append(comp)

    sys.setrecursionlimit(10000)
    for v in names:
        if v not in index:
            visit(v)
    cyclic = [sorted(c) for c in comps if len(c) > 1]
    print(f"# {len(names)} modules, {sum(len(e) for e in edges.values())} edges, "
          f"{len(cyclic)} cycles at depth {depth}")
    for c in sorted(cyclic):
        print("cycle: " + " <-> ".join("::".join(m) for m in c))


if __name__ == "__main__":
    main(sys.argv[1:])
