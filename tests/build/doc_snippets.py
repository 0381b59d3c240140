#!/usr/bin/env python3
"""The snippets of README.md and docs/ stay true (issue 53).

Two jobs, one set of rules:

  doc_snippets.py cpp OUT.cpp ROOT
      writes every C++ block of README.md and docs/*.md into one unit, each
      block a function (or, marked so, namespace-scope code) in a namespace
      of its own. The build compiles it (tests/CMakeLists.txt), so a block
      that stops matching the API breaks the build. It is made again only
      when a page changes, and the compiler cache serves the same text.

  doc_snippets.py check ROOT
      what a compiler cannot check (ctest docs.snippets): a block marked
      "from PATH" still occurs in PATH; every `tensortap <command>` line's
      options are in that command's --help, and `bash scripts/X.sh` options
      in the script's usage; every relative link resolves, to a file and to
      a heading; Python blocks parse, and the names they take from the
      reader exist; README.md is at most 300 lines, shows
      find_package(tensortap) within its first 150, and links every page of
      docs/; and the tables doc_tables.py holds to their sources
      (docs/options.md to options.h, docs/health.md to the doctor's
      PARAMETERS, CHANGELOG.md to the deprecated names, bench/README.md's
      length, `tensortap --help`).

A C++ block is compiled as a function body unless the HTML comment on the
line before its fence says otherwise:

  <!-- snippet: namespace -->            compiled at namespace scope (types)
  <!-- snippet: from examples/x.cpp -->  not compiled: each of its lines (a
                                         comment or `...` aside) occurs in
                                         that file, in order
  <!-- snippet: not compiled: why -->    left alone, with the reason

The names the blocks take as given (`model`, `opt`, `x`, `steps`, ...) are
declared in PRELUDE, never defined: the unit is compiled, not linked.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

PRELUDE = r"""
namespace tensortap_doc_snippets {
// What the blocks take as given: declared, never defined.
struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::Tensor forward(torch::Tensor x);
};
extern std::shared_ptr<Net> model, disc, gen;
extern torch::optim::SGD opt, d_opt, g_opt;
extern torch::Tensor x, y, loss, real, noise, ones, zeros;
extern int64_t steps;
extern std::shared_ptr<tensortap::Recorder> rec;
extern tensortap::Options opts;
extern torch::nn::Sequential seq;
torch::Tensor loss_fn(const torch::Tensor& out, const torch::Tensor& target);
torch::Tensor bce(const torch::Tensor& out, const torch::Tensor& target);
}  // namespace tensortap_doc_snippets
"""

FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: str  # relative to the root
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: Optional[str]


def pages(root: Path) -> List[Path]:
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def blocks(root: Path, path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise SystemExit(f"{path}:{i + 1}: a code block that never ends")
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : j]]
        marker_line = MARKER.match(lines[i - 1]) if i > 0 else None
        yield Block(
            str(path.relative_to(root)),
            i + 1,
            lang,
            "\n".join(body),
            marker_line.group(1) if marker_line else None,
        )
        i = j + 1


def ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", text)


def cpp_unit(root: Path) -> str:
    includes: List[str] = []
    parts: List[str] = []
    for path in pages(root):
        for b in blocks(root, path):
            if b.lang != "cpp":
                continue
            marker = b.marker or ""
            if marker.startswith("from ") or marker.startswith("not compiled"):
                continue
            if marker not in ("", "namespace"):
                raise SystemExit(f"{b.page}:{b.line}: unknown snippet marker '{marker}'")
            body: List[str] = []
            for ln in b.text.split("\n"):
                if ln.startswith("#include"):
                    if ln not in includes:
                        includes.append(ln)
                else:
                    body.append(ln)
            ns = f"tensortap_doc_snippets::{ident(b.page)}_{b.line}"
            where = f'#line {b.line + 1} "{b.page}"'
            if marker == "namespace":
                parts.append(f"namespace {ns} {{\n{where}\n" + "\n".join(body) + f"\n}}  // namespace {ns}\n")
            else:
                parts.append(
                    f"namespace {ns} {{\nusing namespace tensortap_doc_snippets;\n[[maybe_unused]] void snippet() {{\n"
                    f"{where}\n" + "\n".join(body) + f"\n}}\n}}  // namespace {ns}\n"
                )
    head = [
        "// Generated by tests/build/doc_snippets.py from README.md and docs/*.md: do not edit.",
        "// Each block of C++ in them, compiled (never linked) so that the docs follow the API.",
        "#include <torch/torch.h>",
        "#include <tensortap/tensortap.h>",
    ] + includes
    return "\n".join(head) + "\n" + PRELUDE + "\n" + "\n".join(parts)


# ---- check -------------------------------------------------------------


def anchors(path: Path) -> Set[str]:
    """GitHub's anchors for a page's headings."""
    out: Set[str] = set()
    in_code = False
    for ln in path.read_text(encoding="utf-8").split("\n"):
        if FENCE.match(ln):
            in_code = not in_code
            continue
        if in_code:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", ln)
        if m:
            text = m.group(1).lower()
            text = re.sub(r"[^\w\- ]", "", text)
            out.add(text.replace(" ", "-"))
    return out


LINK = re.compile(r"\]\(([^)\s]+)\)")


def check_links(root: Path, errors: List[str]) -> None:
    for path in pages(root) + [root / "bench" / "README.md", root / "tests" / "README.md"]:
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, frag = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path.resolve()
            where = f"{path.relative_to(root)}: link ({target})"
            if not dest.exists():
                errors.append(f"{where}: no such file")
                continue
            try:
                dest.relative_to(root.resolve())
            except ValueError:
                errors.append(f"{where}: leaves the repository")
                continue
            if frag and dest.suffix == ".md" and frag not in anchors(dest):
                errors.append(f"{where}: no heading '#{frag}' in {dest.relative_to(root.resolve())}")


def check_from(root: Path, b: Block, source: str, errors: List[str]) -> None:
    file = root / source
    if not file.exists():
        errors.append(f"{b.page}:{b.line}: cut from {source}, which does not exist")
        return
    norm = [re.sub(r"\s+", " ", ln.strip()) for ln in file.read_text(encoding="utf-8").split("\n")]
    k = 0
    for ln in b.text.split("\n"):
        want = re.sub(r"\s+", " ", re.sub(r"\s*//.*$", "", ln).strip())
        if not want or want.startswith("//") or want == "...":
            continue
        while k < len(norm) and want not in norm[k]:
            k += 1
        if k == len(norm):
            errors.append(f"{b.page}:{b.line}: '{want}' no longer occurs in {source} (in the block's order)")
            return
        k += 1


COMMAND = re.compile(r"^(?:\S*/)?(?:tensortap|python3 -m tensortap|/usr/bin/python3 -m tensortap)\s+(\w+)(.*)$")
SCRIPT = re.compile(r"^bash (scripts/\S+\.sh)(.*)$")


def option_words(rest: str) -> List[str]:
    rest = re.sub(r"\s#.*$", "", rest)
    return re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", rest)


def check_commands(root: Path, python: str, b: Block, helps: Dict[str, str], errors: List[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(root / "python"))
    for ln in b.text.split("\n"):
        ln = ln.strip()
        m = COMMAND.match(ln)
        if m:
            sub, rest = m.group(1), m.group(2)
            if sub not in helps:
                r = subprocess.run(
                    [python, "-m", "tensortap", sub, "--help"], env=env, capture_output=True, text=True
                )
                helps[sub] = r.stdout if r.returncode == 0 else ""
                if r.returncode != 0:
                    errors.append(f"{b.page}:{b.line}: 'tensortap {sub}' is not a command ({r.stderr.strip()})")
            for opt in option_words(rest):
                if helps[sub] and not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", helps[sub]):
                    errors.append(f"{b.page}:{b.line}: 'tensortap {sub} {opt}': no such option in its --help")
            continue
        m = SCRIPT.match(ln)
        if m:
            script = root / m.group(1)
            if not script.exists():
                errors.append(f"{b.page}:{b.line}: {m.group(1)} does not exist")
                continue
            text = script.read_text(encoding="utf-8")
            for opt in option_words(m.group(2)):
                if not re.search(rf"(?<![\w-]){re.escape(opt)}\)", text):
                    errors.append(f"{b.page}:{b.line}: {m.group(1)} takes no option {opt}")


def check_python(root: Path, b: Block, errors: List[str]) -> None:
    try:
        tree = ast.parse(b.text)
    except SyntaxError as e:
        errors.append(f"{b.page}:{b.line + (e.lineno or 0)}: Python that does not parse: {e.msg}")
        return
    sys.path.insert(0, str(root / "python"))
    import tensortap  # noqa: E402
    import tensortap.torch as twin  # noqa: E402

    import inspect  # noqa: E402

    owners = {"tensortap": tensortap, "ttt": twin, "run": tensortap.Run}
    # A run's attributes set in __init__ are not the class's.
    run_source = inspect.getsource(sys.modules[tensortap.Run.__module__])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in owners:
            owner = owners[node.value.id]
            if owner is tensortap.Run and (
                node.attr in tensortap.Run.__annotations__ or f"self.{node.attr} " in run_source
            ):
                continue
            if not hasattr(owner, node.attr):
                errors.append(f"{b.page}:{b.line}: {node.value.id}.{node.attr} does not exist")


def check(root: Path, python: str) -> List[str]:
    errors: List[str] = []
    readme = (root / "README.md").read_text(encoding="utf-8").split("\n")
    if len(readme) > 300:
        errors.append(f"README.md: {len(readme)} lines, more than 300")
    if not any("find_package(tensortap" in ln for ln in readme[:150]):
        errors.append("README.md: find_package(tensortap) is not within the first 150 lines")
    for page in sorted((root / "docs").glob("*.md")):
        if page.name != "README.md" and f"docs/{page.name}" not in "\n".join(readme):
            errors.append(f"README.md: no link to docs/{page.name}")
    check_links(root, errors)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import doc_tables  # noqa: E402

    doc_tables.check_all(root, python, errors)
    helps: Dict[str, str] = {}
    counts = {"compiled": 0, "from": 0, "not compiled": 0, "commands": 0, "python": 0}
    for path in pages(root):
        for b in blocks(root, path):
            marker = b.marker or ""
            if b.lang == "cpp":
                if marker.startswith("from "):
                    check_from(root, b, marker[len("from ") :].strip(), errors)
                    counts["from"] += 1
                elif marker.startswith("not compiled"):
                    if not marker[len("not compiled") :].strip(" :"):
                        errors.append(f"{b.page}:{b.line}: 'not compiled' without a reason")
                    counts["not compiled"] += 1
                else:
                    counts["compiled"] += 1
            elif b.lang == "sh":
                check_commands(root, python, b, helps, errors)
                counts["commands"] += 1
            elif b.lang == "python":
                check_python(root, b, errors)
                counts["python"] += 1
    print("doc snippets: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return errors


def main(argv: List[str]) -> int:
    if len(argv) == 4 and argv[1] == "cpp":
        out, root = Path(argv[2]), Path(argv[3])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(cpp_unit(root), encoding="utf-8")
        return 0
    if len(argv) == 3 and argv[1] == "check":
        errors = check(Path(argv[2]).resolve(), sys.executable)
        for e in errors:
            print(e)
        print(f"{len(errors)} problem(s)" if errors else "the docs' snippets hold")
        return 1 if errors else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
