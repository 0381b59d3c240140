"""The health rules, one function each, evaluated a rank at a time: their
definition is the package's docstring (tensortap/_doctor/__init__.py)."""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import groups as groups_
from . import rows as rows_
from . import taps as taps_
from .._base import NONFINITE, _safe
from .._run import Run
# The rules' parameters and findings, where tests and tools look for them.
from .settings import _FLAGS, PARAMETERS, RULES, Settings, parse_sets  # noqa: F401
from .verdict import COLUMNS, Finding, Result, _finding, _Rank, _selected, _selection_problem, _streak_rule, _Verdict, episodes  # noqa: F401


_num = groups_.num
_pct = groups_.pct


# -- episodes -----------------------------------------------------------------


# -- one rank -----------------------------------------------------------------


def _vanishing_gradient(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    idx = _selected(r, p, v)
    if not len(idx):
        return
    c = r.rows.cols
    rms = c["norm"][idx] / np.sqrt(c["numel"][idx].astype(np.float64))
    thr = p["threshold"]
    _streak_rule(r, v, "vanishing_gradient", idx, rms < thr, rms, p["patience"], False, thr,
                 lambda x, i: f"RMS {_num(x)} below {_num(thr)}")


def _exploding_tensor(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    idx = _selected(r, p, v, clean=False)
    if not len(idx):
        return
    v.evaluated = True
    c, bound = r.rows.cols, p["bound"]
    nonfinite = r.nonfinite[idx]
    with np.errstate(invalid="ignore"):
        largest = np.fmax(np.abs(c["min"][idx]), np.abs(c["max"][idx]))
    explodes = nonfinite > 0
    if bound > 0:
        explodes |= largest > bound
    # The rank's evaluated steps, and whether any selected row explodes at each.
    steps = r.rows.step[idx]
    uniq, inverse = np.unique(steps, return_inverse=True)
    at_step = np.zeros(len(uniq), bool)
    np.logical_or.at(at_step, inverse, explodes)
    for a, b, _ in episodes(np.zeros(len(uniq), np.int64), at_step, np.zeros(len(uniq)), 1, True):
        first, last = int(uniq[a]), int(uniq[b])
        inside = (steps >= first) & (steps <= last) & explodes
        # The first exploding row: the first step's, first in the writer's order.
        cand = np.flatnonzero(inside & (steps == first))
        row = int(idx[cand[np.argmin(r.rows.seq[idx[cand]])]])
        series = int(r.rows.series[row])
        mine = inside & (r.rows.series[idx] == series)
        others = len(np.unique(r.rows.series[idx[inside]])) - 1
        counts = nonfinite[mine]
        n = int(c["numel"][row])
        if counts.max() > 0:
            value, threshold = float(counts.max()), 0.0
            w = int(np.argmax(counts))
            wrow = int(idx[np.flatnonzero(mine)[w]])
            parts = [f"{lbl} {int(c[f][wrow])}" for f, lbl in zip(NONFINITE, ("NaN", "+Inf", "-Inf")) if c[f][wrow]]
            what = f"{int(value)} of {n} values non-finite ({', '.join(parts)})"
        else:
            value, threshold = float(largest[mine].max()), bound
            what = f"|x| up to {_num(value)}, above {_num(bound)}"
        tail = f"; then {others} more tensor{'s' if others != 1 else ''}" if others else ""
        v.findings.append(Finding(r.rows.rank, "exploding_tensor", *r.rows.keys[series], first, last, value,
                                  threshold, what + tail))


def _all_zero(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    idx = _selected(r, p, v)
    if not len(idx):
        return
    # A parameter's first row is its initialization: zero on purpose (BatchNorm
    # biases, zero-init gates, LoRA's B) until the first update.
    is_param = np.array([k == "param" for k, _ in r.rows.keys], dtype=bool)
    idx = idx[~(is_param[r.rows.series[idx]] & (r.pos[idx] == 0))]
    c = r.rows.cols
    frac = c["zeros"][idx] / c["numel"][idx]
    _streak_rule(r, v, "all_zero", idx, c["zeros"][idx] == c["numel"][idx], frac, p["patience"], True, 1.0,
                 lambda x, i: f"all {int(c['numel'][i])} values zero")
    if not len(idx) and not v.why:
        v.why = "no tensor it judges has a row past a parameter's first"


def _grad_rows(r: _Rank) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    """{name: (steps, norms)} of the rank's grad rows with elements, by step; a
    row with a NaN or infinity counts as a gradient that is not zero."""
    out = {}
    c = r.rows.cols
    for sid, (kind, name) in enumerate(r.rows.keys):
        if kind != "grad":
            continue
        lo = np.searchsorted(r.rows.series, sid, "left")
        hi = np.searchsorted(r.rows.series, sid, "right")
        sl = slice(lo, hi)
        keep = c["numel"][sl] > 0
        norms = np.where(r.nonfinite[sl] > 0, np.inf, c["norm"][sl])
        out[name] = (r.rows.step[sl][keep], norms[keep])
    return out


def _last_grad(grads: Dict[str, Tuple[np.ndarray, np.ndarray]], name: str, lo: np.ndarray,
               hi: np.ndarray) -> np.ndarray:
    """Per pair of steps [lo, hi): the norm of `name`'s last grad row in it, NaN without one."""
    if name not in grads:
        return np.full(len(lo), np.nan)
    steps, norms = grads[name]
    j = np.searchsorted(steps, hi, "left") - 1
    ok = (j >= 0) & (steps[np.maximum(j, 0)] >= lo) if len(steps) else np.zeros(len(lo), bool)
    return np.where(ok, norms[np.maximum(j, 0)] if len(steps) else np.nan, np.nan)


def _unchanged_tensor(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    idx = _selected(r, p, v, ("param",))
    if not len(idx):
        return
    grads = _grad_rows(r)
    if not grads:
        v.why = "needs kind grad (to tell a frozen parameter); record it with kinds"
        return
    # An evaluation compares a row with the previous row of its series.
    idx = idx[r.pos[idx] > 0]
    prev = idx - 1
    keep = r.clean[prev]
    idx, prev = idx[keep], prev[keep]
    if not len(idx):
        v.why = "no parameter has two rows"
        return
    c = r.rows.cols
    same = np.ones(len(idx), bool)
    for f in rows_.STATS_FIELDS:
        same &= c[f][idx] == c[f][prev]
    gnorm = np.full(len(idx), np.nan)
    for sid in np.unique(r.rows.series[idx]).tolist():
        at = np.flatnonzero(r.rows.series[idx] == sid)
        gnorm[at] = _last_grad(grads, r.rows.keys[sid][1], r.rows.step[prev[at]], r.rows.step[idx[at]])
    cond = same & (gnorm > 0)
    _streak_rule(r, v, "unchanged_tensor", idx, cond, np.nan_to_num(gnorm, nan=0.0), p["num_steps"] - 1, True, 0.0,
                 lambda x, i: f"statistics unchanged while its gradient is not zero (norm up to {_num(x)})",
                 first_step=r.rows.step[prev])


def _loss_not_decreasing(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    name, w = p["name"], p["window"]
    sids = [i for i, key in enumerate(r.rows.keys) if key == ("tensor", name)]
    if not sids:
        v.why = f"no tensor named {name!r} (--set loss_not_decreasing.name=NAME)"
        return
    mask = np.zeros(len(r.rows.keys), bool)
    mask[sids] = True
    idx = r.rows_of(mask)
    vals = r.rows.cols["mean"][idx]
    n = len(vals)
    if n < 2 * w:
        v.why = f"needs 2 x window = {2 * w} values of tensor {name!r}; it has {n}"
        return
    v.evaluated = True
    # Whole windows, as smdebug checks every num_steps: the k-th window's mean
    # is evaluated against the (k-1)-th's once it is complete, k >= 2.
    k = n // w
    means = vals[:k * w].reshape(k, w).mean(axis=1)
    lowest = np.minimum.accumulate(means)
    first = float(means[0])
    a_mean, b_mean = means[1:], means[:-1]
    scale = np.abs(b_mean)
    decrease = np.divide(b_mean - a_mean, scale, out=np.zeros(k - 1), where=scale > 0)
    cond = (b_mean - a_mean <= p["min_decrease"] * scale) & (lowest[1:] > first - p["min_progress"] * abs(first))
    ends = np.arange(2, k + 1) * w - 1             # the last value of each window evaluated
    sub = idx[ends]
    md, mp = p["min_decrease"], p["min_progress"]

    def say(x: float, i: int) -> str:
        change = f"fell {_pct(x)}" if x >= 0 else f"rose {_pct(-x)}"
        return (f"the mean of {w} values {change} against the {w} before (needs to fall more than {_pct(md)}), "
                f"and never {_pct(mp)} below the first {w}'s mean {_num(first)}")

    _streak_rule(r, v, "loss_not_decreasing", sub, cond, decrease, 1, False, md, say)


_INPUT = re.compile(r"_input(#\d+)?$", _FLAGS)


def _dead_relu(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    # A ReLU's input (`relu1_input`) is matched by "relu" too, but its zeros
    # say nothing about dead units: only outputs are judged.
    mask = r.by_function(p["include"], (taps_.RELU,)) & \
        np.array([_INPUT.search(n) is None for _, n in r.rows.keys], dtype=bool)
    # Neither declared nor named: a tap whose statistics are a ReLU's output's
    # is judged too, the inference said in its findings.
    notes = taps_.inferred_relus(r.rows, taps_.candidates_for_inference(r.rows, mask, r.taps), r.clean)
    mask[list(notes)] = True
    idx = _selected(r, p, v, ("activation",), mask, hint="name the ReLU's taps so (e.g. relu1), or declare their "
                    "nonlinearity (run.json \"taps\")")
    if not len(idx):
        return
    c = r.rows.cols
    frac = c["zeros"][idx] / c["numel"][idx]
    thr = p["threshold"]

    def say(x: float, i: int) -> str:
        note = notes.get(int(r.rows.series[i]))
        return f"{_pct(x)} of values zero, above {_pct(thr)}" + (f" {note}" if note else "")

    _streak_rule(r, v, "dead_relu", idx, frac > thr, frac, p["patience"], True, thr, say)


def saturation_bounds(name: str, derivative: float, function: Optional[str] = None) -> Tuple[bool, bool, float]:
    """(sigmoid?, an input?, the bound on the judged value) of a selected
    activation; `function` the tap's declared one ("tanh", "sigmoid"), else
    the name tells."""
    sigmoid = function == "sigmoid" if function is not None else "sigmoid" in name.lower()
    is_input = _INPUT.search(name) is not None
    t = math.sqrt(1.0 - derivative)
    return sigmoid, is_input, (2 * math.atanh(t) if sigmoid else math.atanh(t)) if is_input else t


def saturation_measure(name: str, derivative: float, function: Optional[str] = None
                       ) -> Callable[[np.ndarray], float]:
    """The exact saturated fraction of a record's values (all finite)."""
    sigmoid, is_input, a = saturation_bounds(name, derivative, function)

    def fraction(x: np.ndarray) -> float:
        judged = 2 * x - 1 if sigmoid and not is_input else x
        return float(np.count_nonzero(np.abs(judged) > a)) / x.size

    return fraction


def _saturated_activation(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    idx = _selected(r, p, v, ("activation",), r.by_function(p["include"], taps_.SATURATING),
                    hint="name the taps so (e.g. tanh1, and tanh1_input for its input), or declare their "
                    "nonlinearity (run.json \"taps\")")
    if not len(idx):
        return
    c = r.rows.cols
    exact = r.rows.source == "records"
    frac = np.zeros(len(idx))
    for sid in np.unique(r.rows.series[idx]).tolist():
        at = np.flatnonzero(r.rows.series[idx] == sid)
        rows = idx[at]
        if exact and r.rows.measure is not None:
            frac[at] = r.rows.measure[rows]
            continue
        name = r.rows.keys[sid][1]
        sigmoid, is_input, a = saturation_bounds(name, p["derivative"], taps_.saturating_function(name, r.taps))
        ms = (c["norm"][rows] ** 2) / c["numel"][rows]
        lo, hi = c["min"][rows], c["max"][rows]
        if sigmoid and not is_input:
            ms, lo, hi = 4 * ms - 4 * c["mean"][rows] + 1, 2 * lo - 1, 2 * hi - 1
        top = np.maximum(np.abs(lo), np.abs(hi))
        room = top * top - a * a
        bound = np.divide(ms - a * a, room, out=np.zeros(len(rows)), where=room > 0)
        frac[at] = np.clip(bound, 0.0, 1.0)
    thr = p["threshold"]
    how = "" if exact else "at least "
    tail = "" if exact else " (a bound from the statistics)"
    _streak_rule(r, v, "saturated_activation", idx, frac > thr, frac, p["patience"], True, thr,
                 lambda x, i: f"{how}{_pct(x)} of values saturated (derivative below {_pct(p['derivative'])} of "
                              f"its peak), above {_pct(thr)}{tail}")


def _tensor_variance(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    idx = _selected(r, p, v)
    if not len(idx):
        return
    w, factor = p["window"], p["factor"]
    need = min(w, 3)
    # A tensor's clean rows in order: its own history, rows with NaN left out.
    sid = r.rows.series[idx]
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    pos = np.arange(len(idx)) - np.repeat(starts, np.diff(np.r_[starts, len(idx)]))
    std = r.rows.cols["std"][idx]
    evals = np.flatnonzero(pos >= need)
    if not len(evals):
        v.why = f"needs {need + 1} evaluations of a tensor; the most is {int(pos.max()) + 1}"
        return
    median = np.empty(len(evals))
    depth = np.minimum(pos[evals], w)
    # Grouped by how many earlier values there are, each group one vectorized
    # median: at most `window` groups, chunked to bound the memory.
    for d in np.unique(depth).tolist():
        at = np.flatnonzero(depth == d)
        for lo in range(0, len(at), max(1, 4_000_000 // d)):
            part = at[lo:lo + max(1, 4_000_000 // d)]
            rows = evals[part][:, None] - np.arange(1, d + 1)[None, :]
            median[part] = np.median(std[rows], axis=1)
    ok = median > 0
    evals, median = evals[ok], median[ok]
    ratio = std[evals] / median
    cond = (ratio > factor) | (ratio < 1 / factor)
    # The extreme is the ratio farthest from 1, either way: compared in log.
    spread = np.abs(np.log(np.where(ratio > 0, ratio, np.finfo(float).tiny)))
    sub = idx[evals]
    v.evaluated = True
    for a, b, _ in episodes(r.rows.series[sub], cond, spread, 1, True):
        held = np.arange(a, b + 1)
        held = held[cond[held]]
        k = held[np.argmax(spread[held])]
        x = float(ratio[k])
        threshold = factor if x > 1 else 1 / factor
        msg = (f"std {_num(float(std[evals[k]]))} is {_num(x)}x the median {_num(float(median[k]))} of its last "
               f"{min(w, int(pos[evals[k]]))} evaluations ({'above' if x > 1 else 'below'} {_num(threshold)}x)")
        v.findings.append(_finding(r, "tensor_variance", int(sub[a]), int(sub[b]), x, threshold, msg))


def _first_step_spread(r: _Rank, mask: np.ndarray) -> Tuple[int, np.ndarray, np.ndarray]:
    """(the first step with a row of `mask`'s series, its rows there with std > 0, their std)."""
    idx = r.rows_of(mask)
    if not len(idx):
        return -1, idx, np.zeros(0)
    first = int(r.rows.step[idx].min())
    at = idx[r.rows.step[idx] == first]
    std = r.rows.cols["std"][at]
    return first, at[std > 0], std[std > 0]


def _poor_weight_initialization(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    first, at, std = _first_step_spread(r, r.series_mask(("activation",), p["include"]))
    tail = ""
    if len(at) < 2:
        # Without the inputs tapped by the convention, the outputs of the
        # nonlinearities declared (run.json "taps") or inferred as ReLUs: a
        # ReLU's output scales with its input's (ReLU is positively
        # homogeneous), and a tanh's or sigmoid's collapses with a tiny input.
        outputs = taps_.declared_mask(r.rows, r.taps, (taps_.RELU,) + taps_.SATURATING) & \
            np.array([not taps_.is_input(n) for _, n in r.rows.keys], dtype=bool)
        outputs[list(taps_.inferred_relus(r.rows, taps_.candidates_for_inference(r.rows, outputs, r.taps),
                                          r.clean))] = True
        f2, at2, std2 = _first_step_spread(r, outputs)
        if len(at2) >= 2:
            first, at, std = f2, at2, std2
            tail = " (the nonlinearities' outputs: declared, or ReLUs inferred)"
    if first < 0:
        v.why = _selection_problem(r, ("activation",), p["include"], "tap the inputs of the nonlinearities as "
                                   "<name>_input (e.g. relu1_input), or declare their nonlinearity (run.json "
                                   "\"taps\")")
        return
    if len(at) < 2:
        v.why = (f"needs two activations matching {p['include'].pattern!r} with std > 0 at its first step "
                 f"({first}); there {'is' if len(at) == 1 else 'are'} {len(at)}")
        return
    v.evaluated = True
    lo, hi = int(np.argmin(std)), int(np.argmax(std))
    ratio = float(std[hi] / std[lo])
    if ratio > p["threshold"]:
        names = [r.rows.keys[int(r.rows.series[at[k]])][1] for k in (lo, hi)]
        v.findings.append(Finding(
            r.rows.rank, "poor_weight_initialization", None, None, first, first, ratio, p["threshold"],
            f"std spans {_num(float(std[lo]))} ({_safe(names[0])}) to {_num(float(std[hi]))} ({_safe(names[1])}) "
            f"across {len(at)} activations{tail}: {_num(ratio)}x, above {_num(p['threshold'])}x"))


def _weight_update_ratio(r: _Rank, p: Dict[str, Any], v: _Verdict, run: Run) -> None:
    include = p["include"]
    names = [n for n in run.names("param") if include.search(n)]
    grads = _grad_rows(r)
    pairs: List[Tuple[str, int, int, float]] = []  # name, s, s', r
    recorded = False
    for name, steps, values in rows_.param_records(run, r.rows.key, names):
        recorded = True
        prev: Optional[np.ndarray] = None
        prev_step = 0
        for step, x in zip(steps, values):
            if x is not None and prev is not None and step > prev_step and x.shape == prev.shape \
                    and np.isfinite(x).all():
                base = float(np.linalg.norm(prev))
                if base > 0 and math.isfinite(base):
                    pairs.append((name, prev_step, step, float(np.linalg.norm(x - prev)) / base / (step - prev_step)))
            if x is not None:
                prev, prev_step = (x if np.isfinite(x).all() else None), step
    if not pairs:
        if not recorded:
            if run.names("param"):
                v.why = f"no param name matches {include.pattern!r}"
            elif "param" in {k for k, _ in r.rows.keys}:
                v.why = ("needs full param records at two steps or more; the run has param statistics only "
                         "(record param with every)")
            else:
                v.why = "needs full param records at two steps or more; record kind param with kinds and every"
        else:
            v.why = "no parameter has full records at two steps with a norm > 0"
        return
    v.evaluated = True
    names_arr = sorted({n for n, *_ in pairs})
    code = {n: i for i, n in enumerate(names_arr)}
    pairs.sort(key=lambda t: (code[t[0]], t[2]))
    sid = np.array([code[n] for n, *_ in pairs], dtype=np.int64)
    s0 = np.array([t[1] for t in pairs], dtype=np.int64)
    s1 = np.array([t[2] for t in pairs], dtype=np.int64)
    ratio = np.array([t[3] for t in pairs])
    moving = np.zeros(len(pairs), bool)
    for n, i in code.items():
        at = np.flatnonzero(sid == i)
        moving[at] = _last_grad(grads, n, s0[at], s1[at]) > 0
    large, small = p["large"], p["small"]
    for cond, largest, thr, word in ((ratio > large, True, large, "above"),
                                     ((ratio < small) & moving, False, small, "below")):
        for a, b, value in episodes(sid, cond, ratio, p["patience"], largest):
            v.findings.append(Finding(r.rows.rank, "weight_update_ratio", "param", names_arr[int(sid[a])],
                                      int(s0[a]), int(s1[b]), value, thr,
                                      f"update ratio {_num(value)} a step, {word} {_num(thr)}"))


# -- the run ------------------------------------------------------------------


