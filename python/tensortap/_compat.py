"""Spellings of the reader's API that still work, with a DeprecationWarning,
for one release after they changed."""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from types import ModuleType
from typing import Any, Callable, TypeVar

from ._base import _short

F = TypeVar("F", bound=Callable[..., Any])


def keyword_only(method: F) -> F:
    """`method`, whose keyword-only arguments were once positional, in the
    order they are declared (Run.load(name, step, kind, rank, mmap) became
    load(name, step, *, kind, rank, mmap)): a call that still passes them by
    position works as before, with a DeprecationWarning that says how to
    write it now. Its signature (help(), inspect) is the new one."""
    params = list(inspect.signature(method).parameters.values())
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]  # self first
    moved = [p.name for p in params if p.kind is p.KEYWORD_ONLY]

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        extra = args[len(positional):]
        if not extra or len(extra) > len(moved):
            # The new spelling; or too many arguments for either: Python says so.
            return method(*args, **kwargs)
        given = dict(zip(moved, extra))
        for name in given:
            if name in kwargs:
                raise TypeError(f"{method.__qualname__}() got multiple values for argument {name!r}")
        now = ", ".join(positional[1:] + [f"{k}={_short(v)}" for k, v in given.items()])
        warnings.warn(f"{method.__qualname__}(): passing {', '.join(given)} by position is deprecated and will "
                      f"stop working in the next release; pass by keyword: run.{method.__name__}({now})",
                      DeprecationWarning, stacklevel=2)
        return method(*args[:len(positional)], **given, **kwargs)

    return wrapper  # type: ignore[return-value]


def moved_module(old: str, new: str) -> ModuleType:
    """The module `new`, for the stub left at `old` when a module became
    private: the stub puts it in sys.modules under its old name, so an old
    import gets every name it had (and a patch of one patches the module that
    uses it). The warning comes once, from the first import."""
    warnings.warn(f"{old} is private now ({new}) and will be removed in the next release; "
                  "use tensortap's own names (tensortap.open, Run, diff, doctor) or `python -m tensortap`",
                  DeprecationWarning, stacklevel=3)
    return importlib.import_module(new)
