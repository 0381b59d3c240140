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
from typing import Any, Dict, Iterable, Optional, Union

# The twin lives in _twin/ (a file a part); these are its public names, and
# the perturbation's parts the tests check bit by bit.
from ._twin.perturb import _directions, _float_formats, _fnv1a64, _moved_bits, perturb  # noqa: F401
from ._twin.recorder import Recorder
from ._twin.settings import DEFAULT_KINDS, nonlinearity  # noqa: F401


def watch(model: Any, dir: Union[str, "os.PathLike[str]"], every: int = 1, kinds: Iterable[str] = DEFAULT_KINDS,
          modules: Optional[Iterable[str]] = None, rename: Optional[Dict[str, str]] = None, overwrite: bool = False,
          steps: Optional[Iterable[int]] = None, start: int = 0, stop: Optional[int] = None,
          capture_eval: bool = False, engine: Optional[str] = None, **options: Any) -> Recorder:
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


__all__ = ["watch", "Recorder", "DEFAULT_KINDS", "perturb"]
