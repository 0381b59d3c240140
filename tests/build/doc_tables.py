"""The docs' tables held to their sources (part of ctest docs.snippets, called
by doc_snippets.py check):

  - docs/options.md has a row per public setter of Options and of the option
    structs it holds (options.h, format.h: TORCH_ARGs and members returning
    the struct), no row without its setter, the header's default in its
    default column, and a key the library reads (a string in sdk/src);
  - CHANGELOG.md names every [[deprecated]] name of the public headers;
  - docs/health.md's defaults column equals the doctor's PARAMETERS;
  - bench/README.md is at most 400 lines;
  - `tensortap --help` describes each of its commands.

Each check appends its messages to `errors`.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

OPTION_STRUCTS = ("Options", "Hdf5Options", "PackedOptions", "TensorBoardOptions")
OPTION_HEADERS = ("sdk/include/tensortap/options.h", "writers/include/tensortap/format.h")
PUBLIC_HEADER_DIRS = ("sdk/include", "hooks/include", "writers/include")
BENCH_README_LINES = 400


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def struct_bodies(text: str) -> Dict[str, str]:
    """The body of each `struct Name {` (attributes allowed between)."""
    out: Dict[str, str] = {}
    for m in re.finditer(r"\bstruct\s+(?:\[\[[^\]]*\]\]\s*)?(\w+)\s*\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out[m.group(1)] = text[m.end() : i - 1]
    return out


def split_args(params: str) -> List[str]:
    parts, depth, cur = [], 0, ""
    for c in params:
        if c in "(<{[":
            depth += 1
        elif c in ")>}]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        parts.append(cur.strip())
    return parts


class Setter:
    def __init__(self, owner: str, name: str, arity: int, default: Optional[str]):
        self.owner, self.name, self.arity, self.default = owner, name, arity, default

    @property
    def key(self) -> Tuple[str, str, int]:
        return (self.owner, self.name, self.arity)


def header_setters(root: Path) -> List[Setter]:
    """The public, non-deprecated setters of the option structs."""
    out: List[Setter] = []
    for rel in OPTION_HEADERS:
        bodies = struct_bodies(strip_comments((root / rel).read_text(encoding="utf-8")))
        for owner in OPTION_STRUCTS:
            body = bodies.get(owner)
            if body is None:
                continue
            for m in re.finditer(r"TORCH_ARG\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*(?:=\s*([^;]+))?;", body):
                out.append(Setter(owner, m.group(2), 1, m.group(3).strip() if m.group(3) else None))
            for m in re.finditer(r"((?:\[\[deprecated[^\]]*\]\]\s*)?)" + owner + r"&\s+(\w+)\s*\(([^)]*)\)", body):
                if m.group(1):
                    continue
                out.append(Setter(owner, m.group(2), len(split_args(m.group(3))), None))
    return out


ROW = re.compile(r"^\|\s*`(\w+)::(\w+)\(([^`]*)\)`\s*\|(.*)\|\s*$")


def cells(rest: str) -> List[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", rest)]


def canonical_default(expr: str) -> str:
    """What the reference page writes for a header's default expression."""
    e = re.sub(r"\s+", " ", expr.strip())
    m = re.fullmatch(r"std::size_t\{(\d+)\} << (\d+)", e)
    if m:
        n, shift = int(m.group(1)), int(m.group(2))
        for bits, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
            if shift >= bits:
                return f"{n << (shift - bits)} {unit}"
        return str(n << shift)
    m = re.fullmatch(r"std::chrono::\w+\((\d+)\)", e)
    if m:
        return m.group(1)
    if e == "std::nullopt":
        return "unset"
    return e


def check_options_page(root: Path, errors: List[str]) -> None:
    page = root / "docs" / "options.md"
    if not page.exists():
        errors.append("docs/options.md: missing (the reference of every Options setter)")
        return
    setters = header_setters(root)
    if len(setters) < 30:
        errors.append(f"doc_tables: only {len(setters)} setters parsed from {', '.join(OPTION_HEADERS)}")
    rows: Dict[Tuple[str, str, int], List[List[str]]] = {}
    for n, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
        m = ROW.match(line)
        if not m or m.group(1) not in OPTION_STRUCTS:
            continue
        arity = len(split_args(m.group(3)))
        rows.setdefault((m.group(1), m.group(2), arity), []).append(cells(m.group(4)) + [str(n)])
    sources = "\n".join(p.read_text(encoding="utf-8", errors="replace")
                        for p in sorted((root / "sdk" / "src").rglob("*")) if p.suffix in (".cpp", ".h"))
    wanted: Dict[Tuple[str, str, int], int] = {}
    for s in setters:
        wanted[s.key] = wanted.get(s.key, 0) + 1
    for key, count in sorted(wanted.items()):
        got = rows.get(key, [])
        if len(got) != count:
            errors.append(f"docs/options.md: {count} setter(s) {key[0]}::{key[1]} of {key[2]} argument(s) "
                          f"in the headers, {len(got)} row(s)")
    for key in sorted(set(rows) - set(wanted)):
        errors.append(f"docs/options.md:{rows[key][0][-1]}: a row for {key[0]}::{key[1]} of {key[2]} "
                      "argument(s), which the headers do not have (or have deprecated)")
    for s in setters:
        for row in rows.get(s.key, []):
            where = f"docs/options.md:{row[-1]}: {s.owner}::{s.name}"
            if len(row) < 4:
                errors.append(f"{where}: wants the columns key, default, meaning")
                continue
            key_cell, default_cell = row[0], row[1]
            if s.default is not None:
                want = canonical_default(s.default)
                if want.replace(" ", "") not in default_cell.replace("`", "").replace(" ", ""):
                    errors.append(f"{where}: the default column says '{default_cell}', the header '{s.default}' "
                                  f"(written '{want}')")
            if "not an environment key" in key_cell:
                continue
            km = re.search(r"`([\w.<>]+)`", key_cell)
            if not km:
                errors.append(f"{where}: no key in '{key_cell}' (or say 'not an environment key')")
                continue
            k = km.group(1)
            literal = '"' + k.split("<")[0] + ("" if "<" in k else '"')
            if literal not in sources:
                errors.append(f"{where}: key {k}: the library reads no such key (no {literal} in sdk/src)")


DEPRECATED = re.compile(r"\[\[deprecated(?:\((?:[^()]|\([^()]*\))*\))?\]\]")


def deprecated_names(root: Path) -> List[Tuple[str, str]]:
    """(name, header) of each [[deprecated]] declaration in the public headers."""
    out: List[Tuple[str, str]] = []
    for d in PUBLIC_HEADER_DIRS:
        for path in sorted((root / d).rglob("*.h")):
            text = strip_comments(path.read_text(encoding="utf-8"))
            for m in DEPRECATED.finditer(text):
                before = text[max(0, m.start() - 80) : m.start()]
                after = text[m.end() : m.end() + 300]
                u = re.search(r"\busing\s+(\w+)\s*$", before)
                if u:
                    out.append((u.group(1), str(path.relative_to(root))))
                    continue
                s = re.match(r"\s*(\w+)\s*[:{]", after)
                if re.search(r"\b(struct|class)\s*$", before) and s:
                    out.append((s.group(1), str(path.relative_to(root))))
                    continue
                f = re.search(r"(\w+)\s*\(([^)]*)\)", after)
                if f:
                    params = split_args(f.group(2))
                    # An overload is told apart by its parameter's type.
                    first = re.findall(r"\w+", re.sub(r"\b(const|std)\b", "", params[0]))[0] if params else ""
                    out.append((f"{f.group(1)}({first}" if first else f"{f.group(1)}()",
                                str(path.relative_to(root))))
    return out


def check_changelog(root: Path, errors: List[str]) -> None:
    path = root / "CHANGELOG.md"
    if not path.exists():
        errors.append("CHANGELOG.md: missing")
        return
    text = path.read_text(encoding="utf-8")
    if "## Unreleased" not in text:
        errors.append("CHANGELOG.md: no '## Unreleased' section for the next change to add its line to")
    names = deprecated_names(root)
    if len(names) < 11:
        errors.append(f"doc_tables: only {len(names)} [[deprecated]] names found in the public headers")
    for name, header in names:
        if name.endswith("()"):
            found = re.search(rf"`[^`]*\b{re.escape(name)}[^`]*`", text)
        elif "(" in name:
            # A function with a parameter: its name and the parameter's type in one span.
            fn, ty = name.split("(")
            found = re.search(rf"`[^`]*\b{fn}\((?:const )?{ty}\b[^`]*`", text)
        else:
            found = re.search(rf"`[^`]*\b{re.escape(name)}\b[^`]*`", text)
        if not found:
            shown = name if name.endswith(")") or "(" not in name else name + ")"
            errors.append(f"CHANGELOG.md: the deprecated {shown} ({header}) is not named in backticks")


def health_defaults(root: Path) -> Dict[str, Dict[str, str]]:
    """docs/health.md's defaults column: rule -> parameter -> the text given."""
    out: Dict[str, Dict[str, str]] = {}
    for line in (root / "docs" / "health.md").read_text(encoding="utf-8").split("\n"):
        m = re.match(r"^\|\s*`(\w+)`\s*\|(.*)\|\s*$", line)
        if not m:
            continue
        row = cells(m.group(2))
        if len(row) < 2:
            continue
        params: Dict[str, str] = {}
        for pm in re.finditer(r"`(\w+)=((?:[^`\\]|\\.)*)`", row[1]):
            k, v = pm.group(1), pm.group(2).replace("\\|", "|")
            if v == "" and row[1][pm.end():].lstrip().startswith("all six"):
                v = "<all kinds>"
            params[k] = v
        out[m.group(1)] = params
    return out


def same_value(doc: str, default: Any, all_kinds: str) -> bool:
    if doc == "<all kinds>":
        return default == all_kinds
    if isinstance(default, bool) or isinstance(default, str):
        return doc == str(default)
    try:
        return math.isclose(float(doc), float(default), rel_tol=1e-12, abs_tol=0.0)
    except ValueError:
        return False


def check_health_defaults(root: Path, errors: List[str]) -> None:
    sys.path.insert(0, str(root / "python"))
    from tensortap._doctor import rules as _doctor  # noqa: E402
    from tensortap._base import KINDS  # noqa: E402

    all_kinds = "+".join(KINDS)
    table = health_defaults(root)
    for rule, params in _doctor.PARAMETERS.items():
        if rule not in table:
            errors.append(f"docs/health.md: no row for the rule {rule}")
            continue
        doc = table[rule]
        for p, (_, default) in params.items():
            if p not in doc:
                errors.append(f"docs/health.md: {rule}: the defaults column lacks {p} (PARAMETERS: {default!r})")
            elif not same_value(doc[p], default, all_kinds):
                errors.append(f"docs/health.md: {rule}.{p}: the defaults column says {doc[p]!r}, "
                              f"PARAMETERS {default!r}")
        for p in sorted(set(doc) - set(params)):
            errors.append(f"docs/health.md: {rule}: the defaults column names {p}, which PARAMETERS has not")
    for rule in sorted(set(table) - set(_doctor.PARAMETERS)):
        errors.append(f"docs/health.md: a row for {rule}, which PARAMETERS has not")


def check_bench_readme(root: Path, errors: List[str]) -> None:
    n = len((root / "bench" / "README.md").read_text(encoding="utf-8").split("\n"))
    if n > BENCH_README_LINES:
        errors.append(f"bench/README.md: {n} lines, more than {BENCH_README_LINES}: move dated sections to "
                      "bench/HISTORY.md")


def check_help(root: Path, python: str, errors: List[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(root / "python"))
    r = subprocess.run([python, "-m", "tensortap", "--help"], env=env, capture_output=True, text=True)
    m = re.search(r"\{([\w,]+)\}", r.stdout)
    if r.returncode != 0 or not m:
        errors.append(f"tensortap --help: exit {r.returncode}, no list of commands")
        return
    head = r.stdout.split("positional arguments:")[0]
    described = head.split("\n\n", 1)[-1]
    for cmd in m.group(1).split(","):
        if not re.search(rf"\b{cmd}\b", described):
            errors.append(f"tensortap --help: its description does not say what '{cmd}' does")


def check_all(root: Path, python: str, errors: List[str]) -> None:
    check_options_page(root, errors)
    check_changelog(root, errors)
    check_health_defaults(root, errors)
    check_bench_readme(root, errors)
    check_help(root, python, errors)
