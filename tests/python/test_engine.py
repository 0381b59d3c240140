"""tensortap.torch.watch(..., engine="native"): the C++ recorder
(tensortap._engine) behind the twin's hooks, on the CPU. The same Python
program recorded by both engines gives the same records bit for bit
(`tensortap diff` exits 0: exact); packed, HDF5, statistics, the flight
recorder, the disk budget and TENSORTAP_OPTIONS work through it; a
DataLoader's worker processes (fork) neither hang nor write; a setting it
does not know is refused by name.

    PYTHONPATH=python:BUILD/python python-with-torch tests/python/test_engine.py

Skipped, saying why, where torch or the extension does not import (the
1.13 tree builds no extension).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

try:
    import torch
except ImportError:
    torch = None

import tensortap  # noqa: E402

ENGINE = None
if torch is not None:
    import tensortap.torch as ttt
    from tensortap import _native

    ENGINE = _native.load()

WHY = ("no torch here" if torch is None else
       "tensortap._engine is not built here (the LibTorch 2.x tree builds it; put BUILD/python on PYTHONPATH)")


class Net(torch.nn.Module if torch is not None else object):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def train(run, engine, steps=6, accumulate=2, **options):
    """A few SGD steps, two backward passes a step (their gradients summed),
    a captured loss; the same numbers whichever engine records them."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    data = torch.randn(steps, accumulate, 5, 8)
    rec = ttt.watch(net, run, kinds=["activation", "activation_grad", "param", "buffer", "grad", "tensor"],
                    overwrite=True, engine=engine, **options)
    for s in range(steps):
        rec.step(s)
        opt.zero_grad()
        for a in range(accumulate):
            loss = net(data[s, a]).pow(2).mean()
            rec.capture("loss", loss)
            loss.backward()
        opt.step()
    rec.close()
    return rec


def diff(a, b):
    # No floor: exact, every element (rtol and atol 0).
    return subprocess.run([sys.executable, "-m", "tensortap", "diff", a, b], capture_output=True, text=True,
                          env=dict(os.environ))


@unittest.skipIf(ENGINE is None, WHY)
class EngineCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-engine-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)


class Parity(EngineCase):
    def test_both_engines_write_the_same_records(self):
        py, native = self.path("py"), self.path("native")
        self.assertEqual(train(py, "python").engine, "python")
        self.assertEqual(train(native, "native").engine, "native")
        with tensortap.open(py) as a, tensortap.open(native) as b:
            ka = sorted((r["kind"], r["name"], r["step"]) for r in a.records)
            kb = sorted((r["kind"], r["name"], r["step"]) for r in b.records)
            self.assertEqual(ka, kb)
            self.assertIn(("tensor", "loss#1", 5), ka)  # the repeat, named as the twin names it
            for kind, name, step in ka:
                np.testing.assert_array_equal(a.load(name, step, kind=kind), b.load(name, step, kind=kind))
        out = diff(py, native)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    def test_packed_through_the_native_engine_reads_the_same(self):
        py, packed = self.path("py"), self.path("packed")
        train(py, "python", steps=3)
        train(packed, "native", steps=3, format="packed")
        self.assertTrue(os.path.isdir(os.path.join(packed, "packed")))
        out = diff(py, packed)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)


    def test_hdf5_through_the_native_engine_reads_the_same(self):
        try:
            import h5py  # noqa: F401
        except ImportError:
            self.skipTest("no h5py: an HDF5 run cannot be read here")
        py, h5 = self.path("py"), self.path("h5")
        train(py, "python", steps=3)
        try:
            train(h5, "native", steps=3, format="hdf5")
        except RuntimeError as e:  # a build without HDF5 says so
            self.skipTest(str(e))
        self.assertTrue(os.path.isfile(os.path.join(h5, "tensors.h5")))
        out = diff(py, h5)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)


class WhatItAdds(EngineCase):
    def test_statistics_every_step_with_full_tensors_every_third(self):
        run = self.path("stats")
        train(run, "native", every=3, stats_every=1)
        with tensortap.open(run) as r:
            self.assertEqual(sorted({rec["step"] for rec in r.records}), [0, 3])
            st = r.stats("fc1.weight", kind="grad")
            self.assertEqual(list(st["step"]), [0, 1, 2, 3, 4, 5])

    def test_the_flight_recorder_and_dump(self):
        run = self.path("flight")
        torch.manual_seed(0)
        net = Net()
        rec = ttt.watch(net, run, engine="native", flight_recorder=2, after_dump="continue", kinds=["param"])
        for s in range(5):
            rec.step(s)
            if s == 3:
                rec.dump()
        rec.close()
        with tensortap.open(run) as r:
            # The two steps held before the dump's, and its own.
            self.assertEqual([d["steps"] for d in r.dumps], [[1, 2, 3]])
            self.assertEqual(sorted({rec["step"] for rec in r.records}), [1, 2, 3])

    def test_a_budget_keeps_the_latest_steps(self):
        run = self.path("budget")
        torch.manual_seed(0)
        big = torch.nn.Linear(64, 64)
        rec = ttt.watch(big, run, engine="native", kinds=["param"], max_bytes="128K", on_budget="keep_latest")
        for s in range(30):
            rec.step(s)
        rec.close()
        with open(os.path.join(run, "run.json")) as f:
            budget = json.load(f)["budget"]
        self.assertEqual(budget["policy"], "keep_latest")
        self.assertGreater(budget["given_up_below"], 0)
        with tensortap.open(run) as r:
            self.assertIn(29, {rec["step"] for rec in r.records})

    def test_taps_declared_by_the_module_types(self):
        run = self.path("taps")
        train(run, "native", steps=1)
        with open(os.path.join(run, "run.json")) as f:
            self.assertEqual(json.load(f).get("taps"), {"act": "relu"})

    def test_a_setting_it_does_not_know_is_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, "unknown option 'colour'"):
            ttt.watch(Net(), self.path("x"), engine="native", colour="red")
        with self.assertRaisesRegex(ValueError, "on_budget=sometimes"):
            ttt.watch(Net(), self.path("y"), engine="native", on_budget="sometimes")
        with self.assertRaisesRegex(ValueError, "engine='native'"):
            ttt.watch(Net(), self.path("z"), engine="python", stats_every=1)
        self.assertFalse(os.path.exists(self.path("x")))

    def test_a_dataloader_with_worker_processes_neither_hangs_nor_writes(self):
        run = self.path("loader")
        torch.manual_seed(0)
        net = Net()
        rec = ttt.watch(net, run, engine="native", kinds=["activation"])
        data = torch.utils.data.TensorDataset(torch.randn(32, 8))
        loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)
        before = None
        for s, (x,) in enumerate(loader):
            rec.step(s)
            net(x)
            if before is None:
                rec.flush()
                before = sorted(os.listdir(run))
        rec.close()
        with tensortap.open(run) as r:
            self.assertEqual(sorted({rec["step"] for rec in r.records}), [0, 1, 2, 3])
        self.assertEqual(sorted(n for n in os.listdir(run) if n not in before), [])


if __name__ == "__main__":
    if torch is None or ENGINE is None:
        print(f"skipped: {WHY}")
    unittest.main()
