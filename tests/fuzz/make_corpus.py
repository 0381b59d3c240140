"""Writes the seed corpus of fuzz_npy: valid files of every dtype, order and
format version NumPy writes, and a few broken ones. Its output is committed
(tests/fuzz/corpus); rerun it only to change the seeds.

    /usr/bin/python3 tests/fuzz/make_corpus.py tests/fuzz/corpus
"""

import io
import os
import sys

import numpy as np


def main(out):
    os.makedirs(out, exist_ok=True)
    seeds = {}
    base = np.arange(6).reshape(2, 3)
    for dt in ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
               "complex64", "complex128"]:
        seeds[f"{dt}.npy"] = (base.astype(dt), (1, 0))
        if np.dtype(dt).itemsize > 1:
            seeds[f"{dt}_be.npy"] = (base.astype(np.dtype(dt).newbyteorder(">")), (1, 0))
    seeds["fortran.npy"] = (np.asfortranarray(base.astype("float32")), (1, 0))
    seeds["v2.npy"] = (base.astype("float64"), (2, 0))
    seeds["v3.npy"] = (base.astype("int32"), (3, 0))
    seeds["scalar.npy"] = (np.array(1.5), (1, 0))
    seeds["empty.npy"] = (np.zeros((0, 3), "float32"), (1, 0))
    for name, (a, version) in seeds.items():
        buf = io.BytesIO()
        np.lib.format.write_array(buf, a, version=version)
        with open(os.path.join(out, name), "wb") as f:
            f.write(buf.getvalue())
    good = open(os.path.join(out, "float32.npy"), "rb").read()
    broken = {
        "truncated.npy": good[:-3],
        "short_header.npy": good[:20],
        "huge_shape.npy": good.replace(b"(2, 3)", b"(99999999999, 3)"),
        "object.npy": good.replace(b"'<f4'", b"'|O' "),
    }
    for name, data in broken.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
