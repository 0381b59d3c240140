"""Read tensortap runs with NumPy.

    import tensortap
    run = tensortap.open("runs/exp1")
    run.kinds()                               # ['activation', 'grad', ...]
    run.names("grad")                         # ['fc1.bias', 'fc1.weight', ...]
    run.steps("fc1.weight", kind="grad")      # [0, 10, 20, ...]
    g = run.load("fc1.weight", 10, kind="grad")   # np.ndarray, memory-mapped
    w = run.series("fc1.weight", kind="grad")     # [n_steps, 128, 32]
"""

import builtins
import json
import os

import numpy as np

__all__ = ["open", "Run"]

_KINDS = ("activation", "activation_grad", "param", "grad", "tensor")


def open(path):  # noqa: A001 - the documented name
    """Opens the run directory `path`."""
    return Run(path)


class Run:
    """A run directory written by tensortap (Format::Npy)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        meta = os.path.join(self.path, "run.json")
        if not os.path.isfile(meta):
            raise FileNotFoundError(f"{self.path}: not a tensortap run (no run.json)")
        with builtins.open(meta) as f:
            self.info = json.load(f)
        self.records = _read_index(os.path.join(self.path, "index.jsonl"))
        self._by_key = {}
        for r in self.records:
            self._by_key.setdefault((r["kind"], r["name"]), []).append(r)
        for rs in self._by_key.values():
            rs.sort(key=lambda r: r["step"])

    @property
    def closed(self):
        """Whether the run was closed cleanly (False after a crash)."""
        return bool(self.info.get("closed", False))

    def kinds(self):
        """The kinds present, in tensortap's order."""
        present = {k for k, _ in self._by_key}
        return [k for k in _KINDS if k in present]

    def names(self, kind=None):
        """The sorted names captured, of one kind or of all."""
        return sorted({n for k, n in self._by_key if kind is None or k == kind})

    def steps(self, name, kind):
        """The steps at which `name` was captured as `kind`."""
        return [r["step"] for r in self._records(name, kind)]

    def load(self, name, step, kind, mmap=True):
        """The array of `name` at `step`; memory-mapped unless mmap=False."""
        for r in self._records(name, kind):
            if r["step"] == step:
                return np.load(os.path.join(self.path, r["file"]), mmap_mode="r" if mmap else None)
        raise KeyError(f"{self.path}: no {kind} record of {name!r} at step {step}")

    def series(self, name, kind):
        """Every captured step of `name` stacked: shape [n_steps, *shape]."""
        rs = self._records(name, kind)
        arrays = [np.load(os.path.join(self.path, r["file"])) for r in rs]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError(f"{name!r} ({kind}) changes shape between steps: {sorted(shapes)}; "
                             "use load() per step")
        return np.stack(arrays) if arrays else np.empty((0,))

    def _records(self, name, kind):
        try:
            return self._by_key[(kind, name)]
        except KeyError:
            raise KeyError(f"{self.path}: no {kind} records of {name!r}; "
                           f"names of that kind: {self.names(kind)}") from None


def _read_index(path):
    records = []
    if not os.path.exists(path):
        return records
    with builtins.open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            # A crash can tear the last line; anything else is corruption.
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON line") from None
    return records
