"""The twin's Recorder (what tensortap.torch.watch() returns): PyTorch
hooks that record a model's tensors as the C++ recorder names them, through
the Python writer (_writer.py) or, under engine="native", the C++ recorder
(_native.py). tensortap.torch's docstring says what it records."""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .. import _native
from .._base import KINDS, RunError, _is_int
from .._writer import RunWriter, default_options
from .settings import (ACTIVATION_KINDS, DEFAULT_KINDS, checked_arguments, forward_hookable, nonlinearity,
                       refuse_one_name, torch_module)


class Recorder:
    """What watch() returns: step(), capture(), record_grads(), close(); a
    context manager."""

    def __init__(self, model: Any, dir: Union[str, "os.PathLike[str]"], every: int = 1,
                 kinds: Iterable[str] = DEFAULT_KINDS, modules: Optional[Iterable[str]] = None,
                 rename: Optional[Dict[str, str]] = None, overwrite: bool = False,
                 steps: Optional[Iterable[int]] = None, start: int = 0, stop: Optional[int] = None,
                 capture_eval: bool = False, engine: Optional[str] = None, **options: Any) -> None:
        torch = torch_module()
        self._native = _native.choose(engine) == "native"
        if options and not self._native:
            raise ValueError(f"tensortap.torch.watch: {sorted(options)[0]}=... is a setting of the native engine "
                             "(engine='native'); the Python writer takes only watch()'s own arguments")
        self._torch = torch
        # Everything is checked before RunWriter makes the directory: a
        # refused watch() leaves no empty run behind.
        args = checked_arguments(torch, model, every, kinds, modules, rename, steps, start, stop, capture_eval)
        self._every = every
        self._start = start
        self._stop = stop
        self._steps = frozenset(args.steps)
        self._capture_eval = capture_eval
        self._kinds = frozenset(args.kinds)
        self._rename = args.rename
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
        named = args.named
        taps = [(p, self._renamed(p) or "root") for p in args.chosen]
        # The model itself ("") has no path: "root", as the C++ side names a watched Tapped<M>.
        refuse_one_name("module paths", taps)
        refuse_one_name("parameters", [(n, self._renamed(n)) for n, _ in model.named_parameters()])
        refuse_one_name("buffers", [(n, self._renamed(n)) for n, _ in model.named_buffers()])
        hookable = forward_hookable(torch, named, taps, self._kinds, args.kinds)
        functions = {n: f for n, f in ((n, nonlinearity(named[p])) for p, n in hookable) if f is not None} \
            if self._kinds & ACTIVATION_KINDS else {}
        ordered = sorted(self._kinds, key=KINDS.index)
        if self._native:
            self._writer = _native.NativeWriter(
                os.fspath(dir), _native.options_of(every, ordered, start, stop, args.steps, capture_eval, overwrite,
                                                   options), functions)
        else:
            self._writer = RunWriter(os.fspath(dir),
                                     default_options(every, ordered, start=start, stop=stop, steps=args.steps,
                                                     capture_eval=capture_eval),
                                     overwrite=overwrite, torch_version=torch.__version__, taps=functions)
        try:
            self._hook(model, named, hookable)
        except BaseException:
            self.close()
            raise

    def _hook(self, model: Any, named: Dict[str, Any], hookable: List[Tuple[str, str]]) -> None:
        """The hooks on the parameters and the watched modules."""
        # Under the native engine every hook is in place whatever the
        # kinds: a ctl capture may ask for any kind, and the engine
        # says at each call whether its kind is taken (_takes).
        if "grad" in self._kinds or self._native:
            self._unhooked = list(self._params)
            self._hook_unfrozen()
            # A parameter unfrozen during a step (after step()) takes its
            # hook before the next forward builds its graph. A
            # TorchScript model takes no pre-hook: step() looks instead.
            if self._unhooked and not isinstance(model, self._torch.jit.ScriptModule):
                self._handles.append(model.register_forward_pre_hook(self._recheck_frozen))
        if self._kinds & ACTIVATION_KINDS or self._native:
            for path, name in hookable:
                self._handles.append(named[path].register_forward_hook(self._forward_hook(name)))

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
