"""Two (or three) runs' records aligned by (rank, kind, name, step), from the
reader's index columns: no dict per record, a few bytes per record.

Each record gets one int64 key, step-major: (step code * groups + group)
where a group is a (rank, kind, name) coded alike in every run. A run's
index lists a step's records together and its names in the same order
every step, so its keys usually come already sorted: then nothing is
sorted or copied. B's keys carry B's position in their low digits (key *
len(B) + position), so one in-place sort gives both the order and the
positions, and a lookup of A's keys in it is one searchsorted per chunk.

What it holds afterwards, per record: the B position of each A record
(int32 below 2^31 records, else int64), the A2 position likewise with a
floor, and three masks of one byte (A's records to compare, B's records
only B has, and scratch). That is the diff's memory beyond the index
(bench/bench_diff_scale.py measures it): the sorts' transient copies apart,
which last only while the alignment is made.

A record indexed twice (the same key twice in one run: a damaged or
hand-edited index) counts once, as its last line, as the reader does.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._base import KINDS
from .._pattern import Pattern

# Keys (with a position folded in) stay below this; above it, the codes are
# made denser (steps, then groups), and past that a separate order array is
# used. A module constant so that the tests can lower it.
KEY_LIMIT = 1 << 62
# Elements of a lookup done at once: bounds the lookups' temporaries.
CHUNK = 1 << 16
# Positions handed out at once as Python ints (36 bytes each in a list).
ITER_CHUNK = 1 << 14


class Selection:
    """The records a diff looks at: steps lo..hi (inclusive, None: open),
    kinds (None: all), names `exclude` does not find (the recorder's ECMAScript
    grammar, _pattern.Pattern)."""

    def __init__(self, steps: Tuple[Optional[int], Optional[int]] = (None, None),
                 kinds: Optional[Sequence[str]] = None, exclude: Optional[str] = None) -> None:
        self.lo, self.hi = steps
        self.kinds = None if kinds is None else frozenset(kinds)
        # The recorder's grammar, in linear time (Python's re backtracks).
        self.exclude = None if exclude is None else Pattern(exclude, "exclude")

    @property
    def everything(self) -> bool:
        return self.lo is None and self.hi is None and self.kinds is None and self.exclude is None

    def mask(self, index) -> Optional[np.ndarray]:
        """The records of `index` selected (a bool per record), None for all."""
        if self.everything:
            return None
        meta_ok = np.array([(self.kinds is None or m[0] in self.kinds)
                            and (self.exclude is None or not self.exclude.search(m[1]))
                            for m in index.metas], dtype=bool)
        out = meta_ok[index.meta] if len(index.metas) else np.zeros(len(index), dtype=bool)
        if self.lo is not None:
            out &= index.step >= self.lo
        if self.hi is not None:
            out &= index.step <= self.hi
        return out


def parse_steps(text: str) -> Tuple[Optional[int], Optional[int]]:
    """`A..B`, `A..`, `..B` or `N` as (lo, hi); ValueError otherwise."""
    lo_text, sep, hi_text = text.partition("..")
    if not sep:
        lo_text = hi_text = text
    try:
        lo = int(lo_text) if lo_text.strip() else None
        hi = int(hi_text) if hi_text.strip() else None
    except ValueError:
        raise ValueError(f"--steps wants A..B, A.., ..B or N (integers), not {text!r}") from None
    if lo is None and hi is None and sep:
        raise ValueError(f"--steps wants at least one bound, not {text!r}")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"--steps {text!r}: the first step is after the last")
    return lo, hi


def parse_kinds(text: str) -> List[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"--kinds: {bad[0] if bad else text!r} is not a kind; kinds are {', '.join(KINDS)}")
    return kinds


class _Codes:
    """Group and step codes shared by the runs."""

    def __init__(self, indexes: Sequence) -> None:
        self.group_of_name: Dict[Tuple[str, str], int] = {}
        self.rank_of: Dict[int, int] = {}
        for index in indexes:
            # Names coded in the order they first come in the index (its
            # tables are in no useful order): then a run whose steps list
            # their names in one order has its keys sorted already.
            for m in _first_seen(index):
                self.group_of_name.setdefault(index.metas[m][:2], len(self.group_of_name))
            for _, _, rank in index.sources:
                # A single-rank run is rank 0.
                self.rank_of.setdefault(0 if rank is None else rank, len(self.rank_of))
        self.names = max(1, len(self.group_of_name))
        self.groups = self.names * max(1, len(self.rank_of))
        steps = [index.step for index in indexes if len(index)]
        self.lo = min((int(s.min()) for s in steps), default=0)
        span = max((int(s.max()) for s in steps), default=0) - self.lo + 1
        self.dense: Optional[np.ndarray] = None
        self.group_dense: Optional[np.ndarray] = None
        most = max((len(index) for index in indexes), default=1) + 1
        if span * self.groups * most >= KEY_LIMIT:
            # Steps far apart: their ranks among the steps present instead.
            self.dense = np.unique(np.concatenate([np.unique(s) for s in steps])) if steps else np.zeros(1, np.int64)
            span = len(self.dense)
            if span * self.groups * most >= KEY_LIMIT:
                # Many names on many ranks: the groups present, numbered densely.
                present = np.unique(np.concatenate([self._raw_groups(index) for index in indexes if len(index)]))
                self.group_dense = present
                self.groups = max(1, len(present))
        self.span = span
        self.fold = span * self.groups * most < KEY_LIMIT  # positions fit beside the keys

    def _raw_groups(self, index) -> np.ndarray:
        meta_group = np.array([self.group_of_name[m[:2]] for m in index.metas], dtype=np.int64)
        source_rank = np.array([self.rank_of[0 if s[2] is None else s[2]] for s in index.sources], dtype=np.int64)
        return np.unique(source_rank[index.source] * self.names + meta_group[index.meta])

    def keys(self, index) -> np.ndarray:
        """Every record's key (int64), in the index's order."""
        meta_group = np.array([self.group_of_name[m[:2]] for m in index.metas] or [0], dtype=np.int64)
        source_rank = np.array([self.rank_of[0 if s[2] is None else s[2]] for s in index.sources] or [0],
                               dtype=np.int64)
        out = np.empty(len(index), dtype=np.int64)
        for i in range(0, len(index), CHUNK):
            part = slice(i, i + CHUNK)
            group = source_rank[index.source[part]] * self.names + meta_group[index.meta[part]]
            if self.group_dense is not None:
                group = np.searchsorted(self.group_dense, group)
            step = index.step[part]
            code = np.searchsorted(self.dense, step) if self.dense is not None else step - self.lo
            out[part] = code * self.groups + group
        return out


def _first_seen(index) -> List[int]:
    """The index's metas in the order of their first record."""
    first = np.full(len(index.metas), len(index), dtype=np.int64)
    for i in range(0, len(index), CHUNK):
        np.minimum.at(first, index.meta[i:i + CHUNK], np.arange(i, min(i + CHUNK, len(index))))
    return np.argsort(first, kind="stable").tolist()


class _Sorted:
    """One run's keys, sorted, with each sorted key's position in the run."""

    def __init__(self, keys: np.ndarray, fold: bool, copy: bool) -> None:
        n = len(keys)
        self.n = n
        if n < 2 or bool(np.all(keys[1:] >= keys[:-1])):
            # Already in order (the usual case): no copy, no sort.
            self.keys, self.order, self.folded = keys, None, False
        elif fold:
            # The position in the low digits: one in-place sort, no order array.
            folded = keys.copy() if copy else keys
            folded *= n
            folded += np.arange(n, dtype=np.int64)
            folded.sort()
            self.keys, self.order, self.folded = folded, None, True
        else:
            order = np.argsort(keys, kind="stable")
            self.keys, self.order, self.folded = keys[order], order, False

    def key_at(self, i: np.ndarray) -> np.ndarray:
        return self.keys[i] // self.n if self.folded else self.keys[i]

    def position_at(self, i: np.ndarray) -> np.ndarray:
        if self.folded:
            return self.keys[i] % self.n
        if self.order is not None:
            return self.order[i]
        return i

    def lookup(self, wanted: np.ndarray) -> np.ndarray:
        """The position of the last record holding each of `wanted`'s keys, or -1."""
        if self.n == 0:
            return np.full(len(wanted), -1, dtype=np.int64)
        if self.folded:
            # The last of a key: just below (key + 1) * n.
            i = np.searchsorted(self.keys, (wanted + 1) * self.n, side="left") - 1
        else:
            i = np.searchsorted(self.keys, wanted, side="right") - 1
        found = i >= 0
        i = np.maximum(i, 0)
        found &= self.key_at(i) == wanted
        return np.where(found, self.position_at(i), -1)

    def last_of_key(self) -> np.ndarray:
        """A bool per record (by position): the last record of its key."""
        out = np.zeros(self.n, dtype=bool)
        for i in range(0, self.n, CHUNK):
            j = np.arange(i, min(i + CHUNK, self.n))
            k = self.key_at(j)
            nxt = self.key_at(np.minimum(j + 1, self.n - 1))
            last = (k != nxt) | (j == self.n - 1)
            out[self.position_at(j[last])] = True
        return out


class Alignment:
    """Which record of B (and of A2) each record of A pairs with, and the
    records only B has. Positions are the runs' index positions."""

    def __init__(self, index_a, index_b, index_a2=None, select: Optional[Selection] = None) -> None:
        select = select or Selection()
        indexes = [index_a, index_b] + ([index_a2] if index_a2 is not None else [])
        codes = _Codes(indexes)
        na, nb = len(index_a), len(index_b)
        pos_type = np.int32 if max(na, nb, len(index_a2) if index_a2 is not None else 0) < (1 << 31) else np.int64

        keys_a = codes.keys(index_a)
        sorted_a = _Sorted(keys_a, codes.fold, copy=True)
        # A's records that are their key's last line; those selected are
        # gone through, in A's order.
        self.keep_all = sorted_a.last_of_key()
        sel_a = select.mask(index_a)
        keep_a = self.keep_all if sel_a is None else self.keep_all & sel_a
        del sel_a
        self.emit_a = keep_a

        keys_b = codes.keys(index_b)
        sorted_b = _Sorted(keys_b, codes.fold, copy=False)
        del keys_b
        self.match_b = np.full(na, -1, dtype=pos_type)
        matched = np.zeros(nb, dtype=bool)
        for i in range(0, na, CHUNK):
            part = slice(i, i + CHUNK)
            found = sorted_b.lookup(keys_a[part])
            found[~keep_a[part]] = -1
            self.match_b[part] = found
            matched[found[found >= 0]] = True
        only_b = sorted_b.last_of_key()
        del sorted_b
        only_b &= ~matched
        del matched
        sel_b = select.mask(index_b)
        if sel_b is not None:
            only_b &= sel_b
        self.only_b = only_b

        self.match_a2: Optional[np.ndarray] = None
        self.a2_outside: Optional[int] = None  # the first A2 record with no counterpart in A
        if index_a2 is not None:
            keys_a2 = codes.keys(index_a2)
            sorted_a2 = _Sorted(keys_a2, codes.fold, copy=True)
            self.match_a2 = np.full(na, -1, dtype=pos_type)
            for i in range(0, na, CHUNK):
                part = slice(i, i + CHUNK)
                found = sorted_a2.lookup(keys_a[part])
                found[~self.keep_all[part]] = -1
                self.match_a2[part] = found
            del sorted_a2
            # Every record of A2 must be one of A's.
            for i in range(0, len(index_a2), CHUNK):
                found = sorted_a.lookup(keys_a2[i:i + CHUNK])
                missing = np.flatnonzero(found < 0)
                if missing.size:
                    self.a2_outside = i + int(missing[0])
                    break
            del keys_a2
        del sorted_a, keys_a

    def a_positions(self) -> Iterator[int]:
        """A's records to compare, in A's index order."""
        n = len(self.emit_a)
        for i in range(0, n, ITER_CHUNK):
            yield from (i + np.flatnonzero(self.emit_a[i:i + ITER_CHUNK])).tolist()

    def b_only_positions(self) -> Iterator[int]:
        n = len(self.only_b)
        for i in range(0, n, ITER_CHUNK):
            yield from (i + np.flatnonzero(self.only_b[i:i + ITER_CHUNK])).tolist()


__all__ = ["Alignment", "Selection", "parse_steps", "parse_kinds", "KEY_LIMIT"]
