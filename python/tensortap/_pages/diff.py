"""`tensortap diff A B --html OUT`: one self-contained page about two runs
(figures as PNG data: URLs, data as JSON, no network; the frame
`tensortap report`'s page shares, _page.py), built from the command's rows
(every statistic of every record).

- The summary: what the command printed, wrapped to the page's width.
- The error by name and step, a heatmap per kind, so that every kind has
  rows: each cell is one record, coloured by log10 of its rel_norm =
  ||a-b||/||a|| (with --floor: of rel_norm / max(floor_rel_norm, 4u), so
  that the factor is the line between noise and a difference), white where
  A and B are equal bit for bit, blue where the shape or dtype differs, the
  record cannot be read or is on one side only, a dot where a record is
  beyond tolerance and not noise, the first divergence outlined in red. A
  kind with more than ROWS names groups them (by their common prefix, or
  in runs of A's order), and more than COLUMNS steps are binned; a cell
  shows the largest error of the records it holds.
- A view of the records that differ most: the histogram of b - a, the
  first element beyond tolerance, and hints: B is A transposed, scaled,
  offset, or shifted by a few elements.
- The records that differ or are on one side only, as a table.
"""

from __future__ import annotations

import html
import math
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._base import KINDS
from .._diff.side import Options
from .._diff.tally import Tally, _what
from .._diff.text import _where, esc
from .frame import _jsonable, _Page, _pyplot, _text, _write_page
from .facts import record_facts

ROWS = 60          # rows of a kind's heatmap; more names are grouped
COLUMNS = 200      # steps of a heatmap; more are binned
VIEWS = 8          # records with a view of their own
TABLE = 500        # rows of the table of differences

_MARKED = ("mismatch", "unreadable", "only_a", "only_b")

# The page's own style: the summary wraps rather than running off the side.
_STYLE = """
pre.summary { white-space: pre-wrap; overflow-wrap: anywhere; overflow-x: visible; }
p.first { font-weight: 600; overflow-wrap: anywhere; }
section.record { border-left: 3px solid #ddd; padding-left: .8rem; margin: 1.2rem 0; }
section.record h3 { font-size: 1rem; margin: .2rem 0; overflow-wrap: anywhere; }
td { overflow-wrap: anywhere; }
"""


class Collector:
    """What the page keeps of the command's rows as they stream by: a cell
    per record (rank, kind, name, step, status, colour value: a tuple, not
    the row's dict), the first TABLE rows that differ whole, and the rows
    of the records that differ most (a few, for their views)."""

    def __init__(self, floor: bool) -> None:
        self.floor = floor
        self.cells: List[Tuple[int, str, str, int, str, float]] = []
        self.table: List[Dict[str, Any]] = []
        self.n_table = 0
        self.worst: List[Tuple[float, int, Dict[str, Any]]] = []  # a heap: the largest values kept

    def __call__(self, row: Dict[str, Any]) -> None:
        import heapq

        value = _value(row, self.floor)
        status = row["status"]
        self.cells.append((row["rank"], row["kind"], row["name"], row["step"], status, value))
        if status in ("equal", "noise"):
            return
        self.n_table += 1
        if len(self.table) < TABLE:
            self.table.append(row)
        if status == "differ" and not math.isnan(value):
            entry = (value, len(self.cells), row)
            if len(self.worst) < 8 * VIEWS:
                heapq.heappush(self.worst, entry)
            elif entry[:2] > self.worst[0][:2]:
                heapq.heapreplace(self.worst, entry)


class _DiffPage(_Page):
    def render(self) -> str:
        return super().render().replace("</style>", _STYLE + "</style>", 1)


def write_diff_page(out_path: Union[str, "os.PathLike[str]"], tally: Tally, rows: Collector,
                    lines: Sequence[str], paths: Tuple[str, str, Union[None, str, Sequence[str]]],
                    opts: Options) -> str:
    """Writes the page of `tensortap diff --html`; `rows` collected the
    command's rows (every statistic), `lines` what it printed, `paths` A, B
    and the floor run A2 (or a list of them, or None)."""
    a, b, given = paths
    a2 = [] if given is None else [given] if isinstance(given, str) else list(given)
    page = _DiffPage(f"tensortap diff: {esc(a)} against {esc(b)}")
    floor = bool(a2)
    tol = "exact" if opts.rtol == 0 and opts.atol == 0 else f"rtol {opts.rtol:g}, atol {opts.atol:g}"
    named = ", ".join(f"<code>{html.escape(esc(p))}</code>" for p in a2)
    what = "A2 (the floor)" if len(a2) == 1 else "the floor runs (the largest of their floors counts)"
    runs = (f"A (the reference): <code>{html.escape(esc(a))}</code><br>B: <code>{html.escape(esc(b))}</code><br>"
            + (f"{what}: {named}, factor {opts.factor:g}<br>" if floor else "")
            + f"tolerance: {tol}")
    # What the reader should see before the rest: the first divergence, and
    # a floor that disagrees with itself (it is not to be trusted blindly).
    leads = [line for line in lines if line.startswith(("first divergence: ", "floors disagree from step "))]
    lead = "".join(f'<p class="first">{html.escape(line)}</p>' for line in leads)
    page.section("Summary", f"<p>{runs}</p>{lead}<pre class=\"summary\">{html.escape(chr(10).join(lines))}</pre>")
    try:
        page.section("Error by name and step", _heatmaps(page, rows.cells, tally, floor, opts.factor))
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - reported in the page
        page.section("Error by name and step", _failed(e))
    try:
        views = _views(page, rows, tally, opts)
        if views:
            page.section("The records that differ most", views)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - reported in the page
        page.section("The records that differ most", _failed(e))
    finally:
        tally.cmp.close()
    differing = rows.table
    if differing:
        cells = "".join(f"<tr><td>{html.escape(r['status'])}</td><td>{html.escape(_describe(r, tally))}</td></tr>"
                        for r in differing)
        more = f"<p>... and {rows.n_table - len(differing)} more.</p>" if rows.n_table > len(differing) else ""
        page.section("Records that differ or are on one side only",
                     f"<table><tr><th>status</th><th>record</th></tr>{cells}</table>{more}")
    disagree = tally.floor_disagrees() if floor else None
    page.data = _jsonable({"a": a, "b": b, "floor": given, "rtol": opts.rtol, "atol": opts.atol,
                           "factor": opts.factor if floor else None, "first_divergence": tally.first_divergence(),
                           "floor_disagrees_step": None if disagree is None else disagree["step"],
                           "rows": [{k: r[k] for k in ("rank", "kind", "name", "step", "status", "rel_norm")}
                                    for r in differing]})
    return _write_page(page.render(), out_path)


def _failed(e: BaseException) -> str:
    return f"<p>This section could not be drawn: {html.escape(esc(f'{type(e).__name__}: {e}'))}</p>"


def _describe(row: Dict[str, Any], tally: Tally) -> str:
    return _where(row["kind"], row["name"], row["step"], row["rank"], tally.ranks) + ": " \
        + _what(row, row.get("_detail", ""))


# -- the heatmaps -------------------------------------------------------------


def _value(row: Dict[str, Any], floor: bool) -> float:
    """What a cell's colour shows (log10), -inf for equal bit for bit, NaN
    for nothing compared."""
    rel = row["rel_norm"]
    if row["status"] in _MARKED or rel is None or math.isnan(rel):
        return math.nan
    if rel == 0:
        return -math.inf
    if floor and row["_floor"] and not math.isnan(row["floor_rel_norm"]):
        u = row["_u"]
        ref = max(row["floor_rel_norm"], 4 * u if not math.isnan(u) else 0.0)
        if ref == 0 or math.isinf(ref):
            return math.inf if ref == 0 else -math.inf
        return math.log10(rel) - math.log10(ref)
    return math.log10(rel) if math.isfinite(rel) else math.inf


def _parts(name: str) -> List[str]:
    return [p for p in re.split(r"[./]", name) if p] or [name]


def _layout(keys: List[Tuple[int, str]], ranks: bool) -> List[Tuple[str, List[Tuple[int, str]]]]:
    """The heatmap's rows: (label, the keys it holds), at most ROWS."""
    def label(key: Tuple[int, str], text: str) -> str:
        return text + (f" (rank {key[0]})" if ranks else "")

    if len(keys) <= ROWS:
        return [(label(k, esc(k[1])), [k]) for k in keys]
    deepest = max(len(_parts(k[1])) for k in keys)
    for depth in range(deepest - 1, 0, -1):
        groups: Dict[Tuple[int, str], List[Tuple[int, str]]] = {}
        for k in keys:
            groups.setdefault((k[0], ".".join(_parts(k[1])[:depth])), []).append(k)
        if len(groups) <= ROWS and len(groups) < len(keys):
            return [(label(g, f"{esc(g[1])}.* ({len(m)})" if len(m) > 1 else esc(m[0][1])), m)
                    for g, m in groups.items()]
    # No common prefixes to speak of: runs of A's order.
    size = math.ceil(len(keys) / ROWS)
    out = []
    for i in range(0, len(keys), size):
        part = keys[i:i + size]
        text = esc(part[0][1]) if len(part) == 1 else f"{esc(part[0][1])} ... {esc(part[-1][1])} ({len(part)})"
        out.append((label(part[0], text), part))
    return out


def _heatmaps(page: _Page, cells: Sequence[Tuple[int, str, str, int, str, float]], tally: Tally, floor: bool,
              factor: float) -> str:
    if not cells:
        return "<p>Neither run holds a record.</p>"
    plt = _pyplot()
    by_kind: Dict[str, List[Tuple[int, str, str, int, str, float]]] = {}
    for c in cells:
        by_kind.setdefault(c[1], []).append(c)
    values = np.array([c[5] for c in cells])
    finite = values[np.isfinite(values)]
    if floor:
        center = math.log10(factor) if factor > 0 else 0.0
        lo = min(center - 1.0, math.floor(finite.min())) if finite.size else center - 1
        hi = max(center + 1.0, math.ceil(finite.max())) if finite.size else center + 1
        label = "log10 of rel_norm / max(floor_rel_norm, 4u): above log10(factor), beyond the floor"
    else:
        lo = max(-17.0, math.floor(finite.min())) if finite.size else -8.0
        hi = max(lo + 1.0, min(2.0, math.ceil(finite.max()))) if finite.size else 0.0
        center = None
        label = "log10 rel_norm = ||a-b|| / ||a||"
    first = tally.first
    outline = None if first is None else (first["rank"], first["kind"], first["name"], first["step"])
    parts = []
    for kind in [k for k in KINDS if k in by_kind]:
        grid = kind_grid(by_kind[kind], tally.ranks, outline)
        parts.append(_kind_figure(page, plt, kind, grid, (lo, hi, center), label))
    note = ("<p>Each cell is a record, coloured by how much B differs from A: "
            + ("log10 of its rel_norm over the floor's, max(floor_rel_norm, 4u), so that the factor "
               f"({factor:g}) is where noise ends; " if floor else "log10 of its rel_norm, ||a-b|| / ||a||; ")
            + "white where they are equal bit for bit, grey where a run has no record, blue where the shape or "
            "dtype differs, the record cannot be read or is on one side only; a dot marks a record beyond "
            "tolerance" + (" and the floor" if floor else "") + ", the red outline the first divergence. A kind with "
            f"more than {ROWS} names groups them and more than {COLUMNS} steps are binned: a cell shows the "
            "largest error it holds.</p>")
    return note + "".join(parts)


class Grid:
    """A kind's heatmap: its rows (label, keys), its columns (steps), and per
    cell the largest value, whether a record is there, marked (not
    compared), dotted (beyond tolerance and the floor); the outlined cell."""

    def __init__(self, layout: List[Tuple[str, List[Tuple[int, str]]]], bins: List[np.ndarray]) -> None:
        self.layout, self.bins = layout, bins
        shape = (len(layout), len(bins))
        self.values = np.full(shape, -np.inf)
        self.present = np.zeros(shape, dtype=bool)
        self.marks = np.zeros(shape, dtype=bool)
        self.dots = np.zeros(shape, dtype=bool)
        self.outline: Optional[Tuple[int, int]] = None


def kind_grid(cells: Sequence[Tuple[int, str, str, int, str, float]], ranks: bool,
              outline: Optional[Tuple[int, str, str, int]] = None) -> Grid:
    """The heatmap of one kind's cells (rank, kind, name, step, status,
    value); `outline`: the (rank, kind, name, step) outlined."""
    keys: Dict[Tuple[int, str], None] = {}
    for c in cells:
        keys.setdefault((c[0], c[2]), None)
    layout = _layout(list(keys), ranks)
    row_of = {k: i for i, (_, members) in enumerate(layout) for k in members}
    steps = sorted({c[3] for c in cells})
    bins = np.array_split(np.array(steps, dtype=np.int64), min(len(steps), COLUMNS))
    col_of = {s: j for j, b in enumerate(bins) for s in b.tolist()}
    g = Grid(layout, bins)
    for rank, kind, name, step, status, value in cells:
        i, j = row_of[(rank, name)], col_of[step]
        g.present[i, j] = True
        if outline == (rank, kind, name, step):
            g.outline = (i, j)
        if status in _MARKED:
            g.marks[i, j] = True
            continue
        if not math.isnan(value):
            g.values[i, j] = max(g.values[i, j], value)
        if status == "differ":
            g.dots[i, j] = True
    return g


def _kind_figure(page: _Page, plt: Any, kind: str, g: Grid, scale: Tuple[float, float, Optional[float]],
                 label: str) -> str:
    from matplotlib.colors import ListedColormap, TwoSlopeNorm
    from matplotlib.patches import Rectangle

    layout, bins, grid, outline = g.layout, g.bins, g.values, g.outline
    present, marks, dots = g.present, g.marks, g.dots

    lo, hi, center = scale
    fig, ax = plt.subplots(figsize=(10.0, max(2.2, 0.26 * len(layout) + 1.4)), layout="constrained")
    cmap = plt.get_cmap("RdBu_r" if center is not None else "magma_r").copy()
    cmap.set_bad("white")
    shown = np.ma.masked_invalid(np.clip(grid, lo, hi, where=np.isfinite(grid), out=grid.copy()))
    if center is not None:
        norm = TwoSlopeNorm(vcenter=center, vmin=min(lo, center - 1e-9), vmax=max(hi, center + 1e-9))
        im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    else:
        im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap, vmin=lo, vmax=hi)
    absent = ~present
    if absent.any():
        ax.imshow(np.ma.masked_where(~absent, absent.astype(float)), aspect="auto", interpolation="nearest",
                  cmap=ListedColormap(["#d9d9d9"]), vmin=0, vmax=1)
    if marks.any():
        ax.imshow(np.ma.masked_where(~marks, marks.astype(float)), aspect="auto", interpolation="nearest",
                  cmap=ListedColormap(["#2b8cbe"]), vmin=0, vmax=1)
    if dots.any():
        ys, xs = np.nonzero(dots)
        ax.scatter(xs, ys, s=6 if dots.size > 2000 else 12, c="black", marker="o", linewidths=0)
    if outline is not None:
        i, j = outline
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#e41a1c", linewidth=2.5))
    ax.set_yticks(range(len(layout)))
    ax.set_yticklabels([_text(text) for text, _ in layout], fontsize=7)
    ticks = list(range(0, len(bins), max(1, len(bins) // 12)))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(int(bins[t][0])) for t in ticks], fontsize=7)
    ax.set_xlabel("step" if all(len(b) == 1 for b in bins) else "step (binned: the first of each)")
    ax.set_title(f"{kind}: {len(layout)} rows", fontsize=10)
    fig.colorbar(im, ax=ax, label=label, shrink=0.9 if len(layout) > 4 else 1.0)
    out = page.figure(fig, f"{kind}: error by name and step")
    plt.close(fig)
    return f"<h3>{html.escape(kind)}</h3>" + out


# -- a view per record ------------------------------------------------------------


def _views(page: _Page, rows: Collector, tally: Tally, opts: Options) -> str:
    chosen: List[Dict[str, Any]] = []
    names = set()
    if tally.first is not None:
        chosen.append(tally.first)
        names.add((tally.first["kind"], tally.first["name"]))
    for _, _, r in sorted(rows.worst, key=lambda e: (-e[0], e[1])):  # the most differing, one per name
        if len(chosen) >= VIEWS:
            break
        if (r["kind"], r["name"]) not in names:
            chosen.append(r)
            names.add((r["kind"], r["name"]))
    if not chosen:
        return ""
    plt = _pyplot()
    out = [f"<p>The first divergence and the records that differ most (one per name, at most {VIEWS}).</p>"]
    for r in chosen:
        out.append(_view(page, plt, r, tally, opts))
    return "".join(out)


def _view(page: _Page, plt: Any, row: Dict[str, Any], tally: Tally, opts: Options) -> str:
    where = _where(row["kind"], row["name"], row["step"], row["rank"], tally.ranks)
    head = (f'<section class="record"><h3>{html.escape(where)}</h3>'
            f"<p>{html.escape(_what(row, row.get('_detail', '')))}</p>")
    try:
        a = np.asarray(tally.cmp.a.read(row["_a"]))
        b = np.asarray(tally.cmp.b.read(row["_b"]))
    except Exception as e:  # noqa: BLE001 - said in the page
        return head + f"<p>Cannot be read again: {html.escape(esc(e))}</p></section>"
    facts = record_facts(a, b, opts.rtol, opts.atol)
    items = []
    if facts["first"] is not None:
        items.append(f"first element beyond tolerance: {facts['first']}")
    items.extend(facts["hints"])
    if facts["sampled"]:
        items.append(f"drawn from {facts['sampled']:,} of its {a.size:,} elements, evenly taken")
    body = "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in items) + "</ul>" if items else ""
    counts, edges = facts["histogram"]
    if counts is not None:
        fig, ax = plt.subplots(figsize=(10.0, 2.4), layout="constrained")
        ax.stairs(counts, edges, fill=True, color="#3182bd")
        ax.set_yscale("log")
        ax.set_xlabel("b - a")
        ax.set_ylabel("elements")
        ax.set_title(_text(f"differences, {where}"), fontsize=9)
        body += page.figure(fig, f"histogram of the differences, {where}")
        plt.close(fig)
    return head + body + "</section>"


__all__ = ["write_diff_page", "Collector", "record_facts", "kind_grid", "ROWS", "COLUMNS"]
