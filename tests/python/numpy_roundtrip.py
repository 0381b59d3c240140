"""NumPy writes, tensortap's load_npy reads (and save_npy writes back), NumPy compares.

    numpy_roundtrip.py make DIR        writes the cases
    numpy_roundtrip.py check DIR OUT   compares OUT (written by npy_roundtrip) with DIR
"""

import os
import sys

import numpy as np

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
          "complex64", "complex128"]


def cases():
    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4) - 11
    for dt in DTYPES:
        if dt == "bool":
            a = base % 3 == 0
        elif dt == "uint8":
            a = (base + 11).astype(dt)
        elif dt.startswith("complex"):
            a = (base + 0.25j * base).astype(dt)
        else:
            a = (base * 0.5).astype(dt)
        yield f"{dt}_c", a, "C", (1, 0)
        yield f"{dt}_fortran", np.asfortranarray(a), "F", (1, 0)
        if np.dtype(dt).itemsize > 1:
            yield f"{dt}_bigendian", a.astype(np.dtype(dt).newbyteorder(">")), "C", (1, 0)
    yield "float32_v2", np.linspace(-1, 1, 10, dtype=np.float32), "C", (2, 0)
    yield "float64_v3", np.linspace(-1, 1, 7), "C", (3, 0)
    yield "scalar", np.array(2.5), "C", (1, 0)
    yield "empty", np.zeros((0, 4), np.int16), "C", (1, 0)


def make(d):
    os.makedirs(d, exist_ok=True)
    for name, a, _, version in cases():
        with open(os.path.join(d, name + ".npy"), "wb") as f:
            np.lib.format.write_array(f, a, version=version)


def check(d, out):
    n = 0
    for name, a, _, _ in cases():
        back = np.load(os.path.join(out, name + ".npy"))
        want = a.astype(a.dtype.newbyteorder("="))  # load_npy returns native order
        assert back.dtype == want.dtype, (name, back.dtype, want.dtype)
        assert back.shape == want.shape, (name, back.shape, want.shape)
        np.testing.assert_array_equal(back, want, err_msg=name)
        n += 1
    print(f"numpy_roundtrip: {n} arrays survive NumPy -> load_npy -> save_npy -> NumPy")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3])
