"""Checks the runs of examples/train_transformer.cpp and examples/train_lstm.cpp
against the copies each program took itself of what tensortap records
(REF_DIR/<kind>/<name>/<step>.npy): every copy has a record of the same kind,
name and step, equal bit for bit, and the run has no record without a copy.

    check_real_programs.py TRANSFORMER_RUN TRANSFORMER_REF LSTM_RUN LSTM_REF
"""

import os
import sys

import numpy as np

from check_examples import check_clean

KINDS = ["activation", "activation_grad", "grad", "tensor"]


def read_reference(ref):
    """{(kind, name, step): path} of the program's copies."""
    copies = {}
    for kind in os.listdir(ref):
        for name in os.listdir(os.path.join(ref, kind)):
            for file in os.listdir(os.path.join(ref, kind, name)):
                assert file.endswith(".npy"), (ref, kind, name, file)
                copies[(kind, name, int(file[:-len(".npy")]))] = os.path.join(ref, kind, name, file)
    return copies


def compare(label, path, ref):
    run = check_clean(path)
    copies = read_reference(ref)
    recorded = {(r["kind"], r["name"], r["step"]) for r in run.records}
    missing = sorted(set(copies) - recorded)
    extra = sorted(recorded - set(copies))
    assert not missing, f"{label}: copies with no record: {missing[:10]} ({len(missing)})"
    assert not extra, f"{label}: records with no copy: {extra[:10]} ({len(extra)})"
    assert run.kinds() == KINDS, (label, run.kinds())
    counts = dict.fromkeys(KINDS, 0)
    for (kind, name, step), file in sorted(copies.items()):
        want = np.load(file)
        got = run.load(name, step, kind=kind, mmap=False)
        where = f"{label}: {kind} {name!r} at step {step}"
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, got.shape, want.dtype,
                                                                     want.shape)
        if not np.array_equal(got, want):
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            raise AssertionError(f"{where}: not bit-exact, {np.count_nonzero(diff)} values differ, "
                                 f"largest difference {diff.max()}")
        counts[kind] += 1
    for kind in KINDS:
        assert counts[kind] > 0, (label, kind, counts)
    print(f"{label}: {sum(counts.values())} tensors bit-exact ("
          + ", ".join(f"{counts[k]} {k}" for k in KINDS) + ")")
    return run


def check_transformer(path, ref):
    run = compare("transformer", path, ref)
    # The Tapped layers in their ModuleList and the Tapped head, by module path.
    assert run.names("activation") == ["head", "layers.0", "layers.1"], run.names("activation")
    assert run.names("activation_grad") == ["head", "layers.0", "layers.1"], run.names("activation_grad")
    grads = run.names("grad")
    assert "layers.1.linear1.weight" in grads and "layers.0.self_attn.in_proj_weight" in grads, grads
    # record_grads() after clip_grad_norm_(1.0): the recorded gradients are the
    # clipped ones, their global norm at most 1.
    for step in run.steps("head.weight", kind="grad"):
        norm = np.sqrt(sum(np.sum(run.load(n, step, kind="grad").astype(np.float64) ** 2) for n in grads))
        assert norm <= 1.0 + 1e-4, (step, norm)
    assert np.isfinite(run.series("loss", kind="tensor")).all()


def check_lstm(path, ref):
    run = compare("lstm", path, ref)
    # Four micro-batches a step: the LSTM's second to fourth runs are #1..#3.
    runs = ["", "#1", "#2", "#3"]
    assert run.names("activation") == sorted(f"lstm.{i}{r}" for i in ("0", "1.0", "1.1") for r in runs), \
        run.names("activation")
    # c_n (lstm.1.1) feeds nothing: no gradient reaches it.
    assert run.names("activation_grad") == sorted(f"lstm.{i}{r}" for i in ("0", "1.0") for r in runs), \
        run.names("activation_grad")
    assert run.names("grad") == ["head.bias", "head.weight", "lstm.bias_hh_l0", "lstm.bias_ih_l0",
                                 "lstm.weight_hh_l0", "lstm.weight_ih_l0"], run.names("grad")
    # One grad record per parameter and step (the sum of the 4 passes), no per-pass ones.
    steps = run.steps("lstm.weight_ih_l0", kind="grad")
    assert run.steps("loss", kind="tensor") == steps, (steps, run.steps("loss", kind="tensor"))
    assert np.isfinite(run.series("loss", kind="tensor")).all()


if __name__ == "__main__":
    check_transformer(sys.argv[1], sys.argv[2])
    check_lstm(sys.argv[3], sys.argv[4])
