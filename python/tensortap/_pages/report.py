"""`tensortap report RUN`: one self-contained HTML page about a run
(`tensortap diff A B --html OUT`'s page about two is diff_page.py; the
frame both share, _page.py; this page's flight recorder section,
_report_dumps.py; its findings and their charts, _report_findings.py).

Every figure is a PNG inside the page (data: URLs) and the data behind the
tables is in it as JSON: the file opens from disk, with no network. Sections:
first the findings of the training health rules (`tensortap doctor`'s), each
linked to a chart of its tensor; the summary `inspect` prints, the scalars
(every 0-d `tensor` record series, such as the loss) over steps, gradient
norms per parameter over steps, activation histograms at chosen steps,
heatmaps of log10 norm (names x steps) per kind, the charts of the tensors
with findings, the flight recorder's dumps with the steps before each, and
the requests of `tensortap ctl` (_report_ctl.py). A multi-rank run shows its
ranks side by side in every figure (one line per rank in the scalars'
charts). Every legend is drawn outside its axes, so that it covers no curve.

Figures are drawn with matplotlib (python3-matplotlib); statistics come from
the run's statistics table when it has one (Options::stats_every), and are
otherwise computed from the records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import html
import io
import math
import os

import numpy as np

from .._base import RunError, _safe
from .._optional import progress
from .frame import _bins, _jsonable, _legend_outside, _Page, _pyplot, _span, _text, _write_page
from .ctl import HEADING as ctl_heading
from .ctl import section as ctl_section
from .dumps import _dumps
from .findings import data as findings_data
from .findings import draw_charts, evaluate_findings
from .findings import section as findings_section
from .._views.summary import summarize

if TYPE_CHECKING:
    from .._run import Run

# Enough lines to see the spread; the rest are drawn faint, unlabeled.
LABELED_LINES = 8
# A heatmap taller than this many names shows every k-th label.
HEATMAP_LABELS = 40
# Ranks drawn side by side; a larger run shows the first ones and says so.
MAX_RANK_PANELS = 8
# Scalar series charted (sorted by name); a run with more says so.
MAX_SCALAR_CHARTS = 30
# Charts per row in the scalars' grid.
SCALAR_COLUMNS = 3
# Fewer points than this are drawn with markers too: a finite value between
# two gaps is then still seen.
SCALAR_MARKERS = 60


def write_report(run: Run, out_path: Union[str, "os.PathLike[str]"], steps: Optional[Sequence[int]] = None,
                 histograms: int = 6, title: Optional[str] = None) -> str:
    """Writes the page for `run` to `out_path`. `steps`: the steps whose
    activation histograms are drawn (default: first, middle, last);
    `histograms`: at most this many activations get one."""
    page = _Page(title or f"tensortap report: {_safe(run.path)}")
    found = evaluate_findings(run)
    text = io.StringIO()
    summarize(run, out=text)
    page.section("Summary", f"<pre>{html.escape(text.getvalue())}</pre>")

    stats = _stats(run)
    scalars: List[Any] = []  # a summary per scalar series, for the page's data
    # A figure that cannot be drawn costs its section, not the page.
    for heading, draw in (("Scalars", lambda: _scalars(page, run, scalars)),
                          ("Gradient norms per parameter", lambda: _grad_norms(page, run, stats)),
                          ("Activation histograms", lambda: _histograms(page, run, steps, histograms)),
                          ("Statistics heatmaps", lambda: _heatmaps(page, run, stats)),
                          ("Tensors with findings", lambda: draw_charts(page, run, stats, found)),
                          ("Flight recorder dumps", lambda: _dumps(page, run, stats)),
                          (ctl_heading, lambda: ctl_section(page, run))):
        try:
            draw()
        except ImportError:
            raise
        except Exception as e:  # noqa: BLE001 - reported in the page
            page.section(heading, f"<p>This section could not be drawn: {html.escape(_safe(f'{type(e).__name__}: {e}'))}</p>")
    if len(_ranks(run)) > MAX_RANK_PANELS:
        page.note(f"The run has {len(run.ranks)} ranks; figures show ranks {run.ranks[0]}..{run.ranks[MAX_RANK_PANELS - 1]}.")
    # Last, and made the first section: it links only to what the page holds.
    findings_section(page, found)
    page.data = _jsonable({"run": run.path, "ranks": run.ranks, "records": len(run.records), "kinds": run.kinds(),
                           "dumps": run.dumps, "scalars": scalars, "findings": findings_data(found)})
    return _write_page(page.render(), out_path)


# -- data ----------------------------------------------------------------

def _stats(run):
    """The statistics frame, or None for a run without statistics."""
    try:
        return run.stats_frame()
    except RunError:
        return None


def _ranks(run):
    return run.ranks if run.ranks else [None]


def _panel_ranks(run):
    return _ranks(run)[:MAX_RANK_PANELS]


def _norm_series(run, stats, kind, rank):
    """{name: (steps, norms)} of `kind` on `rank`: from the statistics table, or
    from the records when the run has none."""
    out = {}
    if stats is not None:
        rows = stats[stats["kind"] == kind]
        if rank is not None:
            rows = rows[rows["rank"] == rank]
        for name, g in rows.groupby("name", observed=True, sort=True):
            out[str(name)] = (g["step"].to_numpy(), g["norm"].to_numpy(dtype=np.float64))
        if out:
            return out
    names = run.names(kind)
    recs = [r for n in names for r in run._lookup(n, kind).get(rank, [])]
    norms: Dict[str, List[Tuple[int, float]]] = {}
    for rec in progress(recs, desc=f"{kind} norms"):
        a = np.asarray(run._read(rec, mmap=True), dtype=np.float64)
        finite = a[np.isfinite(a)]
        norms.setdefault(rec["name"], []).append((rec["step"], float(np.sqrt(np.sum(finite * finite)))))
    for name, pairs in norms.items():
        pairs.sort()
        out[name] = (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    return out


# -- figures -------------------------------------------------------------

def _width(cols):
    return max(10.0, 6.5 * cols)


def _columns(run):
    """Titles of the side-by-side panels: one per rank."""
    return [("" if r is None else f"rank {r}", r) for r in _panel_ranks(run)]


def _scalar_names(run):
    """The names of the `tensor` series whose every record is 0-d (a loss,
    a learning rate, an accuracy): the series drawn as curves."""
    out = []
    for name in run.names("tensor"):
        by_rank = run._lookup(name, "tensor")
        if by_rank and all(not rec["shape"] for recs in by_rank.values() for rec in recs):
            out.append(name)
    return out


def _scalars(page, run, summary):
    """Every scalar series over steps: a chart per series in a grid, a line
    per rank. Non-finite values are gaps in the line, marked under it with
    an x, and listed under the figure; `summary` gets a dict per series and
    rank for the page's data."""
    names = _scalar_names(run)
    if not names:
        page.section("Scalars", "<p>No scalar records (0-d <code>tensor</code> records, such as a loss).</p>")
        return
    shown = names[:MAX_SCALAR_CHARTS]
    ranks = _panel_ranks(run)
    color = {r: f"C{i % 10}" for i, r in enumerate(ranks)}
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ncols = min(SCALAR_COLUMNS, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    chart_width = {1: 10.0, 2: 6.5}.get(ncols, 4.6)
    fig, axes = plt.subplots(nrows, ncols, figsize=(chart_width * ncols, 3.0 * nrows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    notes, failed, drawn_ranks, any_bad = [], [], set(), False
    for ax, name in zip(axes.flat, progress(shown, desc="scalars", minimum=10)):
        by_rank = run._lookup(name, "tensor")
        bad_here = 0
        finite_parts = []
        for rank in ranks:
            recs = by_rank.get(rank)
            if not recs:
                continue
            try:
                values = _values(run.series(name, kind="tensor", rank=rank))
            except Exception as e:  # noqa: BLE001 - reported in the page
                failed.append((name, rank, f"{type(e).__name__}: {e}"))
                continue
            steps = np.array([rec["step"] for rec in recs])
            finite = np.isfinite(values)
            entry, note = _scalar_line(ax, name, rank, steps, values, color[rank])
            drawn_ranks.add(rank)
            finite_parts.append(values[finite])
            if note is not None:
                bad_here += int((~finite).sum())
                any_bad = True
                notes.append(note)
            summary.append(entry)
        finite_all = np.concatenate(finite_parts) if finite_parts else np.empty(0)
        if not len(finite_all):
            ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
        elif finite_all.min() > 0 and finite_all.max() / finite_all.min() >= 1e3:
            ax.set_yscale("log")  # a loss that falls by decades
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(_text(name) + (f"  ({bad_here} non-finite: gaps)" if bad_here else ""), fontsize=9)
    handles = [Line2D([], [], color=color[r], linewidth=1.3, label=f"rank {r}")
               for r in ranks if r is not None and r in drawn_ranks]
    if len(handles) < 2:
        handles = []  # one line per chart needs no key
    if any_bad:
        handles.append(Line2D([], [], linestyle="none", marker="x", color="tab:red", label="non-finite (gap)"))
    if handles:
        _legend_outside(axes[0][ncols - 1], handles=handles)
    body = ("<p>Every 0-d <code>tensor</code> record series over steps"
            + (", one line per rank" if len(drawn_ranks) > 1 else "") + "."
            + (f" The first {len(shown)} of {len(names)} series, by name." if len(names) > len(shown) else "")
            + "</p>" + page.figure(fig, "scalars over steps"))
    plt.close(fig)
    if notes:
        body += ("<p>Non-finite values are not drawn: they are gaps in the line, marked \u00d7 on the step "
                 "axis.</p><ul>" + "".join(notes) + "</ul>")
    if failed:
        body += "<p>Not read:</p><ul>" + "".join(
            f"<li><code>{html.escape(_safe(n))}</code>{'' if r is None else f' (rank {r})'}: "
            f"{html.escape(_safe(e))}</li>" for n, r, e in failed) + "</ul>"
    page.section("Scalars", body)


def _scalar_line(ax, name, rank, steps, values, color):
    """One rank's line on a scalar's chart, its non-finite values gaps in
    it, marked under them: (the series' dict for the page's data, the line
    of the list under the figure naming its non-finite values, None where
    all are finite)."""
    finite = np.isfinite(values)
    # NaN where the value is not finite: matplotlib breaks the line there.
    ax.plot(steps, np.where(finite, values, np.nan), color=color, linewidth=1.3,
            marker="." if len(values) <= SCALAR_MARKERS else None, markersize=4)
    bad = ~finite
    nan, posinf = int(np.isnan(values).sum()), int((values == np.inf).sum())
    neginf = int((values == -np.inf).sum())
    entry = {"name": name, "rank": rank, "points": int(len(values)),
             "first_step": int(steps[0]), "last_step": int(steps[-1]),
             "last": float(values[-1]), "nan": nan, "posinf": posinf, "neginf": neginf}
    if not bad.any():
        return entry, None
    # Marked on the step axis, under the gap.
    ax.plot(steps[bad], np.zeros(int(bad.sum())), linestyle="none", marker="x", markersize=5,
            color="tab:red", transform=ax.get_xaxis_transform(), clip_on=False)
    entry["first_nonfinite_step"] = int(steps[bad][0])
    kinds = ", ".join(f"{label} {n}" for label, n in (("NaN", nan), ("+inf", posinf), ("-inf", neginf)) if n)
    where = "" if rank is None else f" (rank {rank})"
    return entry, (f"<li><code>{html.escape(_safe(name))}</code>{where}: {int(bad.sum())} of "
                   f"{len(values)} ({kinds}), the first at step {int(steps[bad][0])}</li>")


def _grad_norms(page, run, stats):
    if "grad" not in run.kinds() and (stats is None or not (stats["kind"] == "grad").any()):
        page.section("Gradient norms", "<p>No gradients were captured (kind <code>grad</code>).</p>")
        return
    plt = _pyplot()
    from matplotlib.collections import LineCollection

    cols = _columns(run)
    fig, axes = plt.subplots(1, len(cols), figsize=(_width(len(cols)), 4.2 if len(cols) == 1 else 5.6),
                             squeeze=False, sharey=True, layout="constrained")
    for ax, (label, rank) in zip(axes[0], cols):
        series = _norm_series(run, stats, "grad", rank)
        # The largest final norms are labeled; the others form a faint band.
        order = sorted(series, key=lambda n: -np.nanmax(series[n][1]) if len(series[n][1]) else 0)
        faint = [np.column_stack(series[n]) for n in order[LABELED_LINES:] if len(series[n][0])]
        if faint:
            ax.add_collection(LineCollection(faint, colors="0.75", linewidths=0.6))
        for name in order[:LABELED_LINES]:
            ax.plot(*series[name], linewidth=1.3, label=_text(name))
        ax.set_yscale("log")
        ax.autoscale()
        ax.set_xlabel("step")
        ax.set_title(f"{label}  ({len(series)} parameters)".strip(), fontsize=10)
        if order:
            # Outside the axes: a transformer's dozens of names covered the curves.
            _legend_outside(ax, below=len(cols) > 1, title=None if len(order) <= LABELED_LINES
                            else f"largest {LABELED_LINES} of {len(order)}", title_fontsize=7)
    axes[0][0].set_ylabel("L2 norm of the gradient")
    page.section("Gradient norms per parameter", page.figure(fig, "gradient norms per parameter over steps"))
    plt.close(fig)


def _histogram_steps(run, names, steps):
    have = sorted({rec["step"] for n in names for rs in run._lookup(n, "activation").values() for rec in rs})
    if steps:
        return [s for s in steps if s in have], have
    if not have:
        return [], have
    return sorted({have[0], have[len(have) // 2], have[-1]}), have


def _histograms(page, run, steps, limit):
    names = run.names("activation")
    if not names:
        page.section("Activation histograms", "<p>No activations were captured.</p>")
        return
    if limit <= 0:
        page.section("Activation histograms", "<p>Not asked for (<code>--histograms 0</code>).</p>")
        return
    shown = names[:limit]
    chosen, have = _histogram_steps(run, shown, steps)
    if not chosen:
        page.section("Activation histograms", f"<p>None of the steps asked for ({html.escape(str(steps))}) has "
                     f"activations; steps with activations: {html.escape(_span(have))}.</p>")
        return
    plt = _pyplot()
    from matplotlib.lines import Line2D

    cols = _columns(run)
    fig, axes = plt.subplots(len(shown), len(cols), figsize=(_width(len(cols)), 2.1 * len(shown)), squeeze=False,
                             layout="constrained")
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(chosen)))
    color_of = {s: tuple(c) for s, c in zip(chosen, colors)}  # a step's colour in every panel
    for i, name in enumerate(progress(shown, desc="histograms", minimum=10)):
        for j, (label, rank) in enumerate(cols):
            ax = axes[i][j]
            by_step = {rec["step"]: rec for rec in run._lookup(name, "activation").get(rank, [])}
            arrays = [(s, _values(run._read(by_step[s], mmap=True))) for s in chosen if s in by_step]
            finite = [a[np.isfinite(a)] for _, a in arrays]
            if not any(len(a) for a in finite):
                ax.text(0.5, 0.5, "not captured at these steps", ha="center", va="center", transform=ax.transAxes)
            else:
                lo = min(a.min() for a in finite if len(a))
                hi = max(a.max() for a in finite if len(a))
                bins = _bins(lo, hi)
                for (s, _), a in zip(arrays, finite):
                    ax.hist(a, bins=bins, histtype="step", color=color_of[s], log=True)
            ax.set_title(_text(f"{name}  {label}".strip()), fontsize=9)
    # One key for every panel, beside the top right one.
    _legend_outside(axes[0][-1], handles=[Line2D([], [], color=color_of[s], label=f"step {s}") for s in chosen])
    more = f" (the first {limit} of {len(names)} names)" if len(names) > limit else ""
    page.section("Activation histograms",
                 f"<p>Steps {html.escape(', '.join(map(str, chosen)))}{more}; log counts.</p>"
                 + page.figure(fig, "activation histograms at chosen steps"))
    plt.close(fig)


def _values(a):
    """A record's values as float64 for a histogram: magnitudes if complex."""
    a = np.asarray(a)
    if np.iscomplexobj(a):
        a = np.abs(a)
    return a.astype(np.float64, copy=False).ravel()


def _heatmaps(page, run, stats):
    if stats is None:
        page.section("Statistics heatmaps", "<p>The run has no statistics table "
                     "(<code>Options::stats_every</code>); the heatmaps are drawn from it.</p>")
        return
    plt = _pyplot()
    parts = []
    cols = _columns(run)
    for kind in [k for k in stats["kind"].cat.categories if (stats["kind"] == k).any()]:
        rows = stats[stats["kind"] == kind]
        if run.ranks:
            rows = rows[rows["rank"].isin(_panel_ranks(run))]
        names = sorted(rows["name"].unique().astype(str))
        steps = np.sort(rows["step"].unique())
        height = min(12.0, 1.6 + 0.16 * len(names))
        fig, axes = plt.subplots(1, len(cols), figsize=(_width(len(cols)), height), squeeze=False)
        row_of = {n: i for i, n in enumerate(names)}
        for ax, (label, rank) in zip(axes[0], cols):
            part = rows if rank is None else rows[rows["rank"] == rank]
            grid = np.full((len(names), len(steps)), np.nan)
            r = np.array([row_of[str(n)] for n in part["name"]], dtype=np.int64)
            c = np.searchsorted(steps, part["step"].to_numpy())
            with np.errstate(divide="ignore"):
                grid[r, c] = np.log10(part["norm"].to_numpy(dtype=np.float64))
            grid[~np.isfinite(grid)] = np.nan
            # A column per step taken, labelled with its step: steps need
            # not be evenly spaced.
            im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
            every = max(1, math.ceil(len(names) / HEATMAP_LABELS))
            ax.set_yticks(range(0, len(names), every))
            ax.set_yticklabels([_text(n) for n in names[::every]], fontsize=7)
            ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 8)).round().astype(int))
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(steps[t]) for t in ticks])
            ax.set_xlabel("step")
            ax.set_title(f"{kind}: log10 L2 norm  {label}".strip(), fontsize=10)
            fig.colorbar(im, ax=ax, fraction=0.04)
        fig.tight_layout()
        parts.append(page.figure(fig, f"heatmap of log10 norm, {kind}, names by steps"))
        plt.close(fig)
    page.section("Statistics heatmaps", "<p>log10 of each tensor's L2 norm; blank where not taken or zero.</p>"
                 + "".join(parts))
