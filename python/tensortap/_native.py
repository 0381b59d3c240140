"""tensortap.torch's native engine: the C++ recorder (`tensortap._engine`,
built with the 2.x tree) behind the twin's hooks. The hooks keep deciding
names, repeats and a step's gradient sums, as with the Python writer; the
records go through the C++ front end, its copier and writer thread, so a
Python job gets packed and HDF5 runs, statistics, the flight recorder and
its rules, the disk budget, the watchdog, `tensortap ctl` and TensorBoard.

Its settings are TENSORTAP_OPTIONS' keys (docs/options.md), as Python
values: `format="packed"`, `stats_every=1`, `max_bytes="2M"`,
`on_budget="keep_latest"`, `kinds=["grad", "activation"]`."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

_SAID: List[str] = []


def load() -> Optional[Any]:
    """The extension module, or None where it was not built (the 1.13 tree,
    no Python headers, pip without CMake)."""
    try:
        from . import _engine  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _engine


def choose(engine: Optional[str]) -> str:
    """"native" or "python": as given, or native when the extension imports
    (said once on stderr which one a default chose)."""
    if engine not in (None, "native", "python"):
        raise ValueError(f"tensortap.torch.watch: engine must be 'native' or 'python', not {engine!r}")
    if engine == "native" and load() is None:
        raise ImportError("tensortap.torch.watch(engine='native'): tensortap._engine is not built here (the C++ "
                          "recorder for Python: `pip install --no-build-isolation ./python` from a clone builds it "
                          "where torch imports and cmake is on PATH, as does the LibTorch 2.x tree; "
                          "docs/python.md); engine='python' needs no build")
    if engine is not None:
        return engine
    chosen = "native" if load() is not None else "python"
    if not _SAID:
        _SAID.append(chosen)
        why = "tensortap._engine imports" if chosen == "native" else "tensortap._engine is not built"
        print(f"tensortap.torch: engine '{chosen}' ({why}; watch(..., engine=...) chooses)", file=sys.stderr)
    return chosen


class NativeWriter:
    """What the twin's hooks write through under engine="native": the
    attributes of RunWriter that they use (path, closed, records, close)
    and record()."""

    def __init__(self, path: str, options: Dict[str, Any], taps: Dict[str, str]) -> None:
        engine = load()
        assert engine is not None  # choose() said so
        try:
            self._rec = engine.Recorder(os.fspath(path), options)
        except RuntimeError as e:  # the library's refusal, by name
            raise ValueError(str(e)) from None
        if taps:
            self._rec.add_taps(sorted(taps.items()))

    @property
    def path(self) -> str:
        return str(self._rec.path)

    @property
    def closed(self) -> bool:
        return bool(self._rec.closed)

    @property
    def records(self) -> int:
        return int(self._rec.counters()["records"])

    def counters(self) -> Dict[str, int]:
        return dict(self._rec.counters())

    def step(self, step: int) -> None:
        self._rec.step(step)

    def active(self, kind: Optional[str] = None) -> bool:
        """Whether the current step takes records of `kind` (any kind: None),
        in full or as statistics."""
        return bool(self._rec.any_active() if kind is None else self._rec.active(kind))

    def record(self, kind: str, name: str, step: int, tensor: Any) -> None:
        self._rec.record(kind, name, step, tensor)

    def capture(self, name: str, tensor: Any) -> None:
        self._rec.capture(name, tensor)

    def dump(self) -> None:
        self._rec.dump()

    def flush(self) -> None:
        self._rec.flush()

    def close(self) -> None:
        self._rec.close()


def options_of(every: int, kinds: Sequence[str], start: int, stop: Optional[int], steps: Sequence[int],
               capture_eval: bool, overwrite: bool, extra: Dict[str, Any]) -> Dict[str, Any]:
    """The engine's settings: the twin's arguments under their keys, then
    the rest as given (the option table refuses an unknown key by name)."""
    options: Dict[str, Any] = {"every": every, "kinds": list(kinds), "start": start, "stop": stop,
                               "capture_eval": capture_eval, "overwrite": overwrite}
    if steps:
        options["steps"] = list(steps)
    for key, value in extra.items():
        if key in options:
            raise ValueError(f"tensortap.torch.watch: {key} is an argument of watch() itself")
        options[key] = value
    return options


__all__: Tuple[str, ...] = ("load", "choose", "NativeWriter", "options_of")
