"""Checks the runs e2e_writer made, with NumPy alone, against values computed
here independently of LibTorch.

    check_e2e.py OUT_DIR
"""

import json
import os
import re
import sys

import numpy as np

import tensortap

NUMPY_DTYPE = {
    "bool": np.bool_, "uint8": np.uint8, "int8": np.int8, "int16": np.int16,
    "int32": np.int32, "int64": np.int64, "float16": np.float16, "float32": np.float32,
    "float64": np.float64, "complex64": np.complex64, "complex128": np.complex128,
    "bfloat16": np.float32,  # stored as float32, exactly
}


def check_files(run):
    """Every index line names a complete .npy of the indexed shape and dtype,
    whose data starts on a 64-byte boundary; nothing else is there."""
    listed = set()
    for r in run.records:
        path = os.path.join(run.path, r["file"])
        a = np.load(path)
        assert list(a.shape) == r["shape"], (r, a.shape)
        assert a.dtype == NUMPY_DTYPE[r["dtype"]], (r, a.dtype)
        with open(path, "rb") as f:
            head = f.read(12)
        assert head[:6] == b"\x93NUMPY"
        offset = (10 + int.from_bytes(head[8:10], "little")) if head[6] == 1 else \
                 (12 + int.from_bytes(head[8:12], "little"))
        assert offset % 64 == 0, (path, offset)
        assert os.path.getsize(path) == offset + a.nbytes
        listed.add(os.path.normpath(path))
    on_disk = {os.path.normpath(os.path.join(d, f))
               for d, _, fs in os.walk(os.path.join(run.path, "npy")) for f in fs}
    assert on_disk == listed, on_disk ^ listed


def check_packed_files(run):
    """Every index line names a complete .npy image at a 64-byte-aligned offset
    of a packed/ segment, whose data is 64-byte aligned within it and which
    np.load reads at that offset; images never overlap."""
    spans = {}
    for r in run.records:
        assert re.fullmatch(r"packed/\d{8}\.npys", r["file"]), r
        assert r["offset"] % 64 == 0, r
        with open(os.path.join(run.path, r["file"]), "rb") as f:
            f.seek(r["offset"])
            a = np.load(f, allow_pickle=False)
            assert f.tell() == r["offset"] + r["nbytes"], (r, f.tell())
            f.seek(r["offset"])
            head = f.read(12)
        assert head[:6] == b"\x93NUMPY"
        offset = (10 + int.from_bytes(head[8:10], "little")) if head[6] == 1 else \
                 (12 + int.from_bytes(head[8:12], "little"))
        assert offset % 64 == 0 and offset + a.nbytes == r["nbytes"], r
        assert list(a.shape) == r["shape"], (r, a.shape)
        assert a.dtype == NUMPY_DTYPE[r["dtype"]], (r, a.dtype)
        spans.setdefault(r["file"], []).append((r["offset"], r["offset"] + r["nbytes"]))
    for file, s in spans.items():
        s.sort()
        assert all(a[1] <= b[0] for a, b in zip(s, s[1:])), file
        assert s[-1][1] <= os.path.getsize(os.path.join(run.path, file)), file
    on_disk = {f for _, _, fs in os.walk(os.path.join(run.path, "packed")) for f in fs}
    assert on_disk == {os.path.basename(f) for f in spans}, on_disk


def check_h5_layout(run, dtypes):
    """DESIGN section 3's HDF5 layout, read by h5py alone."""
    import h5py

    with h5py.File(os.path.join(run.path, "tensors.h5"), "r") as f:
        assert f.attrs["format_version"][0] == 1
        assert f.attrs["tensortap_version"] and f.attrs["torch_version"]
        for r in run.records:
            assert r["file"] == "tensors.h5"
            g = f[os.path.dirname(r["dataset"])]
            data, steps = g["data"], g["steps"]
            assert g.attrs["dtype"] == r["dtype"], (r, g.attrs["dtype"])
            assert g.attrs["name"] == r["name"]
            assert data.maxshape == (None,) * data.ndim
            assert data.dtype == NUMPY_DTYPE[r["dtype"]], (r, data.dtype)
            assert steps.dtype == np.int64 and steps[r["row"]] == r["step"]
            if r["shape"]:
                assert list(g["shapes"][r["row"]]) == r["shape"]
        if dtypes:
            # h5py's own types: bool as its enum, half as IEEE binary16, complex as r/i.
            b = f["/tensor/dtype_bool/data"]
            t = b.id.get_type()
            assert b.dtype == np.bool_ and t.get_class() == h5py.h5t.ENUM
            assert [t.get_member_name(i) for i in range(t.get_nmembers())] == [b"FALSE", b"TRUE"]
            assert f["/tensor/dtype_float16/data"].id.get_type().get_size() == 2
            assert f["/tensor/dtype_complex64/data"].id.get_type().get_member_name(0) == b"r"


def check_shapes(path):
    """A tensor whose shape changes between steps: each row padded, each record exact."""
    run = tensortap.open(path)
    rows, cols = [4, 4, 2, 5, 5], [3, 3, 3, 3, 7]
    for s in range(5):
        want = np.arange(rows[s] * cols[s], dtype=np.float32).reshape(rows[s], cols[s]) + 100 * s
        np.testing.assert_array_equal(run.load("x", s, kind="tensor"), want)
    check_h5_layout(run, dtypes=False)
    run.close()
    print("shapes_h5: 5 records of changing shape read back exactly")


def check_train(path):
    run = tensortap.open(path)
    assert run.closed and run.info["dropped"] == 0 and run.info["errors"] == 0
    if run.info["options"]["format"] == "hdf5":
        check_h5_layout(run, dtypes=False)
    elif run.info["options"]["format"] == "packed":
        check_packed_files(run)
    else:
        check_files(run)
    steps = run.steps("fc.weight", kind="grad")
    assert steps == [0, 2, 4, 6, 8], steps
    for s in steps:
        w = run.load("fc.weight", s, kind="param").astype(np.float64)
        b = run.load("fc.bias", s, kind="param").astype(np.float64)
        x = run.load("x", s, kind="tensor").astype(np.float64)
        y = run.load("y", s, kind="tensor").astype(np.float64)
        pred = x @ w.T + b
        dpred = 2.0 * (pred - y) / pred.size  # d mean((pred - y)^2) / d pred
        close = dict(rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(run.load("out", s, kind="activation"), pred, **close)
        np.testing.assert_allclose(run.load("out", s, kind="activation_grad"), dpred, **close)
        np.testing.assert_allclose(run.load("fc.weight", s, kind="grad"), dpred.T @ x, **close)
        np.testing.assert_allclose(run.load("fc.bias", s, kind="grad"), dpred.sum(axis=0), **close)
        np.testing.assert_allclose(run.load("loss", s, kind="tensor"), np.mean((pred - y) ** 2), **close)
        # Changed in place right after capture: the file holds the old values.
        np.testing.assert_array_equal(run.load("probe", s, kind="tensor"), np.full(16, float(s), np.float32))
    g = run.series("fc.weight", kind="grad")
    assert g.shape == (5, 3, 5), g.shape
    print(f"{os.path.basename(path)}: {len(run.records)} records match the closed-form values")


def check_dtypes(path):
    run = tensortap.open(path)
    if run.info["options"]["format"] == "hdf5":
        check_h5_layout(run, dtypes=True)
    elif run.info["options"]["format"] == "packed":
        check_packed_files(run)
    else:
        check_files(run)
    base = np.arange(12, dtype=np.float64).reshape(3, 4) - 5
    for name, dt in NUMPY_DTYPE.items():
        if name == "bool":
            want = base % 2 == 0
        elif name == "uint8":
            want = (base + 5).astype(dt)
        elif name.startswith("complex"):
            want = (base - 0.5j * base).astype(dt)
        else:
            want = (base * 0.5).astype(dt)
        for prefix, w in (("dtype_", want), ("transposed_", want.T)):
            got = run.load(prefix + name, 0, kind="tensor")
            assert got.dtype == np.dtype(dt), (name, got.dtype)
            np.testing.assert_array_equal(got, w)
        rec = [r for r in run.records if r["name"] == "dtype_" + name][0]
        assert rec["dtype"] == name, rec
    scalar = run.load("scalar", 0, kind="tensor")
    assert scalar.shape == () and scalar == 3.5
    assert run.load("empty", 0, kind="tensor").shape == (0, 3)
    print(f"{os.path.basename(path)}: {len(run.records)} records read back exactly")


def numpy_stats(a):
    """The statistics tensortap promises, computed by NumPy in float64: min, max,
    mean, std and norm over the finite values; counts over all."""
    x = np.asarray(a)
    x = np.abs(x.astype(np.complex128)) if np.iscomplexobj(x) else x.astype(np.float64)
    x = x.ravel()
    fin = x[np.isfinite(x)]
    some = fin.size > 0
    return {
        "min": fin.min() if some else np.nan, "max": fin.max() if some else np.nan,
        "mean": fin.mean() if some else np.nan, "std": fin.std() if some else np.nan,
        "norm": np.linalg.norm(fin) if some else np.nan,
        "nan": np.isnan(x).sum(), "posinf": np.isposinf(x).sum(), "neginf": np.isneginf(x).sum(),
        "zeros": (x == 0).sum(), "numel": x.size,
    }


def check_stats(path, every_step):
    """Run.stats() equals NumPy's statistics of every written tensor, and has a
    row at each step in `every_step` whether or not the tensor was written there."""
    run = tensortap.open(path)
    compared = 0
    for rec in run.records:
        st = run.stats(rec["name"], kind=rec["kind"])
        assert list(st) == ["step", *tensortap.STATS_FIELDS], list(st)
        assert list(st["step"]) == every_step, (rec["name"], list(st["step"]))
        i = list(st["step"]).index(rec["step"])
        want = numpy_stats(run.load(rec["name"], rec["step"], kind=rec["kind"]))
        for field, w in want.items():
            np.testing.assert_allclose(st[field][i], w, rtol=1e-10, atol=1e-300,
                                       err_msg=f"{path}: {rec['kind']} {rec['name']} step {rec['step']} {field}")
        compared += 1
    print(f"{os.path.basename(path)}: statistics of {compared} records equal NumPy's")


def main(out):
    check_train(os.path.join(out, "train"))
    check_dtypes(os.path.join(out, "dtypes"))
    check_stats(os.path.join(out, "train"), list(range(9)))
    check_stats(os.path.join(out, "dtypes"), [0])
    nonfinite = tensortap.open(os.path.join(out, "dtypes")).stats("nonfinite", kind="tensor")
    assert (nonfinite["nan"][0], nonfinite["posinf"][0], nonfinite["neginf"][0]) == (1, 1, 1)
    check_train(os.path.join(out, "train_packed"))
    check_dtypes(os.path.join(out, "dtypes_packed"))
    check_stats(os.path.join(out, "train_packed"), list(range(9)))
    check_stats(os.path.join(out, "dtypes_packed"), [0])
    if os.path.isdir(os.path.join(out, "train_h5")):
        check_train(os.path.join(out, "train_h5"))
        check_dtypes(os.path.join(out, "dtypes_h5"))
        check_shapes(os.path.join(out, "shapes_h5"))
        check_stats(os.path.join(out, "train_h5"), list(range(9)))
        check_stats(os.path.join(out, "dtypes_h5"), [0])
    leftovers = [f for d, _, fs in os.walk(out) for f in fs if f.endswith(".tmp")]
    assert not leftovers, leftovers
    with open(os.path.join(out, "train", "run.json")) as f:
        assert json.load(f)["closed"] is True


if __name__ == "__main__":
    main(sys.argv[1])
