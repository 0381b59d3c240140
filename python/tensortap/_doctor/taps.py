"""Which activations are a nonlinearity's output, for the doctor's
dead_relu, saturated_activation and poor_weight_initialization
(tensortap/_doctor.py), beyond the naming convention (a ReLU named `fc1` is still a ReLU).

Three sources, the first that speaks wins for a tap:

1. run.json "taps": {"<name>": "relu" | "tanh" | "sigmoid" | ...}, what the
   program declared (a C++ tap's nonlinearity) or what the twin read from the
   module's type (nn.ReLU, nn.Tanh, nn.Sigmoid). A key absent (runs recorded
   before it) declares nothing; a value that is not a string is ignored.
2. The rule's `include` pattern on the name (the naming convention: relu1,
   tanh2, relu1_input), which keeps working as before.
3. For dead_relu only, an inference from the recorded statistics: a tap
   neither declared nor matched whose every clean row has no negative value
   (min >= 0), with exact zeros in some row and a positive value in some row,
   is judged as a ReLU's output; its findings say so, with the evidence:
   `(ReLU inferred: min 0, 38% zeros)` (the zeros over all its rows). The
   positive value is asked for so that a tensor zero from its first row
   (all_zero's finding) is not called a ReLU on no evidence. A tap declared
   as another function is never inferred.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    from .rows import Rows
    from .._run import Run

# The functions the rules know by name; any other declared value is kept
# (the doctor ignores it) so that later functions need no reader change.
RELU = "relu"
SATURATING = ("tanh", "sigmoid")

_INPUT = re.compile(r"_input(#\d+)?$", re.IGNORECASE | re.ASCII)


def declared(run: Run, key: Optional[int]) -> Dict[str, str]:
    """run.json's "taps" of the rank `key`: {name: function, lower case}."""
    taps = run.infos.get(key, {}).get("taps")
    if not isinstance(taps, dict):
        return {}
    return {n: f.lower() for n, f in taps.items() if isinstance(n, str) and isinstance(f, str)}


def declared_any(run: Run) -> Dict[str, str]:
    """Every rank's declared taps together (a tap is one module on every rank)."""
    out: Dict[str, str] = {}
    for key in run.infos:
        out.update(declared(run, key))
    return out


def base_name(name: str) -> str:
    """A tap's declared name: a repeat (`relu#1`) is the tap's own module called again."""
    return name.split("#", 1)[0]


def function_of(name: str, taps: Dict[str, str]) -> Optional[str]:
    """The tap's declared function, or None."""
    return taps.get(name, taps.get(base_name(name)))


def is_input(name: str) -> bool:
    """A tap of a nonlinearity's input by the convention (`relu1_input`)."""
    return _INPUT.search(name) is not None


def declared_mask(rows: Rows, taps: Dict[str, str], functions: Tuple[str, ...]) -> np.ndarray:
    """Per series: an activation declared as one of `functions`."""
    return np.array([k == "activation" and function_of(n, taps) in functions for k, n in rows.keys], dtype=bool)


def inferred_relus(rows: Rows, candidates: np.ndarray, clean: np.ndarray) -> Dict[int, str]:
    """{series: the note its findings carry} for the activation series in
    `candidates` whose statistics look like a ReLU's output (module
    docstring); `clean` marks the rows that are evaluations."""
    out: Dict[int, str] = {}
    if not len(rows) or not candidates.any():
        return out
    c = rows.cols
    for sid in np.flatnonzero(candidates).tolist():
        lo = int(np.searchsorted(rows.series, sid, "left"))
        hi = int(np.searchsorted(rows.series, sid, "right"))
        keep = clean[lo:hi]
        if not keep.any():
            continue
        mins, maxs = c["min"][lo:hi][keep], c["max"][lo:hi][keep]
        zeros, numel = c["zeros"][lo:hi][keep], c["numel"][lo:hi][keep]
        if mins.min() < 0 or zeros.sum() == 0 or maxs.max() <= 0:
            continue
        share = float(zeros.sum()) / float(numel.sum())
        out[sid] = f"(ReLU inferred: min 0, {100 * share:.3g}% zeros)"
    return out


def candidates_for_inference(rows: Rows, selected: np.ndarray, taps: Dict[str, str]) -> np.ndarray:
    """Per series: an activation output that neither the pattern selected
    nor the run declared, so whose function the statistics may tell."""
    return np.array([k == "activation" and not selected[i] and function_of(n, taps) is None and not is_input(n)
                     for i, (k, n) in enumerate(rows.keys)], dtype=bool)


def saturating_function(name: str, taps: Dict[str, str]) -> Optional[str]:
    """"sigmoid" or "tanh" where the tap is declared so, else None (the name decides)."""
    f = function_of(name, taps)
    return f if f in SATURATING else None


def names_of(rows: Rows, mask: np.ndarray) -> List[str]:
    return [n for (k, n), m in zip(rows.keys, mask.tolist()) if m]
