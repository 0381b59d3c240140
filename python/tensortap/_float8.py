"""float8 records: tensortap stores a float8 tensor's bytes as they are
(uint8: NumPy has no float8) and names the format in the index; the reader
widens them to float32, which holds every float8 value exactly.

The formats, as PyTorch and the OCP 8-bit floating point specification
define them (sign bit first, then exponent, then mantissa):

  float8_e4m3fn    4 exponent bits, bias 7, 3 mantissa bits; no infinities;
                   NaN is S.1111.111 (0x7f, 0xff); largest 448.
  float8_e5m2      5 exponent bits, bias 15, 2 mantissa bits; IEEE-like:
                   S.11111.00 is infinity, S.11111.xx (xx != 0) NaN.
  float8_e4m3fnuz  as e4m3fn with bias 8, no negative zero: 0x80 is the one
                   NaN, every other code is finite (largest 240).
  float8_e5m2fnuz  as e5m2 with bias 16, no infinities, 0x80 the one NaN
                   (largest 57344).
  float8_e8m0fnu   an exponent alone: 2**(code - 127), no sign, no zero;
                   0xff is NaN.
"""

import math

import numpy as np

from ._base import RunError

# name: (exponent bits, bias, kind)
_FORMATS = {
    "float8_e4m3fn": (4, 7, "fn"),
    "float8_e5m2": (5, 15, "ieee"),
    "float8_e4m3fnuz": (4, 8, "fnuz"),
    "float8_e5m2fnuz": (5, 16, "fnuz"),
    "float8_e8m0fnu": (8, 127, "e8m0"),
}

FORMATS = tuple(_FORMATS)
_TABLES: dict = {}  # name -> its 256 values, float32


def value(name, code):
    """The value of float8 `code` (0..255) of format `name`, as a Python float."""
    exp_bits, bias, kind = _FORMATS[name]
    if kind == "e8m0":
        return float("nan") if code == 0xFF else 2.0 ** (code - bias)
    if kind == "fnuz" and code == 0x80:
        return float("nan")
    man_bits = 7 - exp_bits
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> man_bits) & ((1 << exp_bits) - 1)
    man = code & ((1 << man_bits) - 1)
    # A NaN keeps its sign bit, as PyTorch's conversion does.
    if kind == "fn" and exp == 15 and man == 7:
        return math.copysign(float("nan"), sign)
    if kind == "ieee" and exp == 31:
        return sign * float("inf") if man == 0 else math.copysign(float("nan"), sign)
    if exp == 0:  # subnormal
        return sign * man * 2.0 ** (1 - bias - man_bits)
    return sign * ((1 << man_bits) + man) * 2.0 ** (exp - bias - man_bits)


def table(name):
    """float32[256]: the value of every code of format `name`."""
    t = _TABLES.get(name)
    if t is None:
        t = _TABLES[name] = np.array([value(name, c) for c in range(256)], dtype=np.float32)
        t.flags.writeable = False
    return t


def widen(codes, name, where):
    """The float32 array of the float8 `codes` (a uint8 array as stored)."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise RunError(f"{where}: a {name} record must hold its bytes as uint8, the file holds {codes.dtype}")
    return table(name)[codes]
