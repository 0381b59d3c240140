"""Training health rules (docs/design.md#health-rules): `tensortap doctor RUN` and
`tensortap.doctor(run)` name what is wrong with a run, rule by rule, the
tensor and the steps: SageMaker Debugger's (smdebug's) built-in rules for
deep learning, on tensortap's statistics. This docstring is the rules'
definition; the live rules of C++ (`Trigger::vanishing_gradient()`, ...)
evaluate the same, and docs/health.md tabulates them.

Input. Each rank is judged on its own, from its statistics rows: stats.npy
where the rank has one, otherwise rows computed from its full records with
the recorder's definitions (tensortap/_doctor_rows.py; said once on stderr).
A row is one tensor (kind, name) at one step: min, max, mean, std
(population), norm (L2) over the finite values, counts nan, posinf, neginf,
zeros, numel. A tensor's evaluations are its rows in step order. A row that
holds a NaN or an infinity, or no element, is no evaluation of any rule but
exploding_tensor (it is exploding_tensor's). RMS = norm / sqrt(numel).

Selection. A rule looks at the tensors of its `kinds` whose name its
`include` finds: a pattern in the recorder's ECMAScript syntax (the live
rules' matcher, _pattern.Pattern, in linear time) searched anywhere in the name,
ASCII letters matched without regard to case (re.search with re.IGNORECASE
| re.ASCII; in C++, an ECMAScript search with icase). A name it does not
find is never judged. "" finds every name. Repeats (`name#1`) are names of their
own.

Episodes. Where a rule's condition holds at `patience` consecutive
evaluations of a tensor, an episode opens at the first of them. It goes on
through the evaluations where the condition holds, over a gap of at most one
evaluation where it does not, and closes at the second evaluation in a row
where it does not (or at the tensor's last). One finding per (rule, rank,
kind, name, episode): first_step is the step of its first evaluation (of the
earlier step, for rules whose evaluation compares two steps), last_step that
of its last evaluation where the condition held; value is the most extreme
measure over those evaluations (the smallest for a rule of "below", the
largest for one of "above"), threshold the bound it was compared with. Live,
a rule fires where its episode opens: at the patience-th evaluation.

The rules, with their defaults (each `--set <rule>.<parameter>=<value>`, and
a chained setter of the same name on the C++ Trigger):

vanishing_gradient (kinds=grad, include="weight", threshold=1e-7, patience=3):
    condition RMS < threshold. value: the smallest RMS. smdebug's measure is
    the mean |g|; RMS >= mean |g|, so whatever this finds smdebug would.
    include "weight" (smdebug's "weights" collection) leaves out biases: a
    bias before a normalization gets no gradient by design (the
    normalization subtracts it), only rounding noise.

exploding_tensor (kinds=all six, include="", bound=0):
    a row explodes when nan + posinf + neginf > 0, or, with bound > 0, when
    max(|min|, |max|) > bound. A blow-up is a maximal run of the rank's
    evaluated steps (the steps with a selected row) at each of which some
    selected row explodes, a gap of one such step bridged. One finding per
    blow-up, naming its first exploding row: the first of the first step's
    in the order the writer got them (the order training made them: a
    step's parameters, its forward, the loss, its backward). value: that
    tensor's largest count of non-finite elements in the blow-up (threshold
    0), or, for a blow-up of it without any, its largest max(|min|, |max|)
    (threshold bound). The message counts the other tensors that exploded in
    the blow-up. It differs from Trigger::non_finite() in what it reports: a
    finding naming the first tensor, not a dump.

all_zero (kinds=activation+activation_grad+param+grad, include="", patience=2):
    condition zeros == numel. A param's first row is no evaluation:
    BatchNorm biases, zero-initialized gates and LoRA's B start at 0.
    value: zeros / numel (1), threshold 1.

unchanged_tensor (kind param, include="weight", num_steps=3):
    an evaluation compares a param's row with its previous one: the
    condition holds when all ten statistics are equal and the last grad row
    of that name at a step in [previous step, this step) has norm > 0
    (a gradient reached it; a frozen parameter has no grad rows and is never
    judged). patience = num_steps - 1, so the statistics are identical at
    num_steps evaluations; first_step is the first of them. value: the
    largest such gradient norm (threshold 0). smdebug's compares the values
    with allclose; identical statistics are the test a row allows. include
    "weight": a bias before a normalization gets a gradient of rounding noise,
    whose updates are lost in rounding.

loss_not_decreasing (kind tensor, name="loss", window=20, min_decrease=0.001, min_progress=0.05):
    the values are the mean of the rows of the tensor named exactly `name`
    (a 0-d loss's value), taken in whole windows of `window` values, as
    smdebug checks every num_steps: when the k-th window is complete (k >= 2,
    so from the 2 window-th value on), A = its mean, B = the (k-1)-th
    window's, F = the first window's, R = the smallest window mean so far.
    Condition: B - A <= min_decrease * |B| (it did not fall by more than
    0.1%) and R > F - min_progress * |F| (it never fell 5% below where it
    started: a run that learned and plateaus is not flagged). patience 1;
    the evaluation's step is the window's last. value: the smallest relative
    decrease (B - A) / |B| (0 when B is 0), threshold min_decrease. Without a
    tensor of that name, or with fewer than 2 window values, it is not
    evaluated.

dead_relu (kind activation, include="relu", threshold=0.95, patience=3):
    f = zeros / numel, the fraction of the ReLU's outputs that are 0 in the
    batch; condition f > threshold; value the largest f. A tap named
    `<name>_input` (a ReLU's input, ending so, or `_input#k`) is never
    judged. From the
    statistics alone, live too. smdebug's counts units whose output is 0 for
    (almost) the whole batch and fires when over half the layer's units
    are: a layer with a fraction u of such units has f >= u, so a layer all
    but dead is found by both; f counts a unit alive in part of the batch
    as partly dead, hence the high threshold.

saturated_activation (kind activation, include="tanh|sigmoid", derivative=0.1, threshold=0.5, patience=3):
    an element is saturated where the function's derivative is below
    `derivative` times its peak: with t = sqrt(1 - derivative), an output y
    of tanh where |y| > t, of sigmoid where |2y - 1| > t; an input x (a tap
    named `<name>_input`) of tanh where |x| > atanh(t), of sigmoid where
    |x| > 2 atanh(t) (1.82 and 3.64 by default). A name holding "sigmoid"
    is a sigmoid's, any other a tanh's. f = the fraction saturated;
    condition f > threshold; value the largest f. From full records (a run
    without statistics): f exactly, from the values. From a statistics row:
    a lower bound of f, with v the judged value (y, 2y - 1 or x), E = the
    mean of v^2, M = the largest |v| and a the bound:
    f >= (E - a^2) / (M^2 - a^2) (0 where M <= a), since an element within
    the bound adds at most a^2 to E and one beyond it at most M^2; for
    sigmoid's outputs E = 4 norm^2/numel - 4 mean + 1, M = max(|2 min - 1|,
    |2 max - 1|). So a finding from statistics is one from the values too.
    smdebug's bounds (|x| > 9.4 for tanh, -23/+17 for sigmoid) are where
    float32 saturates exactly; ours are where training has all but stopped.

tensor_variance (kinds=activation+activation_grad+param+grad, include="", factor=100, window=50):
    the std of a row against the median std of the tensor's previous
    min(window, evaluations so far) evaluations (the median of an even
    count: the mean of the middle two), once it has min(window, 3) earlier
    ones (as Trigger::spike) and where that median is > 0:
    condition std > factor * median or std < median / factor. patience 1.
    value: the ratio std / median farthest from 1, threshold factor (or
    1 / factor when the std fell). smdebug's has no default bounds.

poor_weight_initialization (kind activation, include="(relu|tanh|sigmoid).*_input", threshold=10):
    at the rank's first step with a selected row, over the selected
    activations there (the inputs of the nonlinearities, tapped as
    `<name>_input`) whose std is > 0: condition max std / min std >
    threshold; at least two are needed. value: that ratio. One finding for
    the model: kind and name "-" (None in the frame), steps that step.
    smdebug's compares variances (its 10 is a std ratio of 3.2) over the
    first steps; a model of default initializations keeps within 10.

weight_update_ratio (kind param, include="weight", large=0.1, small=1e-8, patience=1):
    from full param records at consecutive recorded steps s < s' (not from
    statistics: it needs the values of both): r = ||w_s' - w_s|| / ||w_s||
    / (s' - s), evaluated where ||w_s|| > 0. Two conditions, each with its
    own episodes: r > large; and r < small while the last grad row of that
    name at a step in [s, s') has norm > 0 (a frozen parameter is never too
    slow). value: the largest r (the smallest), threshold large (small).
    include "weight" leaves out biases, as smdebug's "weights" collection
    does. smdebug's large threshold is 10: an update 100x too large
    (r about 0.1 where 1e-3 is usual) would pass it.

stalled_training (no parameters):
    a finding per dumps.jsonl line with reason "stall" (Options::stall_after):
    kind and name "-", steps last_step..last_step, value stalled_seconds,
    threshold stall_after in seconds (NaN when run.json does not say). Not
    evaluated when no rank recorded with stall_after and there is no such
    dump.

overfit (a validation series) is not among them yet.

Which activations dead_relu, saturated_activation and
poor_weight_initialization judge: besides `include`, the taps run.json's
"taps" declares as their function, and for dead_relu a ReLU inferred from
the statistics (tensortap/_doctor_taps.py).

Output. Findings causes first, in groups (tensortap/_doctor_groups.py: the
rule's tier, first_step, rank, place in the model); a group is one rule and
kind on tensors whose episodes overlap. A rule not evaluated (no tensor it
could judge, on any rank) is named with why, and is no finding. doctor()
returns a pandas DataFrame with the columns COLUMNS (`group`: the group's
place) and attrs["not_evaluated"] = {rule: why}; `tensortap doctor` prints
`likely cause: <a finding's line>`, one line per group (a group of one: its
finding's `<rule>: <kind> <name>[ rank <r>] steps <first>..<last>:
<message>`), then `<rule>: not evaluated: <why>` lines, then `N findings`
(groups); --all a line per finding instead of the likely cause and the
groups; --json one object per finding instead, without the count.

Cost: one pass over each rank's statistics rows, vectorized, and over the
full param records for weight_update_ratio (one record and its predecessor
in memory); a run without statistics is read once, record by record.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import groups as groups_
from . import rows as rows_
from . import taps as taps_
from .._base import KINDS, RunError, _safe, _warn
from .rows import Rows, ValueMeasure
from .._files import has_statistics, monitoring_line
from .._pattern import Pattern, PatternError
from .._run import Run

if TYPE_CHECKING:
    import os

    import pandas

COLUMNS = ("rank", "rule", "kind", "name", "first_step", "last_step", "value", "threshold", "message", "group")

RULES = ("vanishing_gradient", "exploding_tensor", "all_zero", "unchanged_tensor", "loss_not_decreasing",
         "dead_relu", "saturated_activation", "tensor_variance", "poor_weight_initialization",
         "weight_update_ratio", "stalled_training")

_ALL_KINDS = "+".join(KINDS)

# Each rule's parameters: name -> (type, default). The types:
#   kinds: kinds joined by "+";  regex: a Python regular expression;  name: a tensor's name;
#   count: an integer >= 1;  steps: an integer >= 2;  positive: a number > 0;  bound: a number >= 0;
#   fraction: a number in (0, 1);  factor: a number > 1.
PARAMETERS: Dict[str, Dict[str, Tuple[str, Any]]] = {
    "vanishing_gradient": {"kinds": ("kinds", "grad"), "include": ("regex", "weight"), "threshold": ("positive", 1e-7),
                           "patience": ("count", 3)},
    "exploding_tensor": {"kinds": ("kinds", _ALL_KINDS), "include": ("regex", ""), "bound": ("bound", 0.0)},
    "all_zero": {"kinds": ("kinds", "activation+activation_grad+param+grad"), "include": ("regex", ""),
                 "patience": ("count", 2)},
    "unchanged_tensor": {"include": ("regex", "weight"), "num_steps": ("steps", 3)},
    "loss_not_decreasing": {"name": ("name", "loss"), "window": ("count", 20), "min_decrease": ("fraction", 0.001),
                            "min_progress": ("fraction", 0.05)},
    "dead_relu": {"include": ("regex", "relu"), "threshold": ("fraction", 0.95), "patience": ("count", 3)},
    "saturated_activation": {"include": ("regex", "tanh|sigmoid"), "derivative": ("fraction", 0.1),
                             "threshold": ("fraction", 0.5), "patience": ("count", 3)},
    "tensor_variance": {"kinds": ("kinds", "activation+activation_grad+param+grad"), "include": ("regex", ""),
                        "factor": ("factor", 100.0), "window": ("count", 50)},
    "poor_weight_initialization": {"include": ("regex", "(relu|tanh|sigmoid).*_input"),
                                   "threshold": ("factor", 10.0)},
    "weight_update_ratio": {"include": ("regex", "weight"), "large": ("positive", 0.1), "small": ("positive", 1e-8),
                            "patience": ("count", 1)},
    "stalled_training": {},
}

_TYPES = {
    "kinds": "kinds joined by + (" + ", ".join(KINDS) + ")",
    "regex": "a regular expression",
    "name": "a tensor's name",
    "count": "an integer >= 1 (at most 2**62)",
    "steps": "an integer >= 2 (at most 2**62)",
    "positive": "a number > 0",
    "bound": "a number >= 0 (0: off)",
    "fraction": "a number between 0 and 1 (exclusive)",
    "factor": "a number > 1",
}

_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_FLAGS = re.IGNORECASE | re.ASCII


class Settings:
    """Which rules run, and each one's parameters, checked: a ValueError names
    the rule, the parameter and what it wants."""

    def __init__(self, rules: Optional[Iterable[str]] = None,
                 params: Optional[Mapping[str, Any]] = None) -> None:
        if rules is None:
            self.rules: Tuple[str, ...] = RULES
        else:
            given = [r.strip() for r in rules] if not isinstance(rules, str) else \
                [r.strip() for r in rules.split(",")]
            if not given or any(not r for r in given):
                raise ValueError(f"--rules wants rule names separated by commas; rules: {', '.join(RULES)}")
            unknown = [r for r in given if r not in PARAMETERS]
            if unknown:
                raise ValueError(f"no rule {unknown[0]!r}; rules: {', '.join(RULES)}")
            self.rules = tuple(r for r in RULES if r in given)
        self.values: Dict[str, Dict[str, Any]] = {r: {p: _parse(r, p, t, d) for p, (t, d) in ps.items()}
                                                  for r, ps in PARAMETERS.items()}
        for key, value in (params or {}).items():
            rule, dot, param = str(key).partition(".")
            if not dot or not rule or not param:
                raise ValueError(f"{_safe(key)!r} is not <rule>.<parameter>")
            if rule not in PARAMETERS:
                raise ValueError(f"{_safe(key)}: no rule {rule!r}; rules: {', '.join(RULES)}")
            if param not in PARAMETERS[rule]:
                names = ", ".join(PARAMETERS[rule]) or "none"
                raise ValueError(f"{_safe(key)}: {rule} has no parameter {param!r}; its parameters: {names}")
            if rule not in self.rules:
                raise ValueError(f"{_safe(key)}: {rule} is not among the rules evaluated (--rules)")
            self.values[rule][param] = _parse(rule, param, PARAMETERS[rule][param][0], value)

    def __getitem__(self, rule: str) -> Dict[str, Any]:
        return self.values[rule]


def _parse(rule: str, param: str, kind: str, value: Any) -> Any:
    """`value` (text, or a Python value of the right type) as parameter
    `param` of `rule`; a ValueError says what it wants."""
    def bad(why: str = "") -> ValueError:
        return ValueError(f"{rule}.{param}={_safe(value)!r}: wants {_TYPES[kind]}{why}")

    if kind in ("kinds", "regex", "name"):
        if not isinstance(value, str):
            raise bad()
        if kind == "kinds":
            kinds = value.split("+")
            unknown = [k for k in kinds if k not in KINDS]
            if unknown or len(set(kinds)) != len(kinds):
                raise bad(f"; {unknown[0]!r} is not a kind" if unknown else "; a kind given twice")
            return frozenset(kinds)
        if kind == "regex":
            # The live rules' matcher, in linear time (a user's pattern must
            # not hang the doctor: Python's re backtracks).
            try:
                return Pattern(value, "include", ignore_case=True)
            except PatternError as e:
                raise bad(f"; {e}") from None
        if not value:
            raise bad()
        return value
    if isinstance(value, str):
        if not (_INTEGER if kind in ("count", "steps") else _NUMBER).fullmatch(value):
            raise bad()
        number: Union[int, float] = int(value) if kind in ("count", "steps") else float(value)
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise bad()
    else:
        number = float(value) if not isinstance(value, numbers.Integral) else int(value)
    if kind in ("count", "steps"):
        # Within int64 with room: the live rules take the same values in C++.
        if isinstance(number, float) and not number.is_integer():  # NaN and infinities too
            raise bad()
        if not (2 if kind == "steps" else 1) <= int(number) <= 1 << 62:
            raise bad()
        return int(number)
    x = float(number)
    ok = {"positive": x > 0, "bound": x >= 0, "fraction": 0 < x < 1, "factor": x > 1}[kind]
    if not ok or not math.isfinite(x):
        raise bad()
    return x


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


_num = groups_.num
_pct = groups_.pct


# -- episodes -----------------------------------------------------------------

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


# -- one rank -----------------------------------------------------------------

class _Rank:
    """The rows of one rank, and what the rules ask of them."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        c = rows.cols
        self.nonfinite = c["nan"] + c["posinf"] + c["neginf"]
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


def _vanishing_gradient(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    mask = r.series_mask(p["kinds"], p["include"])
    idx = r.rows_of(mask)
    if not len(idx):
        v.why = _selection_problem(r, p["kinds"], p["include"])
        return
    c = r.rows.cols
    rms = c["norm"][idx] / np.sqrt(c["numel"][idx].astype(np.float64))
    thr = p["threshold"]
    _streak_rule(r, v, "vanishing_gradient", idx, rms < thr, rms, p["patience"], False, thr,
                 lambda x, i: f"RMS {_num(x)} below {_num(thr)}")


def _exploding_tensor(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    mask = r.series_mask(p["kinds"], p["include"])
    idx = r.rows_of(mask, clean=False)
    if not len(idx):
        v.why = _selection_problem(r, p["kinds"], p["include"])
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
            parts = [f"{lbl} {int(c[f][wrow])}" for f, lbl in (("nan", "NaN"), ("posinf", "+Inf"), ("neginf", "-Inf"))
                     if c[f][wrow]]
            what = f"{int(value)} of {n} values non-finite ({', '.join(parts)})"
        else:
            value, threshold = float(largest[mine].max()), bound
            what = f"|x| up to {_num(value)}, above {_num(bound)}"
        tail = f"; then {others} more tensor{'s' if others != 1 else ''}" if others else ""
        v.findings.append(Finding(r.rows.rank, "exploding_tensor", *r.rows.keys[series], first, last, value,
                                  threshold, what + tail))


def _all_zero(r: _Rank, p: Dict[str, Any], v: _Verdict) -> None:
    mask = r.series_mask(p["kinds"], p["include"])
    idx = r.rows_of(mask)
    if not len(idx):
        v.why = _selection_problem(r, p["kinds"], p["include"])
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
    mask = r.series_mask(("param",), p["include"])
    idx = r.rows_of(mask)
    if not len(idx):
        v.why = _selection_problem(r, ("param",), p["include"])
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
    idx = r.rows_of(mask)
    if not len(idx):
        v.why = _selection_problem(r, ("activation",), p["include"], "name the ReLU's taps so (e.g. relu1), or "
                                   "declare their nonlinearity (run.json \"taps\")")
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
    mask = r.by_function(p["include"], taps_.SATURATING)
    idx = r.rows_of(mask)
    if not len(idx):
        v.why = _selection_problem(r, ("activation",), p["include"], "name the taps so (e.g. tanh1, and tanh1_input "
                                   "for its input), or declare their nonlinearity (run.json \"taps\")")
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
    mask = r.series_mask(p["kinds"], p["include"])
    idx = r.rows_of(mask)
    if not len(idx):
        v.why = _selection_problem(r, p["kinds"], p["include"])
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


def _stalled_training(run: Run) -> Tuple[List[Finding], bool]:
    """The stall dumps' findings, and whether any rank recorded with stall_after."""
    out = []
    watched = False
    thresholds: Dict[Optional[int], float] = {}
    for key, info in run.infos.items():
        opts = info.get("options")
        ms = opts.get("stall_after_ms") if isinstance(opts, dict) else None
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
            watched = True
            thresholds[key] = float(ms) / 1000
        else:
            thresholds[key] = math.nan
    for d in run.dumps:
        if d.get("reason") != "stall":
            continue
        key = d.get("rank") if run.ranks else None
        rank = _rank_number(run, key)
        last, secs = d.get("last_step"), d.get("stalled_seconds")
        if not isinstance(last, int) or isinstance(last, bool) or not isinstance(secs, (int, float)) \
                or isinstance(secs, bool):
            _warn(f"a stall dump without an integer last_step and a number stalled_seconds was skipped: "
                        f"{_safe(d)}")
            continue
        thr = thresholds.get(key, math.nan)
        limit = f" (stall_after {_num(thr)} s)" if math.isfinite(thr) else ""
        out.append(Finding(rank, "stalled_training", None, None, last, last, float(secs), thr,
                           f"no step() for {_num(float(secs))} s after step {last}{limit}"))
    return out, watched


def _rank_number(run: Run, key: Optional[int]) -> int:
    if key is not None:
        return key
    rank = run.info.get("rank", 0)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else 0


_PER_RANK: Dict[str, Callable[[_Rank, Dict[str, Any], _Verdict], None]] = {
    "vanishing_gradient": _vanishing_gradient, "exploding_tensor": _exploding_tensor, "all_zero": _all_zero,
    "unchanged_tensor": _unchanged_tensor, "loss_not_decreasing": _loss_not_decreasing, "dead_relu": _dead_relu,
    "saturated_activation": _saturated_activation, "tensor_variance": _tensor_variance,
    "poor_weight_initialization": _poor_weight_initialization,
}


# -- the run ------------------------------------------------------------------

def evaluate(run: Run, settings: Optional[Settings] = None) -> Result:
    """Every rule of `settings` (default: all, default parameters) over `run`."""
    chosen = settings if settings is not None else Settings()
    keys: List[Optional[int]] = list(run.ranks) if run.ranks else [None]
    has_table = {k: _has_table(run, k) for k in keys}
    sat = chosen["saturated_activation"]

    declared = taps_.declared_any(run)

    def measure_of(kind: str, name: str) -> ValueMeasure:
        function = taps_.function_of(name, declared)
        if "saturated_activation" in chosen.rules and kind == "activation" and \
                (function in taps_.SATURATING or function is None and sat["include"].search(name)):
            return saturation_measure(name, sat["derivative"], taps_.saturating_function(name, declared))
        return None

    from_records = {k: _rank_number(run, k) for k in keys if not has_table[k]}
    computed = rows_.from_records(run, from_records, measure_of) if from_records else {}
    verdicts: Dict[str, List[_Verdict]] = {rule: [] for rule in chosen.rules}
    sources: Dict[int, str] = {}
    where: groups_.Position = {}
    for k in keys:
        rows = computed[k] if k in computed else rows_.from_table(run, k, _rank_number(run, k))
        sources[rows.rank] = rows.source
        where.update(groups_.positions(rows))
        r = _Rank(rows)
        r.taps = taps_.declared(run, k)
        for rule in chosen.rules:
            if rule == "stalled_training":
                continue
            v = _Verdict()
            if rule == "weight_update_ratio":
                _weight_update_ratio(r, chosen[rule], v, run)
            else:
                _PER_RANK[rule](r, chosen[rule], v)
            verdicts[rule].append(v)
    findings: List[Finding] = []
    not_evaluated: Dict[str, str] = {}
    for rule in chosen.rules:
        if rule == "stalled_training":
            stalls, watched = _stalled_training(run)
            findings += stalls
            if not stalls and not watched:
                not_evaluated[rule] = "the run was recorded without stall_after (Options::stall_after)"
            continue
        vs = verdicts[rule]
        for v in vs:
            findings += v.findings
        if not any(v.evaluated for v in vs):
            not_evaluated[rule] = next((v.why for v in vs if v.why), "nothing to judge")
    groups = groups_.arrange(findings, where)
    return Result([f for g in groups for f in g], not_evaluated, sources, bool(run.ranks), groups, where)


def _has_table(run: Run, key: Optional[int]) -> bool:
    return has_statistics(run._dirs[key])


def lines(result: Result, every: bool = False) -> List[str]:
    """The command's output: the likely cause and a line per group (`every`:
    a line per finding), rules not evaluated, the count (of the lines above)."""
    out = groups_.lines(result.groups, result.positions, result.ranks, every)
    out += [f"{rule}: not evaluated: {why}" for rule, why in result.not_evaluated.items()]
    n = len(result.findings) if every else len(result.groups)
    out.append(f"{n} finding{'' if n == 1 else 's'}")
    return out


def json_lines(result: Result) -> List[str]:
    """--json: one object per finding (the frame's columns), then one per rule not evaluated."""
    return [f.json() for f in result.findings] + \
        [json.dumps({"rule": rule, "not_evaluated": why}) for rule, why in result.not_evaluated.items()]


def doctor(run: Union[Run, str, "os.PathLike[str]"], rules: Optional[Iterable[str]] = None,
           params: Optional[Mapping[str, Any]] = None) -> pandas.DataFrame:
    """The training health rules over `run` (a Run or a run directory): a
    pandas DataFrame of findings, one row per (rule, rank, kind, name,
    episode), columns rank, rule, kind, name, first_step, last_step, value,
    threshold, message (kind and name None for rules about the whole
    model); attrs["not_evaluated"] = {rule: why}, attrs["statistics"] =
    {rank: "statistics" | "records"} (where its rows came from).
    `rules`: names to evaluate (default all); `params`: {"<rule>.<parameter>":
    value}, as `--set` (tensortap/_doctor.py defines each). A bad rule or
    parameter raises ValueError naming it."""
    from .._optional import need

    pd = need("pandas", "python3-pandas", "tensortap.doctor()")
    settings = Settings(rules, params)
    if isinstance(run, Run):
        result = evaluate(run, settings)
    else:
        with Run(run) as opened:
            result = evaluate(opened, settings)
    frame = pd.DataFrame({
        "rank": pd.Series([f.rank for f in result.findings], dtype="int64"),
        "rule": pd.Series([f.rule for f in result.findings], dtype=object),
        "kind": pd.Series([f.kind for f in result.findings], dtype=object),
        "name": pd.Series([f.name for f in result.findings], dtype=object),
        "first_step": pd.Series([f.first_step for f in result.findings], dtype="int64"),
        "last_step": pd.Series([f.last_step for f in result.findings], dtype="int64"),
        "value": pd.Series([f.value for f in result.findings], dtype="float64"),
        "threshold": pd.Series([f.threshold for f in result.findings], dtype="float64"),
        "message": pd.Series([f.message for f in result.findings], dtype=object),
        "group": pd.Series([f.group for f in result.findings], dtype="int64"),
    }, columns=list(COLUMNS))
    frame.attrs["not_evaluated"] = dict(result.not_evaluated)
    frame.attrs["statistics"] = dict(result.sources)
    return frame


def parse_sets(items: Sequence[str]) -> Dict[str, str]:
    """`--set rule.param=value` arguments as doctor()'s params; a ValueError names a malformed one."""
    out: Dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or "." not in key:
            raise ValueError(f"--set {_safe(item)!r}: wants <rule>.<parameter>=<value>")
        if key in out:
            raise ValueError(f"--set {_safe(key)} given twice")
        out[key] = value
    return out


def _monitoring_lines(run: Run) -> List[str]:
    """Above the findings: where statistics stopped (run.json's
    "monitoring"), the rules saw no step after it."""
    out: List[str] = []
    for rank, info in sorted(run.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        line = monitoring_line(info)
        m = info.get("monitoring") or {}
        if line and m.get("resumed_at") is None:
            where = "" if rank is None else f"rank {rank}: "
            out.append(f"{where}{line} (the rules saw no step after {m['statistics_stopped_at']})")
        elif line:
            out.append(("" if rank is None else f"rank {rank}: ") + line)
    # Budget::KeepLatest gave up the oldest statistics (docs/design.md#leaving-it-on):
    # the rules saw the steps kept, from the first row on.
    for rank, info in sorted(run.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        budget = info.get("budget")
        gone = budget.get("stats_rows_given_up") if isinstance(budget, dict) else None
        if not isinstance(gone, int) or gone <= 0 or not _has_table(run, rank):
            continue
        try:
            table, _ = run.stats_table(rank=rank)
        except RunError:
            continue
        if len(table):
            where = "" if rank is None else f"rank {rank}: "
            out.append(f"{where}the rules saw steps {int(table['step'].min())}..{int(table['step'].max())}: "
                       f"{gone} older statistics rows were given up (Budget::KeepLatest)")
    return out


def run_command(path: str, rules: Optional[str], sets: Sequence[str], as_json: bool,
                say: Callable[[str], None], every: bool = False) -> Tuple[List[str], int]:
    """`tensortap doctor`: (the lines to print, the exit status). `say` gets
    the one note for stderr (statistics computed from records). ValueError:
    bad input (exit 2); RunError, OSError: a run that cannot be read."""
    settings = Settings(rules.split(",") if rules is not None else None, parse_sets(sets))
    with Run(path) as run:
        result = evaluate(run, settings)
        stopped = _monitoring_lines(run)
    computed = sorted(r for r, s in result.sources.items() if s == "records")
    if computed:
        where = "" if not result.ranks else f" (rank{'s' if len(computed) > 1 else ''} " + \
            ", ".join(map(str, computed)) + ")"
        say(f"no statistics table (stats.npy){where}: the rules use statistics computed from the full records, "
            "with the recorder's definitions (Options::stats_every records them every step)")
    out = json_lines(result) if as_json else stopped + lines(result, every)
    status = 2 if len(result.not_evaluated) == len(settings.rules) else 1 if result.findings else 0
    return out, status
