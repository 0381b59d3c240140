"""The report page's Findings (report.py): the training health rules'
findings for the run, the doctor's (tensortap/_doctor.py, every rule with
its defaults, as `tensortap doctor RUN`), first on the page, each linked to
a chart of its tensor in the section "Tensors with findings"; the rules not
evaluated, with why.

A chart's id is its place among the charts (finding-chart-0, ...), never a
name from the run: names are anything a model holds. A chart shows, per
rule that found the tensor, the measure that rule judged, over steps from
the statistics (or from the full records where the run has none), with the
findings' steps shaded and the bound it was compared with.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from .._base import STATS_FIELDS, STATS_REAL, RunError, _safe, nonfinite
from .._doctor.command import evaluate
from .._doctor.rules import COLUMNS, RULES, Finding, Result, Settings, saturation_bounds
from .._doctor.taps import declared_any, saturating_function
from .._doctor.rows import param_records, statistics
from .frame import _legend_outside, _Page, _pyplot, _text

if TYPE_CHECKING:
    import pandas

    from .._run import Run

HEADING = "Findings"
CHARTS = "Tensors with findings"
# A finding per row up to this many; the page's JSON has them all.
MAX_LISTED = 200
# Tensors charted: each chart is a PNG in the page; past this, a finding
# links to the heatmap that holds its tensor, where there is one.
MAX_CHARTS = 12
# A finding about the whole model links to the first of these sections that
# shows something (a figure, a table): the activations' scales, the stall's dump.
WHOLE_MODEL = {"poor_weight_initialization": ("statistics-heatmaps", "activation-histograms"),
               "stalled_training": ("flight-recorder-dumps",)}


class Findings:
    """The doctor's verdict on a run, or why there is none, and where on
    the page each tensor's chart is."""

    def __init__(self, result: Optional[Result], error: Optional[str]) -> None:
        self.result = result
        self.error = error
        self.charts: Dict[Tuple[str, str], str] = {}
        """(kind, name) -> the id of its chart."""
        self.heatmap: Dict[Tuple[str, str], bool] = {}
        """(kind, name) -> whether the statistics heatmaps hold it (a tensor not charted)."""

    def tensors(self) -> List[Tuple[str, str]]:
        """The tensors the findings name: first each rule's first, then the
        others in the findings' order; so that past MAX_CHARTS, a blow-up's
        first tensor is not lost behind the dozens its tensor_variance names."""
        named = [f for f in self.result.findings if f.kind is not None and f.name is not None] \
            if self.result is not None else []
        firsts: Dict[str, Finding] = {}
        for f in named:
            firsts.setdefault(f.rule, f)
        out: Dict[Tuple[str, str], None] = {}
        for f in [f for f in named if firsts[f.rule] is f] + named:
            assert f.kind is not None and f.name is not None
            out.setdefault((f.kind, f.name), None)
        return list(out)


def evaluate_findings(run: Run) -> Findings:
    # A run the doctor cannot judge costs the page its findings, not the page.
    try:
        return Findings(evaluate(run), None)
    except Exception as e:  # noqa: BLE001 - said on the page
        return Findings(None, f"{type(e).__name__}: {e}")


def data(found: Findings) -> Dict[str, Any]:
    """The findings for the page's JSON."""
    if found.result is None:
        return {"error": found.error}
    rows = [dict({c: getattr(f, c) for c in COLUMNS}, chart=found.charts.get((f.kind or "", f.name or "")))
            for f in found.result.findings]
    return {"findings": rows, "not_evaluated": dict(found.result.not_evaluated)}


def section(page: _Page, found: Findings) -> None:
    """The Findings section, made the page's first. Called last: a link is
    written only to a chart or a section that is on the page."""
    if found.result is None:
        body = f"<p>The doctor could not judge this run: {html.escape(_safe(found.error))}</p>"
    else:
        body = _body(page, found, found.result)
    page.section(HEADING, body)
    page.sections.insert(0, page.sections.pop())


def _body(page: _Page, found: Findings, result: Result) -> str:
    n = len(result.findings)
    sources = set(result.sources.values())
    source = ("its statistics" if sources == {"statistics"} else "statistics computed from its full records"
              if sources == {"records"} else "its statistics, and statistics computed from the full records of "
              "the ranks without")
    judged = len(RULES) - len(result.not_evaluated)
    out = [f"<p><strong>{n} finding{'' if n == 1 else 's'}</strong> by the training health rules "
           f"(<code>tensortap doctor</code>, every rule with its defaults; {judged} evaluated), on {source}"
           + (": no rule could be evaluated" if not judged else ": none found a problem" if not n else "") + ".</p>"]
    if n:
        # The doctor's order: the likely cause first, causes before their
        # consequences (docs/health.md), as `tensortap doctor` prints them.
        out.append(f"<p>Likely cause: <code>{html.escape(_safe(result.findings[0].line(result.ranks)))}</code>"
                   f"{'' if len(result.groups) < 2 else f' (the findings fall in {len(result.groups)} groups)'}</p>")
        shown = result.findings[:MAX_LISTED]
        head = "<tr><th>rule</th><th>tensor</th>" + ("<th>rank</th>" if result.ranks else "") + \
            "<th>steps</th><th>finding</th></tr>"
        rows = [_row(page, found, f, result.ranks) for f in shown]
        out.append("<table>" + head + "".join(rows) + "</table>")
        if n > len(shown):
            out.append(f"<p>The first {len(shown)} of {n}; <code>tensortap doctor</code> lists them all, and the "
                       "page's data holds them.</p>")
    if result.not_evaluated:
        out.append('<p class="compact">Not evaluated:</p><ul class="compact">' + "".join(
            f"<li><code>{html.escape(rule)}</code>: {html.escape(_safe(why))}</li>"
            for rule, why in result.not_evaluated.items()) + "</ul>")
    return "".join(out)


def _row(page: _Page, found: Findings, f: Finding, ranks: bool) -> str:
    if f.kind is None or f.name is None:
        what = "the model"
        target = next((a for a in WHOLE_MODEL.get(f.rule, ()) if _has_section(page, a)), None)
    else:
        what = f"{f.kind} {_safe(f.name)}"
        target = found.charts.get((f.kind, f.name))
        if target is None and found.heatmap.get((f.kind, f.name)) and _has_section(page, "statistics-heatmaps"):
            target = "statistics-heatmaps"
    tensor = html.escape(what)
    if target is not None:
        tensor = f'<a href="#{target}">{tensor}</a>'
    steps = str(f.first_step) if f.first_step == f.last_step else f"{f.first_step}..{f.last_step}"
    cells = [f"<code>{html.escape(f.rule)}</code>", tensor] + ([str(f.rank)] if ranks else []) + \
        [steps, html.escape(_safe(f.message))]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _has_section(page: _Page, anchor: str) -> bool:
    """Whether the page has the section, with a figure or a table in it (not
    only a line saying why there is none)."""
    return any(s.startswith(f'<section id="{anchor}">') and ("<img " in s or "<table>" in s)
               for s in page.sections)


# -- the charts ---------------------------------------------------------------

def draw_charts(page: _Page, run: Run, stats: Optional[pandas.DataFrame], found: Findings) -> None:
    """The section of the tensors the findings name: a chart each, up to MAX_CHARTS."""
    tensors = found.tensors()
    if not tensors:
        return  # no finding names a tensor: no section
    plt = _pyplot()
    parts = []
    # Kept until the section is on the page: a chart that failed is no link's target.
    charts: Dict[Tuple[str, str], str] = {}
    for i, (kind, name) in enumerate(tensors[:MAX_CHARTS]):
        assert found.result is not None
        mine = [f for f in found.result.findings if (f.kind, f.name) == (kind, name)]
        chart = _chart(plt, page, run, stats, kind, name, mine)
        if chart is None:
            continue
        cid = f"finding-chart-{i}"
        charts[(kind, name)] = cid
        parts.append(f'<div class="finding-chart" id="{cid}"><h3>{html.escape(kind)} {html.escape(_safe(name))}'
                     f'</h3>{chart}<p class="compact"><a href="#findings">back to the findings</a></p></div>')
    if stats is not None and len(tensors) > MAX_CHARTS:
        # Once over the table, not once per tensor: a model's every layer may have a finding.
        have = {(str(k), str(n)) for k, n in stats[["kind", "name"]].drop_duplicates().itertuples(index=False)}
        for kind, name in tensors[MAX_CHARTS:]:
            found.heatmap[(kind, name)] = (kind, name) in have
    more = (f" The first {MAX_CHARTS} of {len(tensors)} tensors are charted; the others' findings link to the "
            "statistics heatmaps." if len(tensors) > MAX_CHARTS else "")
    page.section(CHARTS, "<p>Per rule that found the tensor, the measure it judged over steps: the findings' steps "
                 "shaded, the bound dashed." + more + "</p>" + "".join(parts))
    found.charts.update(charts)


def _chart(plt: Any, page: _Page, run: Run, stats: Optional[pandas.DataFrame], kind: str, name: str,
           findings: List[Finding]) -> Optional[str]:
    by_rule: Dict[str, List[Finding]] = {}
    for f in findings:
        by_rule.setdefault(f.rule, []).append(f)
    ranks = sorted({f.rank for f in findings})
    color = {r: f"C{i % 10}" for i, r in enumerate(ranks)}
    # No layout engine: a third of the time a chart took; the page's PNG is cut to what is drawn.
    fig, axes = plt.subplots(len(by_rule), 1, figsize=(10, 2.6 * len(by_rule)), squeeze=False)
    # Room on the right for the ranks' key, which stays inside the figure.
    fig.subplots_adjust(hspace=0.6 if len(by_rule) > 1 else 0.2, right=0.85 if len(ranks) > 1 else 0.95)
    drawn = False
    for ax, (rule, fs) in zip(axes[:, 0], by_rule.items()):
        lines = set()
        label = ""
        values: List[np.ndarray] = []
        for rank in sorted({f.rank for f in fs}):
            cols = _rows(run, stats, rank, kind, name)
            steps, y, label, bound = _measure(run, rule, cols, rank, kind, name, fs)
            if not len(steps):
                continue
            drawn = True
            values.append(y[np.isfinite(y)])
            ax.plot(steps, y, color=color[rank], linewidth=1.2, marker="." if len(steps) <= 60 else None,
                    markersize=4, label=f"rank {rank}" if len(ranks) > 1 else None)
            for f in fs:
                if f.rank == rank:
                    ax.axvspan(f.first_step - 0.5, f.last_step + 0.5, color=color[rank], alpha=0.15)
            if bound is not None and math.isfinite(bound):
                lines.add(bound)
        for b in sorted(lines):
            ax.axhline(b, color="0.4", linestyle="--", linewidth=1)
        finite = np.concatenate(values) if values else np.empty(0)
        # Log where the measure spans decades and is positive: an RMS of 1e-21, a ratio of 1e20.
        if len(finite) and finite.min() > 0 and (finite.max() / finite.min() >= 1e3 or
                                                 any(b > 0 and (b < finite.min() / 1e3 or b > finite.max() * 1e3)
                                                     for b in lines)):
            ax.set_yscale("log")
        if rule in ("all_zero", "dead_relu"):
            ax.set_ylim(-0.03, 1.03)  # a fraction: where it stands between none and all
        ax.set_title(_text(f"{rule}: {label}"), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if len(ranks) > 1:
            _legend_outside(ax)
    if not drawn:
        plt.close(fig)
        return None
    out = page.figure(fig, f"the findings' measures over steps, {kind}")
    plt.close(fig)
    return out


def _measure(run: Run, rule: str, cols: Dict[str, np.ndarray], rank: int, kind: str, name: str,
             fs: List[Finding]) -> Tuple[np.ndarray, np.ndarray, str, Optional[float]]:
    """(steps, the measure `rule` judged, what it is, the bound to draw)."""
    steps = cols["step"]
    numel = cols["numel"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if rule == "vanishing_gradient":
            return steps, cols["norm"] / np.sqrt(numel), "RMS", fs[0].threshold
        if rule == "exploding_tensor":
            if all(f.threshold == 0 for f in fs):
                return steps, nonfinite(cols).astype(np.float64), \
                    "non-finite values", None
            return steps, np.maximum(np.abs(cols["min"]), np.abs(cols["max"])), "largest |value|", fs[0].threshold
        if rule in ("all_zero", "dead_relu"):
            return steps, cols["zeros"] / numel, "fraction of values zero", fs[0].threshold
        if rule == "saturated_activation":
            derivative = Settings()["saturated_activation"]["derivative"]
            sigmoid, is_input, a = saturation_bounds(name, derivative,
                                                     saturating_function(name, declared_any(run)))
            ms = cols["norm"] ** 2 / numel
            # A sigmoid's output is judged as 2y - 1: its mean square from y's.
            judged = 4 * ms - 4 * cols["mean"] + 1 if sigmoid and not is_input else ms
            return steps, np.sqrt(np.maximum(judged, 0)), "RMS of the value judged (saturated beyond the bound)", a
        if rule == "tensor_variance":
            return steps, cols["std"], "std", None
        if rule == "loss_not_decreasing":
            return steps, cols["mean"], "value", None
        if rule == "weight_update_ratio":
            s, r = _update_ratios(run, rank, name)
            return s, r, "update ratio a step", fs[0].threshold
    # unchanged_tensor: its statistics stay equal; the norm shows it.
    return steps, cols["norm"], "norm", None


def _update_ratios(run: Run, rank: int, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """weight_update_ratio's measure at each recorded step after the first:
    ||w_s' - w_s|| / ||w_s|| / (s' - s)."""
    key = rank if run.ranks else None
    steps: List[int] = []
    ratios: List[float] = []
    for _, at, values in param_records(run, key, [name]):
        prev: Optional[np.ndarray] = None
        prev_step = 0
        for step, x in zip(at, values):
            if x is not None and prev is not None and step > prev_step and x.shape == prev.shape:
                base = float(np.linalg.norm(prev))
                if base > 0 and math.isfinite(base):
                    steps.append(step)
                    ratios.append(float(np.linalg.norm(x - prev)) / base / (step - prev_step))
            if x is not None:
                prev, prev_step = x, step
    return np.array(steps, dtype=np.int64), np.array(ratios)


def _rows(run: Run, stats: Optional[pandas.DataFrame], rank: int, kind: str, name: str) -> Dict[str, np.ndarray]:
    """The tensor's statistics on `rank` in step order: the table's, or
    computed from its records (a rank without one)."""
    if stats is not None:
        sel = stats[(stats["kind"] == kind) & (stats["name"] == name)]
        if run.ranks:
            sel = sel[sel["rank"] == rank]
        if len(sel):
            sel = sel.sort_values("step", kind="stable").drop_duplicates("step", keep="last")
            return {"step": sel["step"].to_numpy(np.int64),
                    **{f: sel[f].to_numpy(np.float64 if f in STATS_REAL else np.int64)
                       for f in STATS_FIELDS}}
    recs = sorted(run._lookup(name, kind).get(rank if run.ranks else None, []), key=lambda r: r["step"])
    rows: Dict[str, List[Any]] = {f: [] for f in ("step",) + tuple(STATS_FIELDS)}
    for rec in recs:
        try:
            row = statistics(run._read(rec, True))[0]
        except (RunError, OSError, ValueError, KeyError):
            continue  # the doctor warned about it
        rows["step"].append(rec["step"])
        for f in STATS_FIELDS:
            rows[f].append(row[f])
    return {f: np.array(v, dtype=np.float64 if f in STATS_REAL else np.int64) for f, v in rows.items()}
