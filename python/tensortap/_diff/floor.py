"""Several floor runs, since one A2 can mislead: `--floor A2 --floor A2' ...`.

One A2 is one sample of how far rounding moves the model. A one-ulp change
can flip something discrete in one run (a max-pool or ReLU tie) and not in
another: on a ResNet, seed 0's floor jumped from 2.4e-7 to 2.4e-3 at step 2
while seed 1's stayed near 3e-7 for 20 steps, so one floor passed nearly
anything and the other failed faithful ports. Hence:

- A record's floor is the envelope of its floor runs': the largest
  ||a - a2|| (integers: the most differing elements); a NaN or infinity one
  of them disagrees with A on leaves the record without a floor, as with one.
- The floors are compared with each other: where the largest of a record's
  floor_rel_norms passes `factor` times the smallest (each at least 4u, the
  rounding allowance, so that two floors at rounding level are never far
  apart), the floor runs disagree at that record. The first step holding
  such a record is said (`floors disagree from step k: <kind> <name>
  (<ratio>)`, the largest ratio of that step); from there on the envelope
  is the floor, and it is said so that nobody trusts it blindly. Records
  that are rounding noise in A itself (the uninformative series, or a
  smallest floor_rel_norm of UNINFORMATIVE or more) are left out: their
  floors are noise too.

Each A2 is checked as one was (`check`): A's program perturbed, within `ulps`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._base import RunError
from .align import Alignment
from .text import UNINFORMATIVE, _num, _where, esc
from .sums import PairStats, _norm_le
from .values import compare_quietly, is_float, ulps_within

if TYPE_CHECKING:
    from .side import _Side
    from .tally import Tally


class Floors:
    """The floor runs of a diff, each aligned with A: the first through the
    diff's own Alignment, the others through one of their own."""

    def __init__(self, a: "_Side", sides: Sequence["_Side"], align: Alignment) -> None:
        self.a = a
        self.sides = list(sides)
        self.align = align
        assert align.match_a2 is not None
        self.matches: List[np.ndarray] = [align.match_a2]
        self.outside: List[Optional[int]] = [align.a2_outside]
        for side in self.sides[1:]:
            # A2 as the "B" of an alignment with A: match_b pairs A's records
            # with its, only_b holds its records A does not have.
            own = Alignment(a.index, side.index)
            self.matches.append(own.match_b)
            outside = np.flatnonzero(own.only_b)
            self.outside.append(int(outside[0]) if outside.size else None)

    def read(self, pa: int, x: np.ndarray) -> Tuple[List[np.ndarray], str]:
        """The floor runs' arrays of A's record `pa` (those that have it, in a
        dtype A's array has), and why one could not be used ("" if none)."""
        out: List[np.ndarray] = []
        why = ""
        for side, match in zip(self.sides, self.matches):
            j = int(match[pa])
            if j < 0:
                continue
            try:
                x2 = side.read(j)
            except RunError as e:
                why = why or f"no floor: {esc(e)}"
                continue
            if x2.dtype.kind != x.dtype.kind or x2.dtype.itemsize != x.dtype.itemsize:
                why = why or f"no floor: {side.label} holds {x2.dtype}"
                continue
            out.append(x2)
        return out, why

    def close(self) -> None:
        for side in self.sides:
            side.close()


def envelope(st: PairStats, x: np.ndarray, others: Sequence[np.ndarray], dtype: str) -> float:
    """Makes `st`'s floor (compared with the first floor run's record) the
    envelope of it and `others`' (the other floor runs' records of A's `x`);
    returns the smallest floor_rel_norm of them all."""
    lo = st.floor_rel_norm()
    for x2 in others:
        # A against itself: what compare computes of an equal pair with A2,
        # ||a||, ||a - a2|| and A2's differing elements, and nothing else.
        own = compare_quietly(x, x, dtype, 0.0, 0.0, x2, full=False)
        lo = min(lo, own.floor_rel_norm())
        st.floor_nonfinite = st.floor_nonfinite or own.floor_nonfinite
        st.n_diff2 = max(st.n_diff2, own.n_diff2)
        if not _norm_le(own.d2, st.d2, 1.0):
            st.d2 = own.d2
    return lo


def spread(row: Dict[str, Any], lo: float) -> float:
    """How far a record's floor runs are apart: the largest floor_rel_norm
    over the smallest, each at least 4u; NaN where it says nothing (one
    floor, no floor_rel_norm, or floors that are rounding noise in A)."""
    hi, u = row["floor_rel_norm"], row["_u"]
    if math.isnan(lo) or math.isnan(hi) or math.isnan(u) or lo >= UNINFORMATIVE:
        return math.nan
    hi, lo = max(hi, 4 * u), max(lo, 4 * u)
    return math.inf if math.isinf(hi) and not math.isinf(lo) else hi / lo if not math.isinf(lo) else math.nan


def disagreement(tally: "Tally") -> Optional[Dict[str, Any]]:
    """The first step where the floor runs disagree by more than the factor:
    {"rank", "kind", "name", "step", "ratio"} of the record of that step whose
    floors are furthest apart, or None."""
    ratios = tally.spread
    if ratios is None:
        return None
    index = tally.cmp.a.index
    with np.errstate(invalid="ignore"):
        past = ratios > tally.cmp.opts.factor
    if not past.any():
        return None
    # The uninformative series' records are left out, at every step.
    useless = {(u["rank"], u["kind"], u["name"]) for u in tally.uninformative()}
    at = np.flatnonzero(past)
    a = tally.cmp.a
    if useless:
        at = np.array([i for i in at.tolist() if (a.rank(i),) + a.meta(i)[:2] not in useless], dtype=np.int64)
        if at.size == 0:
            return None
    steps = index.step[at]
    first = int(steps.min())
    here = at[steps == first]
    i = int(here[np.argmax(ratios[here])])
    kind, name, _, _, _ = a.meta(i)
    return {"rank": a.rank(i), "kind": kind, "name": name, "step": first, "ratio": float(ratios[i])}


def disagreement_line(found: Dict[str, Any], ranks: bool) -> str:
    rank = f" rank {found['rank']}" if ranks and found["rank"] else ""
    return (f"floors disagree from step {found['step']}: {found['kind']} {esc(found['name'])}{rank} "
            f"({_num(found['ratio'])}): the floor runs differ from A by more than --factor times each other "
            "(a discrete flip: a max-pool or ReLU tie); from there on the largest of them is the floor")


# -- each A2, checked before it is used ------------------------------------------


def check(a: "_Side", a2: "_Side", match: np.ndarray, outside: Optional[int], keep_all: np.ndarray, ulps: int,
          what: str = "A2") -> Optional[str]:
    """Refuses (ValueError) an A2 that is not A's program perturbed by at
    most `ulps`; returns a note when A2's parameters are A's bit for bit.
    `match`: A2's position of each of A's records (-1: none); `outside`: an
    A2 record A does not have; `keep_all`: A's records that are their key's
    last line; `what`: how the messages name this A2."""
    if outside is not None:
        kind, name, _, _, _ = a2.meta(outside)
        where = _where(kind, name, a2.step(outside), a2.rank(outside))
        raise ValueError(f"--floor: {what} is not A perturbed: its {where} is not in A ({what} must record what A "
                         "records)")
    # Shapes and dtypes of every pair, compared through codes of the metas.
    sig: Dict[Tuple[str, Tuple[int, ...]], int] = {}
    sig_a = np.array([sig.setdefault((m[2], m[3]), len(sig)) for m in a.index.metas] or [0], dtype=np.int64)
    sig_2 = np.array([sig.setdefault((m[2], m[3]), len(sig)) for m in a2.index.metas] or [0], dtype=np.int64)
    has = np.flatnonzero(match >= 0)
    if has.size:
        differs = sig_a[a.index.meta[has]] != sig_2[a2.index.meta[match[has]]]
        if differs.any():
            i = int(has[np.flatnonzero(differs)[0]])
            j = int(match[i])
            kind, name, dtype, shape, _ = a.meta(i)
            _, _, dtype2, shape2, _ = a2.meta(j)
            raise ValueError(f"--floor: {what} is not A perturbed: {_where(kind, name, a.step(i), a.rank(i))} is "
                             f"{esc(dtype)} {list(shape)} in A, {esc(dtype2)} {list(shape2)} in {what}")
    # A's initial parameters, A2's within `ulps` of them.
    params = [i for i, m in enumerate(a.index.metas) if m[0] == "param"]
    at0 = np.flatnonzero(np.isin(a.index.meta, params) & (a.index.step == 0)) if params else np.zeros(0, np.int64)
    at0 = at0[keep_all[at0]] if at0.size else at0
    if at0.size == 0:
        raise ValueError("--floor: A has no param records at step 0, which the floor needs to prove that A2 is A "
                         "perturbed: record kind param (C++: Options::kinds; Python: "
                         "tensortap.torch.watch(kinds=...))")
    identical = True
    for i in at0.tolist():
        kind, name, dtype, _, _ = a.meta(i)
        where = _where(kind, name, 0, a.rank(i))
        j = int(match[i])
        if j < 0:
            raise ValueError(f"--floor: {what} has no {where}: it must record A's initial parameters")
        try:
            x, x2 = a.read(i), a2.read(j)
        except RunError as e:
            raise ValueError(f"--floor: {where}: {esc(e)}") from None
        ulp_dtype = dtype if is_float(dtype) or x.dtype.kind not in "fc" else x.dtype.name
        ok, why = ulps_within(x, x2, ulp_dtype, ulps)
        if not ok:
            raise ValueError(f"--floor: {what} is not A perturbed by at most {ulps} ulp(s): {where}: "
                             f"{esc(why)} (tensortap.torch.perturb(model, ulps, seed) before the first step; "
                             "--ulps to allow more)")
        if identical:
            identical = bool(np.array_equal(np.asarray(x).view(np.uint8), np.asarray(x2).view(np.uint8)))
    if identical:
        return (f"floor: {what}'s step-0 parameters are A's bit for bit (not perturbed?): the floor is the "
                "rounding allowance alone")
    return None


def check_all(floors: Floors, ulps: int) -> Optional[str]:
    """check() for each floor run; the notes, one a line (None: none)."""
    several = len(floors.sides) > 1
    notes = []
    for k, (side, match, outside) in enumerate(zip(floors.sides, floors.matches, floors.outside)):
        what = f"{side.label} ({esc(getattr(side.run, 'path', '?'))})" if several else "A2"
        note = check(floors.a, side, match, outside, floors.align.keep_all, ulps, what)
        if note:
            notes.append(note)
    return "\n".join(notes) or None


__all__ = ["Floors", "envelope", "spread", "disagreement", "disagreement_line", "check", "check_all"]
