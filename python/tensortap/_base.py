"""What every part of the reader shares: the kinds and dtypes tensortap
writes, the reader's error and warning, and the checks and words for the
JSON values a run's files hold."""

from __future__ import annotations

import json
import re
import unicodedata
import warnings
from typing import Any, Dict, Optional, Tuple, TypeGuard

KINDS: Tuple[str, ...] = ("activation", "activation_grad", "param", "buffer", "grad", "tensor")

# The columns of stats.npy after "step" and "series", in order: the real
# statistics over a tensor's finite values (float64 wherever the reader
# holds them), then the counts over all its values (int64). The counts of
# the values that are not finite come first among the counts.
STATS_REAL: Tuple[str, ...] = ("min", "max", "mean", "std", "norm")
NONFINITE: Tuple[str, ...] = ("nan", "posinf", "neginf")
STATS_COUNTS: Tuple[str, ...] = NONFINITE + ("zeros", "numel")
STATS_FIELDS: Tuple[str, ...] = STATS_REAL + STATS_COUNTS

# NumPy dtypes of the arrays the reader returns, by the index's dtype.
# bfloat16 is stored as float32; a float8 is stored as its bytes (uint8) and
# returned widened to float32 (_float8.py); both exactly.
NUMPY_DTYPES: Dict[str, str] = {
    "bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
    "int64": "int64", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "float32": "float32", "float64": "float64",
    "complex64": "complex64", "complex128": "complex128", "bfloat16": "float32",
    "float8_e4m3fn": "float32", "float8_e5m2": "float32", "float8_e4m3fnuz": "float32",
    "float8_e5m2fnuz": "float32", "float8_e8m0fnu": "float32",
}


def nonfinite(table: Any) -> Any:
    """The values that are not finite (NaN, +inf, -inf) a statistics row
    counts, per row of `table`: a stats table, a frame or a dict of columns."""
    nan, posinf, neginf = NONFINITE
    return table[nan] + table[posinf] + table[neginf]


class RunError(ValueError):
    """A run directory that cannot be read as asked."""


class GivenUpError(RunError):
    """A record this Run listed whose file (or packed segment) is gone
    because the run's disk budget (Budget::KeepLatest) gave its step up after
    the Run was opened: run.json's "budget": {"given_up_below": k} is now above
    the record's step, and no dump kept it. Opening the run again shows what
    is left. kind, name, step, rank (None for a single-rank run) and
    given_up_below (k, as run.json has it now) say which record and why."""

    def __init__(self, message: str, kind: Optional[str] = None, name: Optional[str] = None,
                 step: Optional[int] = None, rank: Optional[int] = None,
                 given_up_below: Optional[int] = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.step = step
        self.rank = rank
        self.given_up_below = given_up_below

    def __reduce__(self) -> Tuple[Any, ...]:
        # Its fields too: dask's workers send errors to another process.
        return (type(self), (self.args[0] if self.args else "", self.kind, self.name, self.step, self.rank,
                             self.given_up_below))


class RunWarning(UserWarning):
    """A damaged line of a run directory, skipped; the rest of the run is read."""


def _warn(message: str) -> None:
    warnings.warn(message, RunWarning, stacklevel=2)


def _json_type(value: Any) -> str:
    for t, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
                    (list, "an array"), (dict, "an object")):
        if isinstance(value, t):
            return name
    return "null"


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int64(value: Any) -> TypeGuard[int]:
    return _is_int(value) and -(1 << 63) <= value < (1 << 63)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg}, column {e.colno}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e)


# Names and paths come from the run's files: printed raw, a planted escape
# sequence would drive the terminal. A name's bytes that are not UTF-8 come
# as lone surrogates U+DC80..U+DCFF (tensortap writes them so); they are
# shown as the byte they stand for.
# Control characters, lone surrogates (a name's bytes that are not UTF-8),
# and the format characters that reorder or hide text on a terminal (bidi
# overrides and isolates such as U+202E, zero-width characters, line and
# paragraph separators, the BOM): a name must not make a line lie.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200b-\u200f\u202a-\u202e\u2028\u2029"
                      "\u2060-\u2069\ufeff]")
# Beyond those, every other format character and line or paragraph
# separator (Unicode categories Cf, Zl, Zp) is shown as \uXXXX too.
_FORMAT = ("Cf", "Zl", "Zp")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _safe(value: Any) -> str:
    """`value` as text safe for a terminal or a page: the one escaping
    function of the package (the diff caches it as _diff.text.esc)."""
    text = _CONTROL.sub(lambda m: _escape(m.group()), str(value))
    if text.isascii():
        return text
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in _FORMAT else c for c in text)


def json_string(s: str) -> str:
    """`s` as tensortap's JSON writer puts a string (writers/src/json.cpp,
    put_json_string), for what Python writes in its formats (the export's
    dump lines, the Python twin's index lines):
    quote, backslash, \\n, \\r, \\t escaped; other controls and DEL as \\u00xx;
    a lone surrogate (a byte that is not UTF-8) as \\udcxx; the rest as is."""
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif c < 0x20 or c == 0x7F or 0xD800 <= c <= 0xDFFF:
            out.append(f"\\u{c:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
