"""The report page's flight recorder section (report.py): its dumps, as a
table with, per dump, the tensor that fired it over the steps before it
and the window it wrote. Past DUMPS_LISTED dumps (summary.py), their counts
by rule and reason, a timeline, and the first and the last few.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .._base import _safe
from .frame import _legend_outside, _Page, _pyplot, _span, _text
from .._views.summary import _rule, dump_digest

if TYPE_CHECKING:
    import pandas

    from .._run import Run


def _dumps(page: _Page, run: Run, stats: Optional[pandas.DataFrame]) -> None:
    dumps = run.dumps
    if not dumps:
        page.section("Flight recorder dumps", "<p>No dumps.</p>")
        return
    # Past DUMPS_LISTED, the counts, a timeline and the first and last few:
    # a figure per dump made 1,100 dumps a 21 MB page.
    shown, counts = dump_digest(dumps)
    summary = ""
    if counts:
        summary = (f"<p>{len(dumps)} dumps; the first and the last {len(shown) // 2} are listed and drawn.</p>"
                   "<table><tr><th>dumps</th><th>rule</th><th>reason</th></tr>"
                   + "".join(f"<tr><td>{n}</td><td>{html.escape(_safe(rule))}</td><td>{html.escape(_safe(reason))}"
                             "</td></tr>" for (rule, reason), n in counts) + "</table>")
        summary += _dump_timeline(page, dumps, counts)
    rows = []
    for d in shown:
        steps = d.get("steps")
        steps = steps if isinstance(steps, list) else []
        trigger = d.get("trigger")
        trigger = trigger if isinstance(trigger, dict) else {}
        rows.append("<tr>" + "".join(f"<td>{html.escape(_safe(v))}</td>" for v in (
            d.get("rank", ""), d.get("step", "?"), trigger.get("kind", d.get("reason", "?")),
            f"{d.get('kind', '')} {d.get('name', '')}".strip(), _num(d.get("value")), _num(d.get("median")),
            _span([s for s in steps if isinstance(s, int)]))) + "</tr>")
    table = ("<table><tr><th>rank</th><th>step</th><th>trigger</th><th>tensor</th><th>value</th><th>median</th>"
             "<th>steps written</th></tr>" + "".join(rows) + "</table>")
    figures = []
    if stats is not None:
        plt = _pyplot()
        for d in shown:
            figure = _dump_figure(plt, page, stats, d)
            if figure:
                figures.append(figure)
    page.section("Flight recorder dumps", summary + table + "".join(figures))


def _dump_timeline(page: _Page, dumps: List[Dict[str, Any]],
                   counts: List[Tuple[Tuple[str, str], int]]) -> str:
    """Every dump as a mark at its step, one row per rule and reason."""
    plt = _pyplot()
    keys = [k for k, _ in counts][:12]
    row = {k: i for i, k in enumerate(keys)}
    xs, ys = [], []
    for d in dumps:
        i = row.get((str(_rule(d)), str(d.get("reason", "?"))))
        step = d.get("step")
        if i is not None and isinstance(step, int) and not isinstance(step, bool):
            xs.append(step)
            ys.append(i)
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(keys) + 1.4), layout="constrained")
    ax.scatter(xs, ys, marker="|", s=120, linewidths=1, color="tab:red")
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([_text(f"{rule} ({reason})") for rule, reason in keys], fontsize=8)
    ax.set_ylim(-0.7, len(keys) - 0.3)
    ax.set_xlabel("step")
    ax.set_title("every dump, by rule and reason", fontsize=10)
    out = page.figure(fig, "timeline of the dumps")
    plt.close(fig)
    return out


def _dump_figure(plt: Any, page: _Page, stats: pandas.DataFrame, d: Dict[str, Any]) -> Optional[str]:
    """The tensor that fired the dump, over the steps before it and the
    window it wrote."""
    if not isinstance(d.get("name"), str) or not isinstance(d.get("kind"), str) \
            or not isinstance(d.get("step"), int) or isinstance(d.get("step"), bool):
        return None  # a dump with no tensor (Recorder::dump()) or a damaged one: the table shows it
    rows = stats[(stats["name"] == d["name"]) & (stats["kind"] == d.get("kind"))]
    if d.get("rank") is not None:
        rows = rows[rows["rank"] == d["rank"]]
    listed = d.get("steps")
    written = [s for s in listed if isinstance(s, int)] if isinstance(listed, list) else []
    steps = written or [d["step"]]
    first = min(steps)
    before = max(len(steps), 20)
    rows = rows[(rows["step"] >= first - before) & (rows["step"] <= d["step"] + 5)]
    if rows.empty:
        return None
    field = "mean" if (rows["numel"] == 1).all() else "norm"
    fig, ax = plt.subplots(figsize=(10, 3.2), layout="constrained")
    ax.plot(rows["step"], rows[field], marker=".", linewidth=1)
    if written:  # none without a flight recorder: the dump is a mark in run.json
        ax.axvspan(first - 0.5, max(written) + 0.5, color="tab:orange", alpha=0.15, label="steps written")
    ax.axvline(d["step"], color="tab:red", linewidth=1, label=f"dump at step {d['step']}")
    if isinstance(d.get("median"), (int, float)) and math.isfinite(d["median"]):
        ax.axhline(d["median"], color="0.5", linestyle="--", linewidth=1, label="median")
    ax.set_xlabel("step")
    ax.set_ylabel(_text(f"{field} of {d['name']}"))
    where = "" if d.get("rank") is None else f" (rank {d['rank']})"
    ax.set_title(_text(f"{d.get('reason', 'dump')}: {d.get('kind', '')} {d['name']}{where}"), fontsize=10)
    _legend_outside(ax)
    out = page.figure(fig, f"the steps before the dump at step {d['step']}")
    plt.close(fig)
    return out


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else ("" if v is None else str(v))
