#!/usr/bin/env python3
"""Generates wire/src/content/schema.rs: XDR skippers for the parts of a LedgerCloseMeta that
the content check walks over, from the schema that stellar-xdr itself is generated from.

Usage: python3 wire/gen/skipper.py [PATH/TO/xdr.json] > wire/src/content/schema.rs

The schema is `xdr-definitions-json/xdr.json` in the published `stellar-xdr` crate (the same
version as the workspace's dev-dependency); without an argument it is looked up in the cargo
registry. Each generated function walks one XDR type over the input, checking every union
discriminant, enum value, bool, length bound and padding exactly as a decoder would, without
building any value. Recursive types (SCVal, ClaimPredicate, ...) carry a depth bound.
"""

import glob
import hashlib
import json
import os
import re
import sys

ROOTS = [
    "TransactionSet",
    "GeneralizedTransactionSet",
    "TransactionResultPair",
    "LedgerEntryChanges",
    "TransactionMeta",
    "UpgradeEntryMeta",
    "SCPHistoryEntry",
    "LedgerKey",
    "LedgerEntry",
    "ExtensionPoint",
    "LedgerHeaderHistoryEntryExt",
]

U32_MAX = 0xFFFFFFFF


def find_schema():
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    found = sorted(glob.glob(f"{home}/registry/src/*/stellar-xdr-*/xdr-definitions-json/xdr.json"))
    if not found:
        sys.exit("no stellar-xdr crate in the cargo registry: build the wire tests first, or pass the path")
    return found[-1]


path = sys.argv[1] if len(sys.argv) > 1 else find_schema()
raw = open(path, "rb").read()
schema = json.loads(raw)
defs = {d["name"]: d for d in schema["definitions"] if d["kind"] != "const"}
crate = os.path.basename(os.path.dirname(os.path.dirname(path)))


def snake(name):
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


def refs(t):
    """Names a type expression refers to."""
    k = t["kind"]
    if k == "ref":
        return [t["name"]]
    if "element" in t:
        return refs(t["element"])
    return []


def def_refs(d):
    out = []
    if d["kind"] == "struct":
        for f in d["fields"]:
            out += refs(f["type"])
    elif d["kind"] == "union":
        out += refs(d["discriminant"]["type"])
        for a in d["arms"]:
            if a.get("type"):
                out += refs(a["type"])
    elif d["kind"] == "typedef":
        out += refs(d["type"])
    return out


# Reachable definitions from the roots.
reach = []
seen = set()
stack = list(ROOTS)
while stack:
    n = stack.pop()
    if n in seen:
        continue
    seen.add(n)
    reach.append(n)
    stack += def_refs(defs[n])

# Strongly connected components (Tarjan): types on a cycle get a depth bound.
index, low, onstack, st, cyclic = {}, {}, set(), [], set()
counter = [0]


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    st.append(v)
    onstack.add(v)
    for w in def_refs(defs[v]):
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in onstack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = st.pop()
            onstack.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1 or v in def_refs(defs[v]):
            cyclic.update(comp)


sys.setrecursionlimit(10000)
for n in sorted(reach):
    if n not in index:
        strong(n)


def plain(t):
    """Byte size of a type expression that needs no check at all (fixed size, no
    discriminant, enum, bool or padding inside), else None."""
    k = t["kind"]
    if k in ("int", "unsigned_int"):
        return 4
    if k in ("hyper", "unsigned_hyper"):
        return 8
    if k == "opaque_fixed":
        return t["size"] if t["size"] % 4 == 0 else None
    if k == "array":
        p = plain(t["element"])
        return None if p is None else p * t["count"]
    if k == "ref":
        return plain_def(t["name"])
    return None


plain_memo = {}


def plain_def(name):
    if name in plain_memo:
        return plain_memo[name]
    plain_memo[name] = None  # a cycle is never plain
    d = defs[name]
    r = None
    if d["kind"] == "typedef":
        r = plain(d["type"])
    elif d["kind"] == "struct":
        sizes = [plain(f["type"]) for f in d["fields"]]
        r = None if None in sizes else sum(sizes)
    plain_memo[name] = r
    return r


def min_size(t, guard=()):
    k = t["kind"]
    if k in ("int", "unsigned_int", "bool", "opaque_var", "string", "var_array", "optional"):
        return 4
    if k in ("hyper", "unsigned_hyper"):
        return 8
    if k == "opaque_fixed":
        return (t["size"] + 3) // 4 * 4
    if k == "array":
        return t["count"] * min_size(t["element"], guard)
    if k == "ref":
        n = t["name"]
        if n in guard:
            return 4
        d = defs[n]
        g = guard + (n,)
        if d["kind"] == "typedef":
            return min_size(d["type"], g)
        if d["kind"] == "enum":
            return 4
        if d["kind"] == "struct":
            return sum(min_size(f["type"], g) for f in d["fields"])
        if d["kind"] == "union":
            return 4 + min(min_size(a["type"], g) if a.get("type") else 0 for a in d["arms"])
    raise ValueError(t)


def enum_values(name):
    return sorted(m["value"] for m in defs[name]["members"])


def pattern(values):
    """A Rust match pattern for a set of i32 values, ranges where they run."""
    values = sorted(set(values))
    parts = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{values[i]}..={values[j]}")
        else:
            parts += [str(v) for v in values[i : j + 1]]
        i = j + 1
    return " | ".join(parts)


def bound(t, key):
    m = t.get(key)
    return "u32::MAX" if m is None else str(m)


class Emitter:
    def __init__(self):
        self.lines = []
        self.pending = 0  # coalesced plain bytes not yet skipped
        self.pending_ty = None

    def flush(self, ind):
        if self.pending:
            self.lines.append(f'{ind}w.skip({self.pending}, "{self.pending_ty}")?;')
            self.pending = 0

    def line(self, ind, s):
        self.flush(ind)
        self.lines.append(ind + s)

    def expr(self, t, ty, ind):
        """Code that walks type expression t; ty names the enclosing XDR type for errors."""
        p = plain(t)
        if p is not None:
            if not self.pending:
                self.pending_ty = ty
            self.pending += p
            return
        k = t["kind"]
        if k == "ref":
            d = defs[t["name"]]
            if d["kind"] == "typedef":
                return self.expr(d["type"], t["name"], ind)
            if d["kind"] == "enum":
                return self.line(ind, f"w.enumeration({t['name']!r}, |v| matches!(v, {pattern(enum_values(t['name']))}))?;".replace("'", '"'))
            return self.line(ind, f"{snake(t['name'])}(w, d)?;")
        if k == "bool":
            return self.line(ind, f'w.boolean("{ty}")?;')
        if k in ("opaque_var", "string"):
            return self.line(ind, f'w.opaque({bound(t, "max_size")}, "{ty}")?;')
        if k == "opaque_fixed":
            # Stellar's fixed opaques are all multiples of 4 (hashes, keys, asset codes); one
            # that is not needs a padding check the walker does not have yet.
            raise ValueError(f"{ty}: opaque[{t['size']}] needs padding")
        if k == "optional":
            self.line(ind, f'if w.present("{ty}")? {{')
            self.expr(t["element"], ty, ind + "    ")
            self.flush(ind + "    ")
            return self.lines.append(ind + "}")
        if k == "var_array":
            e = t["element"]
            ep = plain(e)
            if ep is not None:
                return self.line(ind, f'w.plain_array({bound(t, "max_count")}, {ep}, "{ty}")?;')
            m = min_size(e)
            assert m >= 4, (ty, m)
            self.line(ind, f'for _ in 0..w.count({bound(t, "max_count")}, {m}, "{ty}")? {{')
            self.expr(e, ty, ind + "    ")
            self.flush(ind + "    ")
            return self.lines.append(ind + "}")
        if k == "array":
            self.line(ind, f"for _ in 0..{t['count']} {{")
            self.expr(t["element"], ty, ind + "    ")
            self.flush(ind + "    ")
            return self.lines.append(ind + "}")
        raise ValueError((ty, t))


def function(name):
    d = defs[name]
    e = Emitter()
    ind = "    "
    if name in cyclic:
        e.line(ind, f'let d = w.deeper(d, "{name}")?;')
    if d["kind"] == "struct":
        for f in d["fields"]:
            e.expr(f["type"], name, ind)
    elif d["kind"] == "typedef":
        e.expr(d["type"], name, ind)
    elif d["kind"] == "union":
        disc = d["discriminant"]["type"]
        assert disc["kind"] in ("int", "unsigned_int", "ref"), (name, disc)
        e.line(ind, f'match w.tag("{name}")? {{')
        for a in d["arms"]:
            vals = [c["value"] for c in a["cases"]]
            assert all(-(2**31) <= v < 2**31 for v in vals)
            e.line(ind + "    ", f"{pattern(vals)} => {{")
            if a.get("type"):
                e.expr(a["type"], name, ind + "        ")
            e.flush(ind + "        ")
            e.lines.append(ind + "    }")
        e.lines.append(ind + f'    tag => return Err(w.unknown_tag("{name}", tag)),')
        e.lines.append(ind + "}")
    elif d["kind"] == "enum":
        e.expr({"kind": "ref", "name": name}, name, ind)
    else:
        raise ValueError(name)
    e.flush(ind)
    vis = "pub(super) " if name in ROOTS else ""
    # Unused when the type's value is never looked at, only skipped: keeps the signature uniform.
    body = "\n".join(e.lines)
    uses_d = re.search(r"\(w, d\)|deeper\(d", body) is not None
    dparam = "d" if uses_d else "_d"
    head = f"/// `{name}`.\n#[inline(never)]\n" if name in cyclic else f"/// `{name}`.\n"
    return f"{head}{vis}fn {snake(name)}(w: &mut Walker<'_>, {dparam}: u32) -> Step {{\n{body}\n    Ok(())\n}}\n"


# A function for every reachable struct, union and enum, and for typedef roots; typedefs and
# plain types are inlined where they are used.
needed = []
for n in sorted(reach):
    d = defs[n]
    if n in ROOTS or (d["kind"] in ("struct", "union") and plain_def(n) is None):
        needed.append(n)

out = [
    "// @generated by wire/gen/skipper.py from",
    f"// {crate}/xdr-definitions-json/xdr.json (sha256 {hashlib.sha256(raw).hexdigest()}).",
    "// Do not edit: change the generator and run it again (see its docstring).",
    "",
    "//! XDR skippers generated from stellar-xdr's schema: each function walks one type over the",
    "//! input and checks what a decoder checks (discriminants, enum values, bools, length bounds,",
    "//! padding), building nothing. Recursive types carry a depth bound.",
    "",
    "#![allow(clippy::match_single_binding, clippy::manual_range_patterns, clippy::needless_return)]",
    "",
    "use super::walk::{Step, Walker};",
    "",
]
for n in needed:
    out.append(function(n))
out.append(f"// {len(needed)} functions; recursive: {', '.join(sorted(cyclic & set(reach)))}.")
text = "\n".join(out) + "\n"
# Formatted as `cargo fmt` would, so the file stays byte-identical to a fresh run.
import subprocess
try:
    text = subprocess.run(["rustfmt", "--edition", "2021", "--emit", "stdout"], input=text,
                          capture_output=True, text=True, check=True).stdout
except (OSError, subprocess.CalledProcessError) as e:
    sys.exit(f"rustfmt failed: {e}")
sys.stdout.write(text)
