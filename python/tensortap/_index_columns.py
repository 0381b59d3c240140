"""A run's index as columns, once its lines are read (_index.Index reads
them): the records a budget gave up hidden (give_up), the columns cut to
size (finish), and the lookups the Run makes (record, positions, grouped).
"""

from __future__ import annotations

import os
from typing import Dict, FrozenSet, List, Optional, Tuple

import numpy as np

from ._records import _Record

# (kind, name, dtype, shape, the file's directory): what a name's records share.
Meta = Tuple[str, str, str, Tuple[int, ...], str]

# A rank's budget marker, for the records to hide: (k, the steps its dumps
# kept). Records of steps below k are hidden but those of the kept steps
# whose files are still there.
Marker = Tuple[int, FrozenSet[int]]

# Columns only some formats have: absent (None) until a record has them,
# -1 in the rows of records without them.
OPTIONAL = ("offset", "nbytes", "dataset", "row")


class Columns:
    """The records of the index files of a run (one or more per rank), in
    file order.

    Per record (arrays of len(self)): step, meta, base, line (in its index
    file), source (its rank), part (its index file); offset and nbytes
    (packed), dataset and row (HDF5), None where no record has them. Tables:
    sources, one per rank (index.jsonl's path, real rank directory, rank),
    parts (an index file's path, its source), metas, bases, datasets, keys
    ((kind, name)). hidden: {rank: records hidden by its budget marker}, for
    the ranks with one."""

    # While the lines are read (_index.Index): the columns by name, sized
    # `capacity`, of which the first `n` rows are filled.
    n: int
    cols: Dict[str, np.ndarray]
    sources: List[Tuple[str, str, Optional[int]]]
    parts: List[Tuple[str, int]]
    metas: List[Meta]
    bases: List[str]
    datasets: List[str]
    extra: Dict[int, _Record]
    hidden: Dict[Optional[int], int]
    _meta_code: Dict[Meta, int]
    _base_code: Dict[str, int]
    _dataset_code: Dict[str, int]

    # The columns, set by finish().
    step: np.ndarray
    meta: np.ndarray
    base: np.ndarray
    line: np.ndarray
    source: np.ndarray
    part: np.ndarray
    offset: Optional[np.ndarray]
    nbytes: Optional[np.ndarray]
    dataset: Optional[np.ndarray]
    row: Optional[np.ndarray]

    def give_up(self, markers: Dict[int, Marker]) -> None:
        """Hides the records given up under the budget markers {source: (k,
        the steps its dumps kept)} (run.json's "given_up_below", Budget::
        KeepLatest): on a rank with a marker, a record of a step below k
        unless its step is a kept one and its file is still there (the
        recorder deletes a given-up step's files after writing the marker,
        and a step both stored and dumped may have lost its stored
        records). Counts them in self.hidden. Before finish(): the rows are
        dropped from the columns, so that nothing reads them."""
        n = self.n
        for s, (_, _, rank) in enumerate(self.sources):
            if s in markers:
                self.hidden[rank] = 0
        if not markers or n == 0:
            return
        step, source = self.cols["step"][:n], self.cols["source"][:n]
        # Per source, its k; no marker: nothing is below it.
        below_of = np.full(len(self.sources), np.iinfo(np.int64).min, dtype=np.int64)
        for s, (k, _) in markers.items():
            below_of[s] = k
        hide = step < below_of[source]
        if not hide.any():
            return
        for s, (k, kept) in markers.items():
            if not kept:
                continue
            mine = np.flatnonzero(hide & (source == s))
            mine = mine[np.isin(step[mine], np.fromiter(kept, np.int64, len(kept)))]
            if mine.size:
                hide[mine] = ~self._files_present(mine, s)
        counts = np.bincount(source[hide], minlength=len(self.sources)).tolist()
        for s, (_, _, rank) in enumerate(self.sources):
            if s in markers:
                self.hidden[rank] = counts[s]
        keep = ~hide
        m = int(keep.sum())
        for column in self.cols.values():
            column[:m] = column[:n][keep]
        if self.extra:
            moved = np.cumsum(keep) - 1
            self.extra = {int(moved[i]): rec for i, rec in self.extra.items() if keep[i]}
        self.n = m

    def _files_present(self, positions: np.ndarray, source: int) -> np.ndarray:
        """Per position (of records of `source`), whether the file its record
        names is there: a stat per distinct file (a packed segment is many
        records'). A name the reader refuses to open (absolute, with '..'
        or NUL) counts as there: it is shown, and refused when read."""
        root = self.sources[source][1]
        meta, base = self.cols["meta"][positions], self.cols["base"][positions]
        nb = max(1, len(self.bases))
        pairs, inverse = np.unique(meta.astype(np.int64) * nb + base, return_inverse=True)
        present = []
        for p in pairs.tolist():
            file = self.metas[p // nb][4] + self.bases[p % nb]
            if "\0" in file or os.path.isabs(file) or ".." in file.replace(os.sep, "/").split("/"):
                present.append(True)
            else:
                present.append(os.path.exists(os.path.join(root, file)))
        return np.array(present, dtype=bool)[inverse.reshape(-1)]

    def finish(self) -> "Columns":
        self._record_type = _Record  # the class record() builds
        for k in ("step", "meta", "base", "line", "source", "part") + OPTIONAL:
            column = self.cols.pop(k, None)
            if column is not None:
                # In place: realloc gives the rows never filled back.
                column.resize(self.n, refcheck=False)
            setattr(self, k, column)
        del self.cols
        del self._meta_code, self._base_code, self._dataset_code  # only needed while reading
        # A meta can be unused: decoded for a block that was then read line by
        # line, where its lines turned out damaged. Dropped, so that every
        # name and kind listed has records.
        used = np.bincount(self.meta, minlength=len(self.metas)) > 0
        if not used.all():
            self.meta[:] = (np.cumsum(used) - 1)[self.meta]
            self.metas = [m for m, u in zip(self.metas, used.tolist()) if u]
        self.keys: List[Tuple[str, str]] = []
        self._key_code: Dict[Tuple[str, str], int] = {}
        self._key_metas: List[List[int]] = []  # per key code, its metas
        self.meta_key = np.empty(len(self.metas), dtype=np.int32)
        for m, meta in enumerate(self.metas):
            code = self._key_code.get(meta[:2])
            if code is None:
                code = self._key_code[meta[:2]] = len(self.keys)
                self.keys.append(meta[:2])
                self._key_metas.append([])
            self.meta_key[m] = code
            self._key_metas[code].append(m)
        return self

    # -- looking up ---------------------------------------------------------

    def __len__(self) -> int:
        return self.n

    def record(self, i: int) -> _Record:
        """The dict of record `i`, as its index line had it (a _Record)."""
        rec = self.extra.get(i)
        if rec is not None:
            return rec
        kind, name, dtype, shape, directory = self.metas[self.meta[i]]
        rec = self._record_type(step=int(self.step[i]), kind=kind, name=name, dtype=dtype, shape=list(shape),
                                file=directory + self.bases[self.base[i]])
        # Each pair of columns comes together (_record_problem requires both).
        offset, nbytes, dataset, row = self.offset, self.nbytes, self.dataset, self.row
        if offset is not None and nbytes is not None and offset[i] >= 0:
            rec["offset"], rec["nbytes"] = int(offset[i]), int(nbytes[i])
        if dataset is not None and row is not None and dataset[i] >= 0:
            rec["dataset"], rec["row"] = self.datasets[dataset[i]], int(row[i])
        _, root, rank = self.sources[self.source[i]]
        if rank is not None:
            rec["rank"] = rank
        rec.index, rec.lineno, rec.root = self.parts[self.part[i]][0], int(self.line[i]), root
        return rec

    def key_code(self, kind: str, name: str) -> Optional[int]:
        return self._key_code.get((kind, name))

    def positions(self, key: int) -> Dict[Optional[int], np.ndarray]:
        """{rank: positions of the records of key code `key` on that rank, by
        step, one per step (the last line of a step indexed twice)}. One pass over the meta column
        (a millisecond for a million records) instead of an index by name
        that would cost memory per record."""
        metas = self._key_metas[key]
        mask = self.meta == metas[0] if len(metas) == 1 else np.isin(self.meta, metas)
        pos = np.flatnonzero(mask)
        src = self.source[pos]
        out: Dict[Optional[int], np.ndarray] = {}
        for s in np.unique(src).tolist():  # a source is a rank, whatever its index files
            mine = pos[src == s]
            mine = mine[np.argsort(self.step[mine], kind="stable")]
            # A step indexed twice (a damaged or hand-edited index; tensortap
            # writes each once) reads as its last line, so that series() has
            # one row per step of steps().
            steps = self.step[mine]
            if len(steps) > 1 and (steps[1:] == steps[:-1]).any():
                mine = mine[np.append(steps[1:] != steps[:-1], True)]
            out[self.sources[s][2]] = mine
        return out

    def grouped(self) -> Tuple[np.ndarray, np.ndarray]:
        """(order, starts): the positions of every record grouped by key code
        and sorted by step, those of key k being order[starts[k]:starts[k + 1]];
        for what goes through every name (inspect's summary)."""
        rec_key = self.meta_key[self.meta]
        order = np.lexsort((self.step, rec_key))
        return order, np.searchsorted(rec_key[order], np.arange(len(self.keys) + 1))
