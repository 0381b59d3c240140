"""What a rule finds (Finding, Result: the doctor's rows and columns), a
rank's rows as the rules read them (_Rank), and the shapes rules share:
episodes of a condition, a selection that matched nothing."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

from . import groups as groups_
from . import taps as taps_
from .._base import KINDS, _safe, nonfinite
from .rows import Rows
from .._pattern import Pattern

COLUMNS = ("rank", "rule", "kind", "name", "first_step", "last_step", "value", "threshold", "message", "group")


@dataclass
class Finding:
    rank: int
    rule: str
    kind: Optional[str]
    name: Optional[str]
    first_step: int
    last_step: int
    value: float
    threshold: float
    message: str
    group: int = -1
    """The place of its group in the output (tensortap/_doctor_groups.py): 0 holds the likely cause."""

    def line(self, ranks: bool) -> str:
        """The command's line: `<rule>: <kind> <name>[ rank <r>] steps <first>..<last>: <message>`."""
        where = f"{self.kind or '-'} {_safe(self.name) if self.name is not None else '-'}"
        if ranks:
            where += f" rank {self.rank}"
        return f"{self.rule}: {where} steps {self.first_step}..{self.last_step}: {self.message}"

    def json(self) -> str:
        """The --json line: the frame's columns; a value that is not finite is null."""
        d = {c: getattr(self, c) for c in COLUMNS}
        for c in ("value", "threshold"):
            if not math.isfinite(d[c]):
                d[c] = None
        return json.dumps(d)


@dataclass
class Result:
    findings: List[Finding]
    not_evaluated: Dict[str, str]
    """{rule: why} for each rule no rank could evaluate, in RULES' order."""
    sources: Dict[int, str]
    """{rank: "statistics" | "records"}: where each rank's rows came from."""
    ranks: bool
    """Whether the run has several ranks (the lines name them)."""
    groups: List[List[Finding]] = field(default_factory=list)
    """The findings grouped, causes first (tensortap/_doctor_groups.py); `findings` is them in this order."""
    positions: groups_.Position = field(default_factory=dict)
    """(rank, kind, name) -> its place in the model, for the order."""


def episodes(sid: np.ndarray, cond: np.ndarray, measure: np.ndarray, patience: int,
             largest: bool) -> List[Tuple[int, int, float]]:
    """The episodes (module docstring) over evaluations sorted by series then
    step: (index of the first evaluation, of the last where `cond` held, the
    most extreme `measure` where it held). Runs of `cond` are found
    vectorized; only runs are walked in Python."""
    held = np.flatnonzero(cond)
    if len(held) == 0:
        return []
    new = np.ones(len(held), bool)
    new[1:] = (np.diff(held) != 1) | (sid[held[1:]] != sid[held[:-1]])
    at = np.flatnonzero(new)
    starts, ends = held[at], held[np.r_[at[1:] - 1, len(held) - 1]]
    vals = measure[held]
    extremes = np.maximum.reduceat(vals, at) if largest else np.minimum.reduceat(vals, at)
    out: List[Tuple[int, int, float]] = []
    current: Optional[List[Any]] = None  # [first, last, extreme, series]
    pick = max if largest else min
    for s, e, v in zip(starts.tolist(), ends.tolist(), extremes.tolist()):
        if current is not None and sid[s] == current[3] and s <= current[1] + 2:
            current[1], current[2] = e, pick(current[2], v)  # a gap of one evaluation at most: bridged
            continue
        if current is not None:
            out.append((current[0], current[1], current[2]))
            current = None
        if e - s + 1 >= patience:
            current = [s, e, v, sid[s]]
    if current is not None:
        out.append((current[0], current[1], current[2]))
    return out


class _Rank:
    """The rows of one rank, and what the rules ask of them."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        c = rows.cols
        self.nonfinite = nonfinite(c)
        self.clean = (self.nonfinite == 0) & (c["numel"] > 0)
        counts = np.diff(np.r_[rows.starts, len(rows)]) if len(rows) else np.zeros(0, np.int64)
        self.pos = np.arange(len(rows)) - np.repeat(rows.starts, counts)  # a row's place in its series
        self.taps: Dict[str, str] = {}
        """run.json's declared nonlinearities of the rank (tensortap/_doctor_taps.py)."""

    def by_function(self, include: Pattern, functions: Tuple[str, ...]) -> np.ndarray:
        """Per series: an activation the rule judges as one of `functions`:
        declared so, or found by `include` and not declared as another."""
        named = self.series_mask(("activation",), include)
        other = np.array([taps_.function_of(n, self.taps) not in (None,) + functions for _, n in self.rows.keys],
                         dtype=bool)
        return (named & ~other) | taps_.declared_mask(self.rows, self.taps, functions)

    def series_mask(self, kinds: Iterable[str], include: Pattern) -> np.ndarray:
        """Per series: whether the rule judges it."""
        kinds = set(kinds)
        return np.array([k in kinds and include.search(n) for k, n in self.rows.keys], dtype=bool)

    def rows_of(self, mask: np.ndarray, clean: bool = True) -> np.ndarray:
        """Indices of the rows of the series in `mask` (clean rows only, by default)."""
        if not len(mask):
            return np.zeros(0, np.int64)
        keep = mask[self.rows.series]
        return np.flatnonzero(keep & self.clean if clean else keep & (self.rows.cols["numel"] > 0))


class _Verdict:
    """What a rule found on one rank, and whether it could judge anything there."""

    def __init__(self) -> None:
        self.findings: List[Finding] = []
        self.evaluated = False
        self.why = ""


def _selection_problem(r: _Rank, kinds: Iterable[str], include: Pattern, hint: str = "") -> str:
    kinds = sorted(set(kinds), key=KINDS.index)
    present = {k for k, _ in r.rows.keys}
    if not present & set(kinds):
        return ("needs kind " + kinds[0] if len(kinds) == 1 else "needs one of the kinds " + ", ".join(kinds)) + \
            "; record it with kinds"
    what = kinds[0] if len(kinds) == 1 else "/".join(kinds)
    return f"no {what} name matches {include.pattern!r}" + (f"; {hint}" if hint else "")


def _selected(r: _Rank, p: Dict[str, Any], v: _Verdict, kinds: Optional[Iterable[str]] = None,
              mask: Optional[np.ndarray] = None, clean: bool = True, hint: str = "") -> np.ndarray:
    """The rule's opening: the rows it judges on the rank, those of the
    series in `mask` (by default the series of `kinds`, p["kinds"] unless
    given, whose name p["include"] finds), clean rows only unless told;
    where there are none, v.why says what the selection missed."""
    kinds = p["kinds"] if kinds is None else kinds
    if mask is None:
        mask = r.series_mask(kinds, p["include"])
    idx = r.rows_of(mask, clean)
    if not len(idx):
        v.why = _selection_problem(r, kinds, p["include"], hint)
    return idx


def _finding(r: _Rank, rule: str, i_first: int, i_last: int, value: float, threshold: float, message: str,
             first_step: Optional[int] = None) -> Finding:
    kind, name = r.rows.keys[int(r.rows.series[i_first])]
    first = int(r.rows.step[i_first]) if first_step is None else first_step
    return Finding(r.rows.rank, rule, kind, name, first, int(r.rows.step[i_last]), float(value), float(threshold),
                   message)


def _streak_rule(r: _Rank, v: _Verdict, rule: str, idx: np.ndarray, cond: np.ndarray, measure: np.ndarray,
                 patience: int, largest: bool, threshold: float, say: Callable[[float, int], str],
                 first_step: Optional[np.ndarray] = None) -> None:
    """The common shape: evaluations `idx` (rows), a condition and a measure on them."""
    if len(idx) == 0:
        return
    v.evaluated = True
    for a, b, value in episodes(r.rows.series[idx], cond, measure, patience, largest):
        fs = int(first_step[a]) if first_step is not None else None
        v.findings.append(_finding(r, rule, int(idx[a]), int(idx[b]), value, threshold, say(value, int(idx[b])), fs))
