"""The Python twin: a PyTorch (Python) training loop recorded into the run
layout the C++ recorder writes, so that a model ported between the two can be
compared record by record (`tensortap diff`, `tensortap.diff`).

    import tensortap.torch as ttt
    rec = ttt.watch(model, "runs/py", every=1)
    for step in range(steps):
        rec.step(step)                    # parameters ("param") recorded as the step begins
        loss = loss_fn(model(x), y)
        rec.capture("loss", loss)         # kind "tensor"
        loss.backward()
        rec.record_grads(opt)             # optional: the gradients as opt applies them
        opt.step(); opt.zero_grad()
    rec.close()                           # or: with ttt.watch(...) as rec:

What it records, as the C++ side does for the same model (docs/design.md#two-runs-side-by-side);
by default every kind but "param":
- "param" and "buffer": `named_parameters()` and `named_buffers()` when a
  sampled step begins (step());
- "grad": each parameter's gradient, the sum of the step's backward passes
  (a hook on the parameter, as watch() does in C++), written when the step
  ends (the next step(), or close()); or, for the parameters an optimizer
  holds, its `.grad` as record_grads(opt) finds it (clipped, unscaled);
- "activation": the output of each watched module (by default every leaf
  module: one with no children) under its module path, a tuple's tensors
  under `<path>.0`, `<path>.1`; in training mode only, unless
  `capture_eval=True`, which records eval-mode passes as `eval/<path>`
  (as C++ does: never `<path>#1`, which is a second training pass);
- "activation_grad": the gradient flowing back into that output, from a
  tensor hook on a view of it that the module returns instead (as a C++
  `Tapped<M>` does), named and stepped when the forward ran;
- "tensor": what capture() is given.
A name captured again within a step is `name#1`, `name#2`, as in C++.
`rename` maps a module path to the name the C++ side uses (a C++ `Tap`
named "hidden" after a Python `act1`), for its activations and for its
parameters and buffers (`act1.weight` -> `hidden.weight`). Two module paths,
parameters or buffers that would be recorded under one name are refused at
watch() (ValueError), as C++ refuses two tap points under one name.

Which steps, as the C++ options: every `every`-th step counted from
`start`, within [start, stop) (`stop=None`: no end); `steps=[...]` lists
the steps instead (still within [start, stop)).

A module's output keeps its type: a tuple, a namedtuple and a
`torch.return_types` structseq (`x.max(dim=1)`, `topk`, `sort`) come back
as what they were, their tensors replaced by the views that carry the
gradient hooks; another tuple subclass is left as the module returned it,
its tensors recorded as activations but without activation gradients.

A parameter frozen at watch() (requires_grad False) cannot take a hook; the
twin looks again at every step() and before every forward of the model, so
a layer unfrozen between steps or during one is recorded from then on.

A TorchScript module (torch.jit.script, torch.jit.trace) takes no forward
hooks: its "grad", "param", "buffer" and "tensor" records are taken as
usual, and asking for its activations warns once (a TypeError when
activations are all that was asked for).

Where it differs from the C++ recorder:
- Only Format::Npy; no include/exclude patterns, per-kind periods,
  statistics, flight recorder, TensorBoard or dumps.
- It writes on the training thread, synchronously, and does not fsync
  (tensortap/_writer.py): it is a reference for comparisons, not a
  recorder to leave on.
- A module's output that is neither a tensor nor a tuple of tensors is not
  recorded (C++ refuses such a `Tapped<M>` at compile time).
- A parameter registered under two names (tied weights) is one tensor to
  `named_parameters()`, which lists it once, under its first name; the
  twin records it once, under that name.

perturb(model, ulps, seed) moves every floating parameter by a few ulps, in
place: the rounding-noise reference run of `tensortap diff --floor`.

tensortap.torch imports without PyTorch; watch() says what to install.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._base import KINDS, RunError
from . import _native
from ._writer import RunWriter, default_options

# KINDS' order. "buffer" is in, unlike C++'s default: a BatchNorm's running
# statistics are where a momentum bug shows first, and a default port check
# must not miss it. "param" is not, as in C++: every step's weights are the
# largest records, and a port check takes them once, at step 0, by asking.
DEFAULT_KINDS: Tuple[str, ...] = ("activation", "activation_grad", "buffer", "grad", "tensor")

_ACTIVATION_KINDS = frozenset(("activation", "activation_grad"))


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("tensortap.torch needs PyTorch: pip install torch "
                          "(the reader itself, tensortap.open, needs only NumPy)") from None
    return torch


def watch(model: Any, dir: Union[str, "os.PathLike[str]"], every: int = 1, kinds: Iterable[str] = DEFAULT_KINDS,
          modules: Optional[Iterable[str]] = None, rename: Optional[Dict[str, str]] = None, overwrite: bool = False,
          steps: Optional[Iterable[int]] = None, start: int = 0, stop: Optional[int] = None,
          capture_eval: bool = False, engine: Optional[str] = None, **options: Any) -> "Recorder":
    """Records `model` (a torch.nn.Module) into the run directory `dir`;
    see the module's documentation. Returns the Recorder.

    every: sample every `every`-th step counted from `start`; steps: sample
    exactly these steps instead; start, stop: only steps in [start, stop)
    (stop None: no end); kinds: default all but "param"; modules: the module
    paths whose outputs are activations (None: every leaf module); rename:
    {module path: name on disk}; capture_eval: record eval-mode forwards as
    `eval/<name>`. Every argument is checked before the run directory is
    made: a refused watch() leaves nothing behind.

    engine: "native", the C++ recorder (tensortap._engine, built by the
    LibTorch 2.x tree), or "python", this module's own writer (no build);
    None: native where the extension imports. `options`: under the native
    engine, any other setting by its TENSORTAP_OPTIONS key (format="packed",
    stats_every=1, max_bytes="2M", ...: docs/options.md)."""
    return Recorder(model, dir, every=every, kinds=kinds, modules=modules, rename=rename, overwrite=overwrite,
                    steps=steps, start=start, stop=stop, capture_eval=capture_eval, engine=engine, **options)


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse_one_name(what: str, named: Sequence[Tuple[str, str]]) -> None:
    """ValueError if two of `named` (origin, name on disk) share a name: one
    record would replace the other's file (C++ refuses two tap points under
    one name)."""
    first: Dict[str, str] = {}
    for origin, name in named:
        other = first.setdefault(name, origin)
        if other != origin:
            raise ValueError(f"tensortap.torch.watch: {what} {other!r} and {origin!r} would both be recorded as "
                             f"{name!r}, one record replacing the other: map one of them elsewhere in rename")


class Recorder:
    """What watch() returns: step(), capture(), record_grads(), close(); a
    context manager."""

    def __init__(self, model: Any, dir: Union[str, "os.PathLike[str]"], every: int = 1,
                 kinds: Iterable[str] = DEFAULT_KINDS, modules: Optional[Iterable[str]] = None,
                 rename: Optional[Dict[str, str]] = None, overwrite: bool = False,
                 steps: Optional[Iterable[int]] = None, start: int = 0, stop: Optional[int] = None,
                 capture_eval: bool = False, engine: Optional[str] = None, **options: Any) -> None:
        torch = _torch()
        self._native = _native.choose(engine) == "native"
        if options and not self._native:
            raise ValueError(f"tensortap.torch.watch: {sorted(options)[0]}=... is a setting of the native engine "
                             "(engine='native'); the Python writer takes only watch()'s own arguments")
        self._torch = torch
        # Everything is checked before RunWriter makes the directory: a
        # refused watch() leaves no empty run behind.
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
        self._every = every
        self._start = start
        self._stop = stop
        self._steps = frozenset(step_list)
        self._capture_eval = capture_eval
        self._kinds = frozenset(kinds)
        self._rename = rename
        self._mu = threading.RLock()
        self._step = 0
        self._stepped = False
        self._repeats: Dict[Tuple[str, str], int] = {}
        self._pending: Dict[str, Tuple[int, Any]] = {}
        # The step in which record_grads() recorded a parameter (by name):
        # no end-of-step record for it then, and no later pass added.
        self._taken: Dict[str, int] = {}
        self._unhooked: List[Tuple[str, Any]] = []
        self._checked_optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._checked_ids: set = set()
        self._handles: List[Any] = []
        self._writer: Optional[Union[RunWriter, _native.NativeWriter]] = None
        self._params = [(self._renamed(n), p) for n, p in model.named_parameters()]
        self._buffers = [(self._renamed(n), b) for n, b in model.named_buffers()]
        taps = [(p, self._renamed(p) or "root") for p in chosen]
        # The model itself ("") has no path: "root", as the C++ side names a watched Tapped<M>.
        _refuse_one_name("module paths", taps)
        _refuse_one_name("parameters", [(n, self._renamed(n)) for n, _ in model.named_parameters()])
        _refuse_one_name("buffers", [(n, self._renamed(n)) for n, _ in model.named_buffers()])
        hookable = self._forward_hookable(model, named, taps, kinds)
        functions = {n: f for n, f in ((n, nonlinearity(named[p])) for p, n in hookable) if f is not None} \
            if self._kinds & _ACTIVATION_KINDS else {}
        ordered = sorted(self._kinds, key=KINDS.index)
        if self._native:
            self._writer = _native.NativeWriter(
                os.fspath(dir), _native.options_of(every, ordered, start, stop, step_list, capture_eval, overwrite,
                                                   options), functions)
        else:
            self._writer = RunWriter(os.fspath(dir),
                                     default_options(every, ordered, start=start, stop=stop, steps=step_list,
                                                     capture_eval=capture_eval),
                                     overwrite=overwrite, torch_version=torch.__version__, taps=functions)
        try:
            # Under the native engine every hook is in place whatever the
            # kinds: a ctl capture may ask for any kind, and the engine
            # says at each call whether its kind is taken (_takes).
            if "grad" in self._kinds or self._native:
                self._unhooked = list(self._params)
                self._hook_unfrozen()
                # A parameter unfrozen during a step (after step()) takes its
                # hook before the next forward builds its graph. A
                # TorchScript model takes no pre-hook: step() looks instead.
                if self._unhooked and not isinstance(model, torch.jit.ScriptModule):
                    self._handles.append(model.register_forward_pre_hook(self._recheck_frozen))
            if self._kinds & _ACTIVATION_KINDS or self._native:
                for path, name in hookable:
                    self._handles.append(named[path].register_forward_hook(self._forward_hook(name)))
        except BaseException:
            self.close()
            raise

    def _forward_hookable(self, model: Any, named: Dict[str, Any], taps: List[Tuple[str, str]],
                          kinds: Tuple[str, ...]) -> List[Tuple[str, str]]:
        """The (path, name) of `taps` that can take a forward hook: not a
        TorchScript module nor inside one (its compiled forward calls no
        Python hook). Warns once about the others when activations were asked
        for; TypeError when activations were all that was asked for and no
        module can give them."""
        torch = self._torch
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
        wanted = self._kinds & _ACTIVATION_KINDS
        outers = sorted({o for o in (script_of(p) for p, _ in taps) if o is not None}, key=len)
        if not wanted or not outers:
            return hookable
        what = ", ".join("the model" if o == "" else f"module {o!r}" for o in outers[:4])
        what += f" and {len(outers) - 4} more" if len(outers) > 4 else ""
        types = type(named[outers[0]]).__name__
        if not hookable and not (self._kinds - _ACTIVATION_KINDS):
            raise TypeError(f"tensortap.torch.watch: {what} ({types}) is a TorchScript module, which takes no "
                            f"forward hooks: its {' and '.join(sorted(wanted))} cannot be recorded, and "
                            f"kinds={kinds!r} asks for nothing else (grad, param, buffer and tensor can be "
                            f"recorded; or watch the Python module before scripting it)")
        warnings.warn(f"tensortap.torch.watch: {what} ({types}) is a TorchScript module, which takes no forward "
                      f"hooks: its activations and activation gradients are not recorded (its grad, param, buffer "
                      f"and tensor records are)", stacklevel=4)
        return hookable

    # -- names and steps --------------------------------------------------

    @property
    def _w(self) -> Any:
        # Set in __init__ before any hook is registered: never None where used.
        # A RunWriter, or under engine="native" a NativeWriter.
        assert self._writer is not None
        return self._writer

    def _renamed(self, path: str) -> str:
        # The longest module path in `rename` that is `path` or a prefix of it.
        best = None
        for p in self._rename:
            if (path == p or path.startswith(p + ".")) and (best is None or len(p) > len(best)):
                best = p
        return path if best is None else self._rename[best] + path[len(best):]

    def _sampled(self, kind: Optional[str] = None) -> bool:
        # The native engine decides (full tensors, statistics, the flight
        # recorder's steps, tensortap ctl's windows), for `kind` or any.
        if self._native:
            return bool(self._w.active(kind))
        # As the C++ Sampling::full_bits: within [start, stop), then the
        # listed steps if any, else every `every`-th step counted from start.
        step = self._step
        if step < self._start or (self._stop is not None and step >= self._stop):
            return False
        if self._steps:
            return step in self._steps
        return (step - self._start) % self._every == 0

    def _takes(self, kind: str) -> bool:
        # Whether a record of `kind` is taken now. The native engine decides
        # alone: its kinds are watch()'s, and `tensortap ctl capture --kinds`
        # may name others for a window (param, buffer), as in C++.
        if self._native:
            return bool(self._w.active(kind))
        return kind in self._kinds and self._sampled(kind)

    def _repeat(self, kind: str, name: str) -> str:
        n = self._repeats.get((kind, name), 0)
        self._repeats[(kind, name)] = n + 1
        return name if n == 0 else f"{name}#{n}"

    # -- writing ----------------------------------------------------------

    def _write(self, kind: str, name: str, step: int, tensor) -> None:
        torch = self._torch
        if self._native:
            # As it is: the C++ side stores every dtype and layout, and moves
            # a CUDA tensor with its copier, not this thread.
            self._w.record(kind, name, step, tensor.detach())
            return
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

    def _hook_unfrozen(self) -> None:
        """Hooks the watched parameters that now require grad (a parameter
        that does not cannot take a hook). self._mu is held, or __init__ runs."""
        still = []
        for name, p in self._unhooked:
            if p.requires_grad:
                self._handles.append(p.register_hook(self._grad_hook(name)))
            else:
                still.append((name, p))
        self._unhooked = still

    def _recheck_frozen(self, module, inputs) -> None:
        # The model's forward pre-hook: before this forward builds the graph,
        # so a layer unfrozen during the step has its gradient recorded.
        if self._unhooked:
            with self._mu:
                if not self._w.closed:
                    self._hook_unfrozen()
        return None

    def _grad_hook(self, name: str):
        def hook(grad):
            with self._mu:
                if self._w.closed or not self._sampled("grad"):
                    return None
                step = self._step
                if self._taken.get(name) == step:
                    return None
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
                if self._w.closed or not self._sampled():
                    return None
                if module.training:
                    base = name
                elif self._capture_eval:
                    # As C++ names an eval pass: inside a scope "eval".
                    base = "eval/" + name
                else:
                    return None
                return self._tap(base, output, self._step, True)
        return hook

    def _tap(self, name: str, out, step: int, wrap: bool):
        """Records `out` (a tensor, or a tuple of them) as activations; where
        `wrap`, returns it with each tensor that needs a gradient replaced
        by a view carrying the activation_grad hook, in the type it had."""
        torch = self._torch
        if isinstance(out, torch.Tensor):
            if self._takes("activation"):
                self._write("activation", self._repeat("activation", name), step, out)
            if not wrap or not out.requires_grad or not self._takes("activation_grad"):
                return out
            grad_name = self._repeat("activation_grad", name)
            # A view, as C++ taps: the gradient of what flows on from here.
            y = out.view_as(out)
            y.register_hook(lambda g: self._grad_of_activation(grad_name, step, g))
            return y
        if isinstance(out, tuple):
            rebuild = self._rebuilder(out)
            parts = [self._tap(f"{name}.{i}", o, step, wrap and rebuild is not None) for i, o in enumerate(out)]
            if rebuild is None or not wrap or all(a is b for a, b in zip(parts, out)):
                return out
            return rebuild(parts)
        return out

    @staticmethod
    def _rebuilder(out: tuple) -> Optional[Callable[[List[Any]], Any]]:
        """How to make a tuple of `out`'s type from new parts, or None when
        its type cannot be rebuilt faithfully (the output is then left as
        the module returned it)."""
        cls = type(out)
        if cls is tuple:
            return tuple
        if hasattr(cls, "_make") and hasattr(cls, "_fields"):  # a namedtuple
            return cls._make
        # A structseq (torch.return_types.max, topk, sort): built from one
        # sequence, and only when it has no fields hidden from iteration.
        n_fields, n_seq = getattr(cls, "n_fields", None), getattr(cls, "n_sequence_fields", None)
        if isinstance(n_seq, int) and n_fields == n_seq:
            return cls
        return None

    def _grad_of_activation(self, name: str, step: int, grad) -> None:
        if not self._w.closed:
            self._write("activation_grad", name, step, grad)

    def _end_step(self) -> None:
        # The step's parameter gradients, in named_parameters() order.
        pending, self._pending = self._pending, {}
        for name, _ in self._params:
            if name in pending:
                step, acc = pending[name]
                self._write("grad", self._repeat("grad", name), step, acc)

    # -- the API ----------------------------------------------------------

    def step(self, step: int) -> None:
        """Makes `step` current: ends the previous step (its gradients are
        written), hooks parameters unfrozen since, then records parameters
        and buffers if `step` is sampled."""
        if not _is_int(step):
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
            if self._native:
                self._w.step(step)
            if self._unhooked:
                self._hook_unfrozen()
            if not self._sampled():
                return
            if self._takes("param"):
                for name, p in self._params:
                    self._write("param", name, step, p)
            if self._takes("buffer"):
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
            if self._takes(kind):
                self._write(kind, self._repeat(kind, name), self._step, tensor)

    def record_grads(self, optimizer: Any) -> None:
        """Records, for each watched parameter `optimizer` holds, its `.grad`
        as it is now (after clipping, unscaling, whatever the loop did):
        call it just before `optimizer.step()`. As C++'s
        Recorder::record_grads: once recorded in a step, a parameter gets no
        end-of-step "grad" record in that step, and backward passes after
        this call are not added to it; a parameter with no `.grad` yet is
        left to the end-of-step record. An optimizer holding none of the
        watched parameters is warned about, once."""
        groups = getattr(optimizer, "param_groups", None)
        if not isinstance(groups, list):
            raise TypeError(f"tensortap.torch: record_grads() takes a torch.optim.Optimizer (its param_groups), "
                            f"not a {type(optimizer).__name__}")
        held = {id(p) for group in groups for p in group.get("params", ())}
        with self._mu:
            if self._w.closed:
                raise RunError(f"the run {self._w.path} is closed: record_grads() recorded nothing")
            if not self._stepped:
                raise RunError("tensortap.torch: record_grads() before the first step(): call rec.step(s) at "
                               "the start of each iteration")
            self._check_optimizer(optimizer, held)
            if not self._takes("grad"):
                return
            step = self._step
            for name, p in self._params:
                if id(p) not in held or p.grad is None:
                    continue
                self._write("grad", self._repeat("grad", name), step, p.grad)
                self._taken[name] = step
                self._pending.pop(name, None)

    def _check_optimizer(self, optimizer: Any, held: set) -> None:
        # Once per optimizer: one that trains nothing this recorder watches
        # would record nothing, and silently.
        try:
            if optimizer in self._checked_optimizers:
                return
            self._checked_optimizers.add(optimizer)
        except TypeError:  # not weakly referenceable: by id, for the recorder's life
            if id(optimizer) in self._checked_ids:
                return
            self._checked_ids.add(id(optimizer))
        if not any(id(p) in held for _, p in self._params):
            warnings.warn(f"tensortap.torch: run {self._w.path}: record_grads(): none of the optimizer's "
                          f"{len(held)} parameters is one this recorder watches (it watches {len(self._params)}): "
                          f"nothing is recorded for it. watch() the module the optimizer trains", stacklevel=3)

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
                self._unhooked = []
                self._writer.close()

    def flush(self) -> None:
        """Waits until every record taken so far is on disk and indexed
        (the Python writer writes each at once: nothing to wait for)."""
        if self._native:
            self._w.flush()

    def dump(self) -> None:
        """The flight recorder's held steps written now (engine="native",
        with flight_recorder=k)."""
        if not self._native:
            raise RunError("tensortap.torch: dump() needs the native engine's flight recorder (engine='native', "
                           "flight_recorder=k)")
        self._w.dump()

    @property
    def engine(self) -> str:
        """"native" or "python"."""
        return "native" if self._native else "python"

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


# -- perturb ------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_CHUNK = 1 << 20  # elements per pass: bounds perturb's temporaries (about 40 MiB)


def _float_formats(torch) -> Dict[Any, Tuple[Any, int, int]]:
    """dtype -> (the integer dtype of its bits, their width, the bits of
    +inf). The largest finite value's bits are +inf's minus one in each."""
    return {torch.float16: (torch.int16, 16, 0x7C00), torch.bfloat16: (torch.int16, 16, 0x7F80),
            torch.float32: (torch.int32, 32, 0x7F800000), torch.float64: (torch.int64, 64, 0x7FF0000000000000)}


def _fnv1a64(data: bytes) -> int:
    # FNV-1a 64 with its published offset basis. Not _writer's _fnv1a: that
    # one (as writers/src/paths.cpp's) starts from 1469598103934665603, a
    # digit short of the basis, and must stay so for the names on disk.
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & _MASK64
    return h


def _directions(name: str, seed: int, first: int, count: int) -> np.ndarray:
    """Whether elements first..first+count-1 of parameter `name` move up:
    bit 63 of splitmix64's finaliser of state + (k + 1) * golden, the state
    the FNV-1a 64 hash of the name's UTF-8 XOR seed * golden (all mod 2^64)."""
    state = _fnv1a64(name.encode("utf-8")) ^ ((seed * _GOLDEN) & _MASK64)
    k = np.arange(first + 1, first + count + 1, dtype=np.uint64)
    # uint64 arrays wrap mod 2^64, silently, as the C++ does.
    z = np.uint64(state) + k * np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(63)) == 1


def _moved_bits(bits: np.ndarray, width: int, inf_bits: int, up: np.ndarray, ulps: int) -> np.ndarray:
    """Float bit patterns (`bits`, a signed integer array of `width` bits)
    each moved `ulps` representable values up (toward +inf) where `up`,
    down elsewhere. Sign and magnitude become one ordered integer, -m .. +m
    (both zeros 0), moved and clamped to the finite range (the largest
    finite value stays); a result of 0 keeps the sign the value had (a
    value walking toward zero ends on its own side's zero, as nextafter);
    NaN and the infinities stay as they are."""
    wide = bits.astype(np.int64)
    if width < 64:
        wide &= (1 << width) - 1  # the unsigned pattern
    sign_bit = np.int64(-(1 << 63)) if width == 64 else np.int64(1 << (width - 1))
    negative = (wide & sign_bit) != 0
    magnitude = wide & np.int64((1 << (width - 1)) - 1)
    finite = magnitude < inf_bits
    largest = inf_bits - 1
    ordinal = np.where(negative, -magnitude, magnitude)
    # |ordinal| <= 0x7FEF...F and ulps <= 1024: no int64 overflow.
    moved = np.clip(ordinal + np.where(up, ulps, -ulps), -largest, largest)
    out = np.abs(moved) | np.where((moved < 0) | ((moved == 0) & negative), sign_bit, np.int64(0))
    out = np.where(finite, out, wide)
    unsigned = {16: np.uint16, 32: np.uint32, 64: np.uint64}[width]
    signed = {16: np.int16, 32: np.int32, 64: np.int64}[width]
    return out.astype(unsigned).view(signed) if width < 64 else out


def perturb(model: Any, ulps: int = 1, seed: int = 0) -> None:
    """Moves every floating parameter of `model` by `ulps` ulps, each element
    up or down by a pseudo-random direction, in place (under no_grad): the
    run of a program perturbed so differs from the original by rounding
    alone (`tensortap diff --floor`). C++'s tensortap::perturb(module, ulps,
    seed) moves the same parameters to the same bits. The specification:

    - The parameters of `model.named_parameters()`, in its order (a tied
      weight once, under its first name). Only float16, bfloat16, float32
      and float64 ones; others (integer, complex, float8) are left alone.
      `ulps` an int in 1..1024, `seed` an int in 0..2^64-1 (ValueError
      otherwise). Returns None.
    - key = FNV-1a 64 of the parameter's name in UTF-8 (offset basis
      0xcbf29ce484222325, prime 0x100000001b3); state = key XOR
      (seed * 0x9E3779B97F4A7C15); all arithmetic mod 2^64.
    - The element of flat index k (0-based, row-major over the parameter's
      shape, as `p.reshape(-1)`, whatever its strides):
      z = state + (k + 1) * 0x9E3779B97F4A7C15; then
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z = z ^ (z >> 31).
      It moves up (toward +inf) when bit 63 of z is 1, down otherwise.
    - A move is `ulps` steps in the parameter's own dtype. One step up from
      a finite x: the next representable value above it; +0 and -0 both go
      to the smallest positive subnormal; the largest finite value stays
      (never inf). Down: the mirror (+0 and -0 go to minus the smallest
      subnormal; the most negative finite value stays). A step toward zero
      from the smallest subnormal of either sign gives the zero of that
      sign (as C's nextafter), and the next step crosses to the other side.
      NaN and +-inf are unchanged.
    """
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tensortap.torch.perturb: model must be a torch.nn.Module, not {type(model).__name__}")
    if not _is_int(ulps) or not 1 <= ulps <= 1024:
        raise ValueError(f"tensortap.torch.perturb: ulps must be an integer from 1 to 1024, not {ulps!r}")
    if not _is_int(seed) or not 0 <= seed <= _MASK64:
        raise ValueError(f"tensortap.torch.perturb: seed must be an integer from 0 to 2^64-1, not {seed!r}")
    formats = _float_formats(torch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype not in formats or p.numel() == 0:
                continue
            if p.is_meta:
                raise ValueError(f"tensortap.torch.perturb: parameter {name!r} is on the meta device: "
                                 "it has no values to move")
            int_dtype, width, inf_bits = formats[p.dtype]
            # Logical (row-major) order whatever the strides; on the host.
            flat = p.detach().reshape(-1).to("cpu", copy=True).contiguous()
            bits = flat.view(int_dtype).numpy()
            for first in range(0, bits.size, _CHUNK):
                part = bits[first:first + _CHUNK]
                up = _directions(name, seed, first, part.size)
                part[...] = _moved_bits(part, width, inf_bits, up, ulps)
            p.copy_(flat.view(p.shape))


__all__ = ["watch", "Recorder", "DEFAULT_KINDS", "perturb"]
