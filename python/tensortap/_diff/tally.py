"""The comparison's tally (Tally): the counts, the first divergence and where
it arises, the floor's findings, and the lines `tensortap diff` prints;
a row described in words."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from .text import SATURATED, UNINFORMATIVE, _num, _where, esc
from .dropout import SAYS as DROPOUT, masks_differ
from .dtype import coarser
from .floor import disagreement, disagreement_line
from .side import _AGREE, _CODE, _DIFFERENCES, _DIVERGE

if TYPE_CHECKING:
    from .compare import _Comparer


class Tally:
    """What the command prints, gathered as the rows stream by: a byte per
    record of A (its status), a float32 with a floor (its floor_rel_norm),
    the counts, and the first few rows of each list."""

    def __init__(self, cmp: _Comparer, listed: int = 10) -> None:
        self.cmp = cmp
        n = len(cmp.a.index)
        self.status = np.zeros(n, dtype=np.uint8)
        self.floor = cmp.a2 is not None
        self.frn = np.full(n, np.nan, dtype=np.float32) if self.floor else None
        # Several floor runs: how far apart they are at each record (floor.spread).
        several = cmp.floors is not None and len(cmp.floors.sides) > 1
        self.spread: Optional[np.ndarray] = np.full(n, np.nan, dtype=np.float32) if several else None
        # Records A and B hold in two dtypes: {(A's, B's): [count, the first row]}.
        self.dtypes: Dict[Tuple[str, str], List[Any]] = {}
        self._dropout: Optional[bool] = None
        self.listed = listed
        self.counts = {s: 0 for s in ("equal", "noise", "differ", "mismatch", "unreadable", "only_a", "only_b")}
        self.first: Optional[Dict[str, Any]] = None
        self.differing: List[Dict[str, Any]] = []
        self.only: Dict[str, List[Dict[str, Any]]] = {"only_a": [], "only_b": []}
        self.only_kinds: Dict[str, Dict[str, int]] = {"only_a": {}, "only_b": {}}
        self.without_floor: List[Dict[str, Any]] = []
        self.n_without_floor = 0
        self.ranks = bool(cmp.a.run.ranks) or bool(cmp.b.run.ranks)
        self.note: Optional[str] = None
        # The other run's budget markers {rank (0 for a single-rank run): k}:
        # a record on one side only below the other's k was given up there.
        self.given_up = {"only_a": _markers(cmp.b.run), "only_b": _markers(cmp.a.run)}
        self.n_given_up = {"only_a": 0, "only_b": 0}

    def add(self, row: Dict[str, Any]) -> None:
        status = row["status"]
        self.counts[status] += 1
        pa = row["_a"]
        if status in ("only_a", "only_b"):
            k = self.given_up[status].get(row["rank"])
            if k is not None and row["step"] < k:
                # Not a difference: the other run's budget gave that step up.
                self.counts[status] -= 1
                self.n_given_up[status] += 1
            else:
                self._only(row, status)
            if status == "only_a":
                self.status[pa] = _CODE[status]
            return
        self.status[pa] = _CODE[status]
        if self.frn is not None and row["_floor"] and not row["_a_zero"]:
            # A record that is 0 in A (a bias initialised to zero) has a
            # floor_rel_norm of inf or 0, a ratio to nothing: it is left out
            # of the step's median and of the uninformative records.
            self.frn[pa] = row["floor_rel_norm"]
            if self.spread is not None:
                self.spread[pa] = row["_spread"]
        if row["_dtype_b"] != row["_dtype_a"] and status != "mismatch":
            seen = self.dtypes.setdefault((row["_dtype_a"], row["_dtype_b"]), [0, row])
            seen[0] += 1
        if self.floor and not row["_floor"] and status not in ("mismatch", "unreadable"):
            self.n_without_floor += 1
            if len(self.without_floor) < self.listed:
                self.without_floor.append(row)
        if status in _DIFFERENCES:
            if len(self.differing) < self.listed:
                self.differing.append(row)
            if status != "unreadable" and (self.first is None or row["step"] < self.first["step"]):
                self.first = row

    def _only(self, row: Dict[str, Any], status: str) -> None:
        if len(self.only[status]) < self.listed:
            self.only[status].append(row)
        kinds = self.only_kinds[status]
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1

    @property
    def differ(self) -> int:
        return sum(self.counts[s] for s in _DIFFERENCES)

    @property
    def compared(self) -> int:
        return sum(v for k, v in self.counts.items() if k not in ("only_a", "only_b"))

    def failed(self, common_only: bool) -> bool:
        return self.differ > 0 or (not common_only and (self.counts["only_a"] + self.counts["only_b"]) > 0)

    def describe(self, row: Dict[str, Any]) -> str:
        return describe(row, row.get("_detail", ""), self.ranks)

    def where(self, row: Dict[str, Any]) -> str:
        return _where(row["kind"], row["name"], row["step"], row["rank"], self.ranks)

    def name_of(self, pa: int) -> str:
        kind, name, _, _, _ = self.cmp.a.meta(pa)
        return _where(kind, name, self.cmp.a.step(pa), self.cmp.a.rank(pa), self.ranks)

    # -- the first divergence ----------------------------------------------

    def first_divergence(self) -> Optional[Dict[str, Any]]:
        """{"rank", "kind", "name", "step", "arises"} of the first divergence, or None."""
        if self.first is None:
            return None
        r = self.first
        return {"rank": r["rank"], "kind": r["kind"], "name": r["name"], "step": r["step"],
                "arises": self.arises(r["_a"])}

    def dropout(self) -> bool:
        """Whether the first divergence is two dropout masks (_diff_dropout)."""
        if self._dropout is None:
            self._dropout = self.first is not None and masks_differ(self.cmp, self.first["_a"])
        return self._dropout

    def floor_disagrees(self) -> Optional[Dict[str, Any]]:
        """Where the floor runs first disagree (_diff_floor.disagreement), or None."""
        return disagreement(self)

    def arises(self, pa: int) -> str:
        """Where the first divergence (A's record `pa`) arises, read from the
        statuses of the records of its rank around it (docs/diff.md)."""
        a = self.cmp.a
        index = a.index
        kinds = np.array([m[0] for m in index.metas] or ["tensor"])
        kind, name, _, shape, _ = a.meta(pa)
        step = a.step(pa)
        on_rank = index.source == index.source[pa]
        steps = index.step[on_rank]
        first_step = int(steps.min()) if steps.size else step
        earlier = steps[steps < step]
        prev = int(earlier.max()) if earlier.size else None
        here = np.flatnonzero(on_rank & (index.step == step))
        here_kind = kinds[index.meta[here]]
        here_status = self.status[here]
        diverging = np.isin(here_status, _DIVERGE)

        def label(i: int) -> str:
            k, n, _, _, _ = a.meta(i)
            return f"{k} {esc(n)}"

        def between(phase: str, among: Optional[Tuple[str, ...]] = None) -> str:
            agree = (here < pa) & np.isin(here_status, _AGREE)
            if among is not None:
                agree &= np.isin(here_kind, among)
            before = here[agree]
            if before.size:
                return f"in the {phase} between {label(int(before[-1]))} and {kind} {esc(name)}"
            return f"in the {phase} before {kind} {esc(name)}"

        if kind in ("param", "buffer") and step == first_step:
            return "in the initial state"
        if prev is not None:
            if kind == "buffer":
                return f"in a buffer: {esc(name)} between steps {prev} and {step}"
            if kind == "param" or bool((diverging & (here_kind == "param")).any()):
                return f"in the update between steps {prev} and {step}"
            if not ((here_kind == "param") & (here_status > 0)).any():
                return (f"between steps {prev} and {step} (record kind param to tell the update from the "
                        "forward)")
        activations_differ = bool((diverging & (here_kind == "activation")).any())
        if kind == "activation":
            # The step's parameters and buffers come before its forward in A's
            # order but are no part of it: the model's last buffer agreeing says
            # nothing of where the forward went wrong.
            return between("forward", ("activation", "tensor"))
        if kind == "tensor":
            ahead = here[here < pa]
            ahead_kind = kinds[index.meta[ahead]]
            lossy = len(shape) == 0 and not activations_differ \
                and not np.isin(ahead_kind, ("activation_grad", "grad")).any() \
                and (bool((ahead_kind == "activation").any()) or "loss" in name.lower())
            return "in the loss" if lossy else f"in a captured tensor {esc(name)}"
        if kind in ("activation_grad", "grad"):
            if activations_differ:
                later = here[diverging & (here_kind == "activation")]
                return f"in the forward (activation {esc(a.meta(int(later[0]))[1])} differs, recorded after it)"
            return between("backward")
        # A param or buffer at the first step is handled above; what is left
        # is a param or buffer with no earlier step on a rank that has one.
        return "in the initial state"

    # -- the floor's findings ---------------------------------------------------

    def saturated_step(self) -> Optional[int]:
        """The first step whose median floor_rel_norm passes SATURATED, or None."""
        if self.frn is None:
            return None
        has = np.flatnonzero(~np.isnan(self.frn))
        if has.size == 0:
            return None
        steps = self.cmp.a.index.step[has]
        values = self.frn[has].astype(np.float64)
        order = np.lexsort((values, steps))
        steps, values = steps[order], values[order]
        starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
        ends = np.r_[starts[1:], len(steps)]
        lo, hi = (starts + ends - 1) // 2, (starts + ends) // 2
        with np.errstate(invalid="ignore"):
            medians = (values[lo] + values[hi]) / 2  # inf + inf is inf; never inf - inf
        past = np.flatnonzero(medians > SATURATED)
        return int(steps[starts[past[0]]]) if past.size else None

    def uninformative(self) -> List[Dict[str, Any]]:
        """The series (rank, kind, name) whose floor_rel_norm is at least
        UNINFORMATIVE at their first step with a floor, in A's order."""
        if self.frn is None:
            return []
        index = self.cmp.a.index
        has = np.flatnonzero(~np.isnan(self.frn))
        if has.size == 0:
            return []
        group = index.meta_key[index.meta[has]].astype(np.int64) * (len(index.sources) + 1) + index.source[has]
        order = np.lexsort((has, index.step[has], group))
        firsts = has[order][np.r_[True, group[order][1:] != group[order][:-1]]]
        firsts = np.sort(firsts[self.frn[firsts] >= UNINFORMATIVE])
        out = []
        for i in firsts.tolist():
            kind, name, _, _, _ = self.cmp.a.meta(i)
            out.append({"rank": self.cmp.a.rank(i), "kind": kind, "name": name, "step": self.cmp.a.step(i)})
        return out

    # -- the lines --------------------------------------------------------------

    def given_up_notes(self) -> List[str]:
        """A line per run whose disk budget gave up steps: which, and that
        they are compared from there."""
        notes = []
        for label, side in (("A", self.cmp.a), ("B", self.cmp.b)):
            below = side.run.given_up_below
            if not below:
                continue
            ks = sorted(set(below.values()))
            where = f"steps below {ks[0]}" if len(ks) == 1 else \
                "steps below " + ", ".join(f"{k} on rank {r}" for r, k in sorted(_markers(side.run).items()))
            notes.append(f"note: {label} gave up {where} (disk budget, KeepLatest): compared from there, "
                         "and at the steps it dumped")
        return notes

    def lines(self, common_only: bool = False) -> List[str]:
        lines: List[str] = self.given_up_notes()
        first = self.first
        if first is not None:
            arises = self.arises(first["_a"])
            where = _where(first["kind"], first["name"], first["step"], first["rank"], self.ranks)
            said = f"{DROPOUT}; " if self.dropout() else ""
            lines.append(f"first divergence: {where}: arises {arises}; {said}{_what(first, first['_detail'])}")
            pa = first["_a"]
            agreeing = np.flatnonzero(np.isin(self.status[:pa], _AGREE))
            if first["kind"] in ("activation", "activation_grad") and agreeing.size:
                # Of a forward's (or a backward's) divergence, only a record of
                # that step's passes is a clue: the step's parameters and
                # buffers are its initial state, as the arises clause says.
                index = self.cmp.a.index
                passes = np.array([self.cmp.a.meta(int(i))[0] in ("activation", "activation_grad", "tensor")
                                   for i in agreeing.tolist()], dtype=bool)
                same = (index.step[agreeing] == first["step"]) & (index.source[agreeing] == index.source[pa])
                agreeing = agreeing[passes & same]
            if agreeing.size:
                lines.append("  last agreeing before it: " + self.name_of(int(agreeing[-1])))
            codes = [_CODE[s] for s in _DIFFERENCES]
            after = pa + 1 + np.flatnonzero(np.isin(self.status[pa + 1:], codes))[:3]
            for i in after.tolist():
                lines.append("  then: " + self.describe(self.cmp.pair(i, full=True)))
        differ = self.differ
        if differ > 1 or (differ and first is None):
            lines.append(f"differing records ({differ}, in A's order):")
            lines.extend("  " + self.describe(r) for r in self.differing)
            if differ > len(self.differing):
                lines.append(f"  ... and {differ - len(self.differing)} more")
        for (dtype_a, dtype_b), (n, row) in self.dtypes.items():
            judged = coarser(dtype_a, dtype_b)
            lines.append(f"dtype {esc(dtype_a)} vs {esc(dtype_b)} (A's vs B's, judged as {judged}): {n} "
                         f"record{'s' if n != 1 else ''}, e.g. {self.where(row)}")
        if self.floor:
            if self.note:
                lines.extend(self.note.splitlines())
            if self.n_without_floor:
                lines.append(f"without floor ({self.n_without_floor}: not in A2, judged by --rtol/--atol):")
                lines.extend("  " + self.where(r) for r in self.without_floor)
                if self.n_without_floor > len(self.without_floor):
                    lines.append(f"  ... and {self.n_without_floor - len(self.without_floor)} more")
            k = self.saturated_step()
            if k is not None:
                lines.append(f"floor saturated from step {k}: the median floor_rel_norm passes {SATURATED:g}; "
                             "differences after it are no longer resolved")
            disagree = self.floor_disagrees()
            if disagree is not None:
                lines.append(disagreement_line(disagree, self.ranks))
            useless = self.uninformative()
            if useless:
                e = useless[0]
                lines.append(f"uninformative (rounding noise in A itself): {len(useless)} records, "
                             f"e.g. {e['kind']} {esc(e['name'])}")
        side_runs = {"only_a": ("A", "B", self.cmp.b), "only_b": ("B", "A", self.cmp.a)}
        for status, (mine, other, other_side) in side_runs.items():
            rows = self.only[status]
            total = self.counts[status]
            if not total:
                continue
            lines.append(f"only in {mine} ({total}):")
            lines.extend("  " + self.where(r) for r in rows)
            if total > len(rows):
                lines.append(f"  ... and {total - len(rows)} more")
            # A kind the other run does not record at all: say how to record it.
            present = {k for k, _ in other_side.index.keys}
            for kind, n in self.only_kinds[status].items():
                if kind not in present:
                    lines.append(f"only in {mine}: {n} {kind} record{'s' if n != 1 else ''} (record kind {kind} "
                                 f"in {other}: Options::kinds, or tensortap.torch.watch(kinds=...))")
        for status, (mine, other) in (("only_a", ("A", "B")), ("only_b", ("B", "A"))):
            n = self.n_given_up[status]
            if n:
                lines.append(f"given up by {other}: {n} record{'s' if n != 1 else ''} of {mine}, of steps {other}'s "
                             f"disk budget gave up (not counted as only in {mine})")
        noise = f", noise {self.counts['noise']}" if self.floor else ""
        lines.append(f"compared {self.compared}, differ {differ}{noise}, only in A {self.counts['only_a']}, "
                     f"only in B {self.counts['only_b']}")
        return lines


def _markers(run: Any) -> Dict[int, int]:
    """A run's budget markers {rank (0 for a single-rank run): k}, as the
    diff names ranks."""
    return {0 if r is None else int(r): k for r, k in getattr(run, "given_up_below", {}).items()}


def describe(row: Dict[str, Any], detail: str = "", ranks: bool = False) -> str:
    """One record's comparison in words, for the command and the page;
    `ranks`: the runs have several (the rank is named)."""
    return _where(row["kind"], row["name"], row["step"], row["rank"], ranks) + ": " + _what(row, detail)


def _what(row: Dict[str, Any], detail: str) -> str:
    status = row["status"]
    if status == "mismatch":
        return f"shape or dtype differs ({detail})"
    if status == "unreadable":
        return f"unreadable: {detail}"
    if status == "only_a":
        return "only in A"
    if status == "only_b":
        return "only in B"
    text = (f"{row['n_bad']} element(s) beyond tolerance, max |a-b| {_num(row['max_abs'])}, "
            f"max rel {_num(row['max_rel'])}")
    if not math.isnan(row["max_ulp"]):
        text += f", max ulp {_num(row['max_ulp'])}"
    text += f", cosine {_num(row['cosine'], 9)}, rel_norm {_num(row['rel_norm'])}"
    if not math.isnan(row.get("floor_rel_norm", math.nan)):
        text += f", floor_rel_norm {_num(row['floor_rel_norm'])}"
    dtype_a, dtype_b = row.get("_dtype_a"), row.get("_dtype_b")
    if dtype_a and dtype_b and dtype_a != dtype_b:
        text += f", dtype {esc(dtype_a)} vs {esc(dtype_b)}"
    if status == "noise":
        text += " (noise)"
    return text
