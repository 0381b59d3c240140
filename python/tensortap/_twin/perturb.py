"""perturb(model, ulps, seed): every floating parameter moved by a few ulps,
in place, bit-identical to C++'s tensortap::perturb (hooks/src/perturb.cpp):
the rounding-noise reference run of `tensortap diff --floor`."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from .._base import _is_int
from .settings import torch_module

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_CHUNK = 1 << 20  # elements per pass: bounds perturb's temporaries (about 40 MiB)


def _float_formats(torch: Any) -> Dict[Any, Tuple[Any, int, int]]:
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
    torch = torch_module()
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
