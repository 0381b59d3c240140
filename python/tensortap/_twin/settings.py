"""watch()'s arguments, checked before anything is made (a refused watch()
leaves no run directory behind), and what the twin knows of PyTorch's
modules: their nonlinearities, which of them take a forward hook."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .._base import KINDS, _is_int

# KINDS' order. "buffer" is in, unlike C++'s default: a BatchNorm's running
# statistics are where a momentum bug shows first, and a default port check
# must not miss it. "param" is not, as in C++: every step's weights are the
# largest records, and a port check takes them once, at step 0, by asking.
DEFAULT_KINDS: Tuple[str, ...] = ("activation", "activation_grad", "buffer", "grad", "tensor")

ACTIVATION_KINDS = frozenset(("activation", "activation_grad"))


def torch_module() -> Any:
    """PyTorch, imported when the twin is used: tensortap.torch imports without it."""
    try:
        import torch
    except ImportError:
        raise ImportError("tensortap.torch needs PyTorch: pip install torch "
                          "(the reader itself, tensortap.open, needs only NumPy)") from None
    return torch


# A module type's nonlinearity, as run.json's "taps" spells it
# (docs/design.md#runjson): the doctor judges these taps by it, whatever their names.
# By type name, so that no torch class is imported for it.
_NONLINEARITIES = {"ReLU": "relu", "ReLU6": "relu6", "LeakyReLU": "leaky_relu", "PReLU": "prelu", "RReLU": "rrelu",
                   "Tanh": "tanh", "Sigmoid": "sigmoid", "Hardtanh": "hardtanh", "Hardsigmoid": "hardsigmoid",
                   "GELU": "gelu", "SiLU": "silu", "ELU": "elu", "SELU": "selu", "CELU": "celu", "Mish": "mish",
                   "Softplus": "softplus", "Softsign": "softsign", "Tanhshrink": "tanhshrink",
                   "LogSigmoid": "logsigmoid", "Hardswish": "hardswish"}


def nonlinearity(module: Any) -> Optional[str]:
    """The nonlinearity of a torch.nn activation module (torch.nn.ReLU:
    "relu"), or None for any other module, a subclass of one included: its
    forward may be anything."""
    cls = type(module)
    name = _NONLINEARITIES.get(cls.__name__)
    return name if name is not None and cls.__module__.startswith("torch.nn.") else None


def refuse_one_name(what: str, named: Sequence[Tuple[str, str]]) -> None:
    """ValueError if two of `named` (origin, name on disk) share a name: one
    record would replace the other's file (C++ refuses two tap points under
    one name)."""
    first: Dict[str, str] = {}
    for origin, name in named:
        other = first.setdefault(name, origin)
        if other != origin:
            raise ValueError(f"tensortap.torch.watch: {what} {other!r} and {origin!r} would both be recorded as "
                             f"{name!r}, one record replacing the other: map one of them elsewhere in rename")


@dataclass
class Arguments:
    """watch()'s arguments that need more than a look, as checked."""
    steps: List[int]
    kinds: Tuple[str, ...]
    rename: Dict[str, str]
    named: Dict[str, Any]
    """The model's modules by path (named_modules())."""
    chosen: List[str]
    """The module paths whose outputs are activations."""


def checked_arguments(torch: Any, model: Any, every: int, kinds: Iterable[str], modules: Optional[Iterable[str]],
                      rename: Optional[Dict[str, str]], steps: Optional[Iterable[int]], start: int,
                      stop: Optional[int], capture_eval: bool) -> Arguments:
    """watch()'s arguments checked, in the order they are documented: the
    first wrong one is named (TypeError, ValueError)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tensortap.torch.watch: model must be a torch.nn.Module, not {type(model).__name__}")
    if not _is_int(every) or every < 1:
        raise ValueError(f"tensortap.torch.watch: every must be an integer >= 1, not {every!r}")
    if not _is_int(start) or start < 0:
        raise ValueError(f"tensortap.torch.watch: start must be an integer >= 0, not {start!r}")
    if stop is not None and (not _is_int(stop) or stop < 0):
        raise ValueError(f"tensortap.torch.watch: stop must be None (no end) or an integer >= 0, not {stop!r}")
    if steps is None:
        step_list: List[int] = []
    elif isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        raise TypeError(f"tensortap.torch.watch: steps must be a list of integers, not {steps!r}")
    else:
        step_list = list(steps)
        bad = [s for s in step_list if not _is_int(s) or s < 0]
        if bad:
            raise ValueError(f"tensortap.torch.watch: steps holds {bad[0]!r}: steps are integers >= 0")
    if not isinstance(capture_eval, bool):
        raise TypeError(f"tensortap.torch.watch: capture_eval must be True or False, not {capture_eval!r}")
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"tensortap.torch.watch: unknown kind {k!r}: one of {', '.join(KINDS)}")
    rename = dict(rename or {})
    for path, name in rename.items():
        if not isinstance(path, str) or not isinstance(name, str) or not name:
            raise ValueError(f"tensortap.torch.watch: rename maps module paths to non-empty names, "
                             f"not {path!r} -> {name!r}")
    named = dict(model.named_modules())
    if modules is None:
        chosen = [p for p, m in named.items() if p and not any(True for _ in m.children())]
    else:
        chosen = [modules] if isinstance(modules, str) else list(modules)
        missing = [p for p in chosen if p not in named]
        if missing:
            raise ValueError(f"tensortap.torch.watch: no module {missing[0]!r} in the model "
                             f"(its paths: {', '.join(list(p for p in named if p)[:8])}...)")
    unknown = [p for p in rename if p not in named]
    if unknown:
        raise ValueError(f"tensortap.torch.watch: rename names {unknown[0]!r}, "
                         "which is no module path of the model")
    return Arguments(step_list, kinds, rename, named, chosen)


def forward_hookable(torch: Any, named: Dict[str, Any], taps: List[Tuple[str, str]], wanted_kinds: frozenset,
                     kinds: Tuple[str, ...]) -> List[Tuple[str, str]]:
    """The (path, name) of `taps` that can take a forward hook: not a
    TorchScript module nor inside one (its compiled forward calls no
    Python hook). Warns once about the others when activations were asked
    for; TypeError when activations were all that was asked for and no
    module can give them. Called by Recorder.__init__ from watch(): the
    warning names the caller of watch()."""
    scripted = [p for p, m in named.items() if isinstance(m, torch.jit.ScriptModule)]

    def inside(path: str, outer: str) -> bool:
        return outer == "" or path == outer or path.startswith(outer + ".")

    def script_of(path: str) -> Optional[str]:
        # The outermost TorchScript module holding `path`: the one to name.
        for outer in sorted(scripted, key=len):
            if inside(path, outer):
                return outer
        return None

    hookable = [(p, n) for p, n in taps if script_of(p) is None]
    wanted = wanted_kinds & ACTIVATION_KINDS
    outers = sorted({o for o in (script_of(p) for p, _ in taps) if o is not None}, key=len)
    if not wanted or not outers:
        return hookable
    what = ", ".join("the model" if o == "" else f"module {o!r}" for o in outers[:4])
    what += f" and {len(outers) - 4} more" if len(outers) > 4 else ""
    types = type(named[outers[0]]).__name__
    if not hookable and not (wanted_kinds - ACTIVATION_KINDS):
        raise TypeError(f"tensortap.torch.watch: {what} ({types}) is a TorchScript module, which takes no "
                        f"forward hooks: its {' and '.join(sorted(wanted))} cannot be recorded, and "
                        f"kinds={kinds!r} asks for nothing else (grad, param, buffer and tensor can be "
                        f"recorded; or watch the Python module before scripting it)")
    warnings.warn(f"tensortap.torch.watch: {what} ({types}) is a TorchScript module, which takes no forward "
                  f"hooks: its activations and activation gradients are not recorded (its grad, param, buffer "
                  f"and tensor records are)", stacklevel=4)
    return hookable
