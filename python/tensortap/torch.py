"""The Python twin: a PyTorch (Python) training loop recorded into the run
layout the C++ recorder writes, so that a model ported between the two can be
compared record by record (`tensortap diff`, `tensortap.diff`).

    import tensortap.torch as ttt
    rec = ttt.watch(model, "runs/py", every=1)
    for step in range(steps):
        rec.step(step)                    # parameters ("param") recorded as the step begins
        loss = loss_fn(model(x), y)
        rec.capture("loss", loss)         # kind "tensor"
        loss.backward(); opt.step(); opt.zero_grad()
    rec.close()                           # or: with ttt.watch(...) as rec:

What it records, as the C++ side does for the same model (DESIGN.md
section 9):
- "param" and "buffer": `named_parameters()` and `named_buffers()` when a
  sampled step begins (step());
- "grad": each parameter's gradient, the sum of the step's backward passes
  (a hook on the parameter, as watch() does in C++), written when the step
  ends (the next step(), or close());
- "activation": the output of each watched module (by default every leaf
  module: one with no children) under its module path, a tuple's tensors
  under `<path>.0`, `<path>.1`; only in training mode, as the C++ default
  (`capture_eval` off);
- "activation_grad": the gradient flowing back into that output, from a
  tensor hook on a view of it that the module returns instead (as a C++
  `Tapped<M>` does), named and stepped when the forward ran;
- "tensor": what capture() is given.
A name captured again within a step is `name#1`, `name#2`, as in C++.
`rename` maps a module path to the name the C++ side uses (a C++ `Tap`
named "hidden" after a Python `act1`), for its activations and for its
parameters and buffers (`act1.weight` -> `hidden.weight`).

Where it differs from the C++ recorder:
- Only Format::Npy, every N steps (`every`); no include/exclude patterns,
  statistics, flight recorder, TensorBoard or dumps.
- It writes on the training thread, synchronously, and does not fsync
  (tensortap/_writer.py): it is a reference for comparisons, not a
  recorder to leave on.
- A module's output that is neither a tensor nor a tuple of tensors is not
  recorded (C++ refuses such a `Tapped<M>` at compile time).
- A parameter registered under two names (tied weights) is one tensor to
  `named_parameters()`, which lists it once, under its first name; the
  twin records it once, under that name.

tensortap.torch imports without PyTorch; watch() says what to install.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ._base import KINDS, RunError
from ._writer import RunWriter, default_options

DEFAULT_KINDS: Tuple[str, ...] = ("activation", "activation_grad", "grad", "tensor")


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("tensortap.torch needs PyTorch: pip install torch "
                          "(the reader itself, tensortap.open, needs only NumPy)") from None
    return torch


def watch(model: Any, dir: Union[str, "os.PathLike[str]"], every: int = 1, kinds: Iterable[str] = DEFAULT_KINDS, modules: Optional[Iterable[str]] = None,
          rename: Optional[Dict[str, str]] = None, overwrite: bool = False) -> "Recorder":
    """Records `model` (a torch.nn.Module) into the run directory `dir`;
    see the module's documentation. Returns the Recorder."""
    return Recorder(model, dir, every=every, kinds=kinds, modules=modules, rename=rename, overwrite=overwrite)


class Recorder:
    """What watch() returns: step(), capture(), close(); a context manager."""

    def __init__(self, model: Any, dir: Union[str, "os.PathLike[str]"], every: int = 1, kinds: Iterable[str] = DEFAULT_KINDS,
                 modules: Optional[Iterable[str]] = None, rename: Optional[Dict[str, str]] = None,
                 overwrite: bool = False) -> None:
        torch = _torch()
        self._torch = torch
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"tensortap.torch.watch: model must be a torch.nn.Module, not {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"tensortap.torch.watch: every must be an integer >= 1, not {every!r}")
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
            raise ValueError(f"tensortap.torch.watch: rename names {unknown[0]!r}, which is no module path of the model")
        self._every = every
        self._kinds = frozenset(kinds)
        self._rename = rename
        self._mu = threading.RLock()
        self._step = 0
        self._stepped = False
        self._repeats: Dict[Tuple[str, str], int] = {}
        self._pending: Dict[str, Tuple[int, Any]] = {}
        self._handles: List[Any] = []
        self._writer: Optional[RunWriter] = None
        self._params = [(self._renamed(n), p) for n, p in model.named_parameters()]
        self._buffers = [(self._renamed(n), b) for n, b in model.named_buffers()]
        self._writer = RunWriter(os.fspath(dir), default_options(every, sorted(self._kinds, key=KINDS.index)),
                                 overwrite=overwrite, torch_version=torch.__version__)
        try:
            if "grad" in self._kinds:
                for name, p in self._params:
                    if p.requires_grad:
                        self._handles.append(p.register_hook(self._grad_hook(name)))
            if "activation" in self._kinds or "activation_grad" in self._kinds:
                for path in chosen:
                    # The model itself ("") has no path: "root", as the C++ side names a watched Tapped<M>.
                    name = self._renamed(path) or "root"
                    self._handles.append(named[path].register_forward_hook(self._forward_hook(name)))
        except BaseException:
            self.close()
            raise

    # -- names and steps --------------------------------------------------


    @property
    def _w(self) -> RunWriter:
        # Set in __init__ before any hook is registered: never None where used.
        assert self._writer is not None
        return self._writer
    def _renamed(self, path: str) -> str:
        # The longest module path in `rename` that is `path` or a prefix of it.
        best = None
        for p in self._rename:
            if (path == p or path.startswith(p + ".")) and (best is None or len(p) > len(best)):
                best = p
        return path if best is None else self._rename[best] + path[len(best):]

    def _sampled(self) -> bool:
        return self._step >= 0 and self._step % self._every == 0

    def _repeat(self, kind: str, name: str) -> str:
        n = self._repeats.get((kind, name), 0)
        self._repeats[(kind, name)] = n + 1
        return name if n == 0 else f"{name}#{n}"

    # -- writing ----------------------------------------------------------

    def _write(self, kind: str, name: str, step: int, tensor) -> None:
        torch = self._torch
        t = tensor.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        t = t.cpu().resolve_conj().resolve_neg()
        dtype = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            array = t.float().numpy()
        elif dtype.startswith("float8"):
            array = t.view(torch.uint8).numpy()
        else:
            array = t.numpy()
        with self._mu:
            self._w.write(kind, name, step, array, dtype)

    def _grad_hook(self, name: str):
        def hook(grad):
            with self._mu:
                if self._w.closed or not self._sampled():
                    return None
                step = self._step
                held = self._pending.get(name)
                g = grad.to_dense() if grad.layout != self._torch.strided else grad
                if held is not None and held[0] == step:
                    held[1].add_(g)
                else:
                    self._pending[name] = (step, g.detach().clone(memory_format=self._torch.contiguous_format))
            return None
        return hook

    def _forward_hook(self, name: str):
        def hook(module, inputs, output):
            with self._mu:
                if self._w.closed or not self._sampled() or not module.training:
                    return None
                return self._tap(name, output, self._step)
        return hook

    def _tap(self, name: str, out, step: int):
        torch = self._torch
        if isinstance(out, torch.Tensor):
            if "activation" in self._kinds:
                self._write("activation", self._repeat("activation", name), step, out)
            if "activation_grad" not in self._kinds or not out.requires_grad:
                return out
            grad_name = self._repeat("activation_grad", name)
            # A view, as C++ taps: the gradient of what flows on from here.
            y = out.view_as(out)
            y.register_hook(lambda g: self._grad_of_activation(grad_name, step, g))
            return y
        if isinstance(out, tuple):
            parts = [self._tap(f"{name}.{i}", o, step) for i, o in enumerate(out)]
            return type(out)(*parts) if hasattr(out, "_fields") else tuple(parts)
        return out

    def _grad_of_activation(self, name: str, step: int, grad) -> None:
        if not self._w.closed:
            self._write("activation_grad", name, step, grad)

    def _end_step(self) -> None:
        # The step's parameter gradients, in named_parameters() order.
        pending, self._pending = self._pending, {}
        for name, _ in self._params:
            if name in pending:
                step, acc = pending[name]
                self._write("grad", name, step, acc)

    # -- the API ----------------------------------------------------------

    def step(self, step: int) -> None:
        """Makes `step` current: ends the previous step (its gradients are
        written), then records parameters and buffers if `step` is sampled."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"tensortap.torch: step must be an integer, not {step!r}")
        # As the C++ recorder: steps are 0 to 2^47 and increase.
        if not 0 <= step < 1 << 47:
            raise ValueError(f"tensortap.torch: step({step}): steps must be 0 or more and below 2^47")
        with self._mu:
            if self._w.closed:
                raise RunError(f"the run {self._w.path} is closed")
            if self._stepped and step <= self._step:
                raise ValueError(f"tensortap.torch: step({step}) after step({self._step}): steps must increase")
            self._stepped = True
            self._end_step()
            self._step = step
            self._repeats.clear()
            if not self._sampled():
                return
            if "param" in self._kinds:
                for name, p in self._params:
                    self._write("param", name, step, p)
            if "buffer" in self._kinds:
                for name, b in self._buffers:
                    if b is not None:
                        self._write("buffer", name, step, b)

    def capture(self, name: str, tensor: Any, kind: str = "tensor") -> None:
        """Records `tensor` under `name` (kind "tensor" unless given) at the
        current step, if it is sampled."""
        if not isinstance(name, str):
            raise TypeError(f"tensortap.torch: a record's name must be a string, not {name!r}")
        if kind not in KINDS:
            raise ValueError(f"tensortap.torch: unknown kind {kind!r} for {name!r}: one of {', '.join(KINDS)}")
        if not isinstance(tensor, self._torch.Tensor):
            raise TypeError(f"tensortap.torch: {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        with self._mu:
            if self._w.closed:
                raise RunError(f"the run {self._w.path} is closed: {name!r} not recorded")
            if kind in self._kinds and self._sampled():
                self._write(kind, self._repeat(kind, name), self._step, tensor)

    def close(self) -> None:
        """Writes the last step's gradients, removes the hooks and closes the
        run (run.json says closed). Calling it again does nothing."""
        with self._mu:
            if self._writer is None or self._writer.closed:
                return
            try:
                self._end_step()
            finally:
                for h in self._handles:
                    h.remove()
                self._handles.clear()
                self._writer.close()

    @property
    def path(self) -> str:
        """The directory this rank writes (the run directory, or its rank<r>/)."""
        return self._w.path

    @property
    def records(self) -> int:
        return self._w.records

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["watch", "Recorder", "DEFAULT_KINDS"]
