"""Each health rule's parameters, their types and defaults, and the settings
a doctor run takes (`--set rule.param=value`, a rule's kinds and include)."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union


from .._base import KINDS, _safe
from .._pattern import Pattern, PatternError

RULES = ("vanishing_gradient", "exploding_tensor", "all_zero", "unchanged_tensor", "loss_not_decreasing",
         "dead_relu", "saturated_activation", "tensor_variance", "poor_weight_initialization",
         "weight_update_ratio", "stalled_training")


_ALL_KINDS = "+".join(KINDS)


# Each rule's parameters: name -> (type, default). The types:
#   kinds: kinds joined by "+";  regex: a Python regular expression;  name: a tensor's name;
#   count: an integer >= 1;  steps: an integer >= 2;  positive: a number > 0;  bound: a number >= 0;
#   fraction: a number in (0, 1);  factor: a number > 1.
PARAMETERS: Dict[str, Dict[str, Tuple[str, Any]]] = {
    "vanishing_gradient": {"kinds": ("kinds", "grad"), "include": ("regex", "weight"), "threshold": ("positive", 1e-7),
                           "patience": ("count", 3)},
    "exploding_tensor": {"kinds": ("kinds", _ALL_KINDS), "include": ("regex", ""), "bound": ("bound", 0.0)},
    "all_zero": {"kinds": ("kinds", "activation+activation_grad+param+grad"), "include": ("regex", ""),
                 "patience": ("count", 2)},
    "unchanged_tensor": {"include": ("regex", "weight"), "num_steps": ("steps", 3)},
    "loss_not_decreasing": {"name": ("name", "loss"), "window": ("count", 20), "min_decrease": ("fraction", 0.001),
                            "min_progress": ("fraction", 0.05)},
    "dead_relu": {"include": ("regex", "relu"), "threshold": ("fraction", 0.95), "patience": ("count", 3)},
    "saturated_activation": {"include": ("regex", "tanh|sigmoid"), "derivative": ("fraction", 0.1),
                             "threshold": ("fraction", 0.5), "patience": ("count", 3)},
    "tensor_variance": {"kinds": ("kinds", "activation+activation_grad+param+grad"), "include": ("regex", ""),
                        "factor": ("factor", 100.0), "window": ("count", 50)},
    "poor_weight_initialization": {"include": ("regex", "(relu|tanh|sigmoid).*_input"),
                                   "threshold": ("factor", 10.0)},
    "weight_update_ratio": {"include": ("regex", "weight"), "large": ("positive", 0.1), "small": ("positive", 1e-8),
                            "patience": ("count", 1)},
    "stalled_training": {},
}


_TYPES = {
    "kinds": "kinds joined by + (" + ", ".join(KINDS) + ")",
    "regex": "a regular expression",
    "name": "a tensor's name",
    "count": "an integer >= 1 (at most 2**62)",
    "steps": "an integer >= 2 (at most 2**62)",
    "positive": "a number > 0",
    "bound": "a number >= 0 (0: off)",
    "fraction": "a number between 0 and 1 (exclusive)",
    "factor": "a number > 1",
}


_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


_INTEGER = re.compile(r"[+-]?\d+")


_FLAGS = re.IGNORECASE | re.ASCII


class Settings:
    """Which rules run, and each one's parameters, checked: a ValueError names
    the rule, the parameter and what it wants."""

    def __init__(self, rules: Optional[Iterable[str]] = None,
                 params: Optional[Mapping[str, Any]] = None) -> None:
        if rules is None:
            self.rules: Tuple[str, ...] = RULES
        else:
            given = [r.strip() for r in rules] if not isinstance(rules, str) else \
                [r.strip() for r in rules.split(",")]
            if not given or any(not r for r in given):
                raise ValueError(f"--rules wants rule names separated by commas; rules: {', '.join(RULES)}")
            unknown = [r for r in given if r not in PARAMETERS]
            if unknown:
                raise ValueError(f"no rule {unknown[0]!r}; rules: {', '.join(RULES)}")
            self.rules = tuple(r for r in RULES if r in given)
        self.values: Dict[str, Dict[str, Any]] = {r: {p: _parse(r, p, t, d) for p, (t, d) in ps.items()}
                                                  for r, ps in PARAMETERS.items()}
        for key, value in (params or {}).items():
            rule, dot, param = str(key).partition(".")
            if not dot or not rule or not param:
                raise ValueError(f"{_safe(key)!r} is not <rule>.<parameter>")
            if rule not in PARAMETERS:
                raise ValueError(f"{_safe(key)}: no rule {rule!r}; rules: {', '.join(RULES)}")
            if param not in PARAMETERS[rule]:
                names = ", ".join(PARAMETERS[rule]) or "none"
                raise ValueError(f"{_safe(key)}: {rule} has no parameter {param!r}; its parameters: {names}")
            if rule not in self.rules:
                raise ValueError(f"{_safe(key)}: {rule} is not among the rules evaluated (--rules)")
            self.values[rule][param] = _parse(rule, param, PARAMETERS[rule][param][0], value)

    def __getitem__(self, rule: str) -> Dict[str, Any]:
        return self.values[rule]


def _parse(rule: str, param: str, kind: str, value: Any) -> Any:
    """`value` (text, or a Python value of the right type) as parameter
    `param` of `rule`; a ValueError says what it wants."""
    def bad(why: str = "") -> ValueError:
        return ValueError(f"{rule}.{param}={_safe(value)!r}: wants {_TYPES[kind]}{why}")

    if kind in ("kinds", "regex", "name"):
        if not isinstance(value, str):
            raise bad()
        if kind == "kinds":
            kinds = value.split("+")
            unknown = [k for k in kinds if k not in KINDS]
            if unknown or len(set(kinds)) != len(kinds):
                raise bad(f"; {unknown[0]!r} is not a kind" if unknown else "; a kind given twice")
            return frozenset(kinds)
        if kind == "regex":
            # The live rules' matcher, in linear time (a user's pattern must
            # not hang the doctor: Python's re backtracks).
            try:
                return Pattern(value, "include", ignore_case=True)
            except PatternError as e:
                raise bad(f"; {e}") from None
        if not value:
            raise bad()
        return value
    if isinstance(value, str):
        if not (_INTEGER if kind in ("count", "steps") else _NUMBER).fullmatch(value):
            raise bad()
        number: Union[int, float] = int(value) if kind in ("count", "steps") else float(value)
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise bad()
    else:
        number = float(value) if not isinstance(value, numbers.Integral) else int(value)
    if kind in ("count", "steps"):
        # Within int64 with room: the live rules take the same values in C++.
        if isinstance(number, float) and not number.is_integer():  # NaN and infinities too
            raise bad()
        if not (2 if kind == "steps" else 1) <= int(number) <= 1 << 62:
            raise bad()
        return int(number)
    x = float(number)
    ok = {"positive": x > 0, "bound": x >= 0, "fraction": 0 < x < 1, "factor": x > 1}[kind]
    if not ok or not math.isfinite(x):
        raise bad()
    return x


def parse_sets(items: Sequence[str]) -> Dict[str, str]:
    """`--set rule.param=value` arguments as doctor()'s params; a ValueError names a malformed one."""
    out: Dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or "." not in key:
            raise ValueError(f"--set {_safe(item)!r}: wants <rule>.<parameter>=<value>")
        if key in out:
            raise ValueError(f"--set {_safe(key)} given twice")
        out[key] = value
    return out
