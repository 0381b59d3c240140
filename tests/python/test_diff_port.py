"""Port checks that hold on real models (issue 74, the diff's side, items 1,
3, 4 and 5): several floor runs and where they disagree, records in two
dtypes, dropout masks, and the forward's "arises" clause. On runs written
here by the twin's writer (no build, no torch), once per test class: a
second or two.

    PYTHONPATH=python python3 tests/python/test_diff_port.py

The runs are test_diff_floor.py's: a step of parameters, a buffer, a
learning rate, a forward, a loss, a backward and gradients, A2 being A with
every record off by a chosen relative error (what rounding grows into).
"""

import json
import os
import shutil
import tempfile
import unittest

import numpy as np

import tensortap
from test_diff_floor import STEP, command, floor_change, signs, ulp_moved, value, write

DROPOUT = "dropout masks differ (seed both sides after the model is made)"


def scaled(rel, seed, only=None, from_step=None):
    """A run's change: every record but the step-0 params off by `rel`
    (signs drawn from `seed`); `only`: (kind, name) the change is made to;
    `from_step`: from that step on."""
    def change(kind, name, step, rank, x):
        if kind == "param" and step == 0:
            return None
        if only is not None and (kind, name) not in only:
            return None
        if from_step is not None and step < from_step:
            return None
        return (x * (1 + rel * signs(x.shape, seed + step))).astype(np.float32)
    return change


def combine(*changes):
    def change(kind, name, step, rank, x):
        y = None
        for c in changes:
            z = c(kind, name, step, rank, x if y is None else y)
            y = z if z is not None else y
        return y
    return change


def json_lines(out):
    return [json.loads(line) for line in out.splitlines()]


class Runs(unittest.TestCase):
    """A temporary folder for the class's runs, made once."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tensortap-diff-port-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.tmp, name)


class SeveralFloorsTest(Runs):
    """Item 1: --floor repeated; the envelope is the floor; floors that
    disagree by more than --factor are said, from their first step."""

    STEPS = 4

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        n = cls.STEPS
        cls.a = write(cls.path("a"), steps=n)
        # Two floors that agree (seeds 0 and 1 of a smooth model) ...
        cls.f0 = write(cls.path("f0"), steps=n, change=floor_change(1e-5, seed=7))
        cls.f1 = write(cls.path("f1"), steps=n, change=floor_change(2e-5, seed=8))
        # ... and one where a tie flipped at step 2 in one activation, then
        # everything from step 3 on: 1e-2 where the others say 1e-5.
        cls.flip = write(cls.path("flip"), steps=n, change=combine(
            floor_change(1e-5, seed=9), scaled(1e-2, 3, only={("activation", "act")}, from_step=2),
            scaled(1e-2, 4, from_step=3)))
        # B: a faithful port whose rounding is 1e-4 everywhere: ten times
        # f0's floor would fail it (1e-4 = 10 * 1e-5 is the edge: use 1.5e-4),
        # the envelope of f0 and f1 (2e-5 * 10) passes it.
        cls.b = write(cls.path("b"), steps=n, change=scaled(1.5e-4, 50))
        # A bug: fc2 off by 1e-2 at step 1, when every floor is still 1e-5.
        cls.bug = write(cls.path("bug"), steps=n, change=combine(
            scaled(1.5e-4, 50), scaled(1e-2, 60, only={("activation", "fc2")}, from_step=1)))

    def test_the_envelope_is_the_floor(self):
        rc, out, err = command(self.a, self.b, "--floor", self.f0)
        self.assertEqual(rc, 1, out + err)
        rc, out, err = command(self.a, self.b, "--floor", self.f0, "--floor", self.f1)
        self.assertEqual(rc, 0, out + err)
        self.assertNotIn("floors disagree", out)
        df = tensortap.diff(self.a, self.b, floor=[self.f0, self.f1])
        one = tensortap.diff(self.a, self.b, floor=self.f1)  # a single path is still a floor
        judged = df.floor_rel_norm.notna()
        self.assertTrue(judged.any())
        # The larger floor (f1's 2e-5) is every record's.
        self.assertTrue(np.allclose(df.floor_rel_norm[judged], one.floor_rel_norm[judged]))
        self.assertIsNone(df.attrs["floor_disagrees_step"])
        self.assertEqual(set(df.status), {"equal", "noise"})

    def test_floors_that_disagree_are_said_and_the_exit_status_keeps_its_meaning(self):
        rc, out, err = command(self.a, self.b, "--floor", self.f0, "--floor", self.f1, "--floor", self.flip)
        self.assertEqual(rc, 0, out + err)  # noise is agreement, whatever the floors say of each other
        said = [line for line in out.splitlines() if line.startswith("floors disagree")]
        self.assertEqual(len(said), 1, out)
        # flip's floor 1e-2 over f0's 1e-5 (the smallest of the three).
        self.assertRegex(said[0], r"^floors disagree from step 2: activation act \((999|1000)(\.\d)?\): ")
        df = tensortap.diff(self.a, self.b, floor=[self.f0, self.f1, self.flip])
        self.assertEqual(df.attrs["floor_disagrees_step"], 2)
        self.assertAlmostEqual(df.attrs["floor_disagrees"]["ratio"], 1000, delta=5)
        self.assertEqual({k: df.attrs["floor_disagrees"][k] for k in ("kind", "name", "step")},
                         {"kind": "activation", "name": "act", "step": 2})
        rc, out, _ = command(self.a, self.b, "--floor", self.f0, "--floor", self.flip, "--json")
        rows = json_lines(out)
        self.assertEqual(rows[-1]["floor_disagrees_step"], 2)
        self.assertEqual(rows[-1]["exit"], rc)
        # A larger factor: within it, the floors agree.
        rc, out, _ = command(self.a, self.b, "--floor", self.f0, "--floor", self.flip, "--factor", "2000")
        self.assertNotIn("floors disagree", out)

    def test_a_bug_is_found_against_the_envelope_before_the_floors_part(self):
        rc, out, err = command(self.a, self.bug, "--floor", self.f0, "--floor", self.f1, "--floor", self.flip)
        self.assertEqual(rc, 1, out + err)
        self.assertTrue(out.startswith("first divergence: activation fc2 step 1: "), out)

    def test_the_page_says_it(self):
        page = self.path("diff.html")
        rc, out, err = command(self.a, self.b, "--floor", self.f1, "--floor", self.flip, "--html", page)
        self.assertEqual(rc, 0, out + err)
        with open(page, encoding="utf-8") as f:
            text = f.read()
        self.assertIn('<p class="first">floors disagree from step 2: activation act', text)
        self.assertIn('"floor_disagrees_step": 2', text)

    def test_each_floor_run_is_checked(self):
        rc, out, err = command(self.a, self.b, "--floor", self.f1, "--floor", self.a)
        self.assertEqual(rc, 0, out + err)
        self.assertIn(f"floor: A2 #2 ({self.a})'s step-0 parameters are A's bit for bit", out)

        def far(kind, name, step, rank, x):
            return ulp_moved(x, 3) if kind == "param" and step == 0 else None
        bad = write(self.path("far"), steps=self.STEPS, change=far)
        rc, out, err = command(self.a, self.b, "--floor", self.f0, "--floor", bad)
        self.assertEqual(rc, 2, out + err)
        self.assertIn("A2 #2", err)
        with self.assertRaises(ValueError):
            tensortap.diff(self.a, self.b, floor=[])


class DtypeTest(Runs):
    """Item 3: a record in two dtypes is judged at the coarser precision;
    a float64 of float32 values as float32."""

    RECORDS = STEP[:4] + STEP[4:8]  # the params, lr, a forward and the loss

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        norm32 = [value("tensor", "grad_norm", s, ()) for s in range(2)]
        up = [np.nextafter(v, np.float32(np.inf)) for v in norm32]

        def norms(values, dtype):
            return [("tensor", "grad_norm", s, np.asarray(v, dtype=dtype)) for s, v in enumerate(values)]
        # Python's clip_grad_norm_ returns a float32 tensor, C++'s a double;
        # a faithful port's double is the same norm, rounded elsewhere by one
        # float32 ulp.
        cls.a = write(cls.path("a"), records=cls.RECORDS, extra=norms(norm32, "float32"))
        cls.b = write(cls.path("b"), records=cls.RECORDS, extra=norms(up, "float64"))
        cls.b_bug = write(cls.path("b_bug"), records=cls.RECORDS,
                          extra=norms([v * 1.001 for v in norm32], "float64"))
        # Both in float64 (the port captures a double, the original .item()):
        # a one-float32-ulp difference where A2 equals A exactly.
        cls.a64 = write(cls.path("a64"), records=cls.RECORDS, extra=norms(norm32, "float64"))
        cls.b64 = write(cls.path("b64"), records=cls.RECORDS, extra=norms(up, "float64"))
        cls.a2 = write(cls.path("a2"), records=cls.RECORDS, change=floor_change(1e-6),
                       extra=norms(norm32, "float64"))

    def test_two_dtypes_are_judged_at_the_coarser_and_named(self):
        rc, out, err = command(self.a, self.b, "--rtol", "1e-6")
        self.assertEqual(rc, 0, out + err)
        self.assertIn("dtype float32 vs float64 (A's vs B's, judged as float32): 2 records, "
                      "e.g. tensor grad_norm step 0", out)
        rc, out, _ = command(self.a, self.b)
        self.assertEqual(rc, 1, out)
        self.assertIn("max ulp 1,", out)  # float32's ulps, not float64's 2^29
        self.assertIn(", dtype float32 vs float64", out.splitlines()[0])
        rows = [r for r in json_lines(command(self.a, self.b, "--json")[1]) if r.get("name") == "grad_norm"]
        self.assertEqual([(r["dtype_a"], r["dtype_b"]) for r in rows], [("float32", "float64")] * 2)
        df = tensortap.diff(self.a, self.b)
        self.assertEqual(set(df.attrs["dtypes"].values()), {("float32", "float64")})

    def test_a_real_difference_in_two_dtypes_is_one(self):
        rc, out, _ = command(self.a, self.b_bug, "--rtol", "1e-6")
        self.assertEqual(rc, 1, out)
        first = out.splitlines()[0]
        self.assertTrue(first.startswith("first divergence: tensor grad_norm step 0: arises "), out)
        self.assertIn("max rel 0.001, max ulp 11934, ", first)  # float32's ulps
        self.assertTrue(first.endswith(", dtype float32 vs float64"), first)

    def test_a_float64_of_float32_values_is_floored_as_float32(self):
        rc, out, err = command(self.a64, self.b64, "--floor", self.a2)
        self.assertEqual(rc, 0, out + err)
        df = tensortap.diff(self.a64, self.b64, floor=self.a2)
        norms = df[df.name == "grad_norm"]
        self.assertEqual(list(norms.status), ["noise", "noise"])
        self.assertEqual(list(norms.max_ulp), [1.0, 1.0])
        # An integer against a float stays a mismatch.
        ints = write(self.path("ints"), records=self.RECORDS,
                     extra=[("tensor", "grad_norm", s, np.asarray(1, dtype=np.int64)) for s in range(2)])
        rc, out, _ = command(self.a, ints)
        self.assertEqual(rc, 1)
        self.assertIn("shape or dtype differs (A float32 [], B int64 [])", out)


class DropoutTest(Runs):
    """Item 4: two dropout masks over the same values are said."""

    RECORDS = (("param", "w", (4, 4)), ("activation", "fc", (64, 16)), ("activation", "drop", (64, 16)),
               ("tensor", "loss", ()))

    @classmethod
    def setUpClass(cls):
        super().setUpClass()

        def masked(seed, noise=0.0):
            def change(kind, name, step, rank, x):
                if kind == "param" and step == 0:
                    return None
                y = x * (1 + noise * signs(x.shape, 70 + step)) if noise else x
                if name == "drop":
                    keep = np.random.default_rng(seed + step).random(x.shape) >= 0.5
                    fc = value("activation", "fc", step, x.shape)
                    y = np.where(keep, fc * 2 * (1 + noise * signs(x.shape, 80 + step)), 0.0)
                if name == "loss":
                    y = x * (1 + 0.1 * (seed != 1))  # the loss follows the masks
                return y.astype(np.float32)
            return change
        cls.a = write(cls.path("a"), records=cls.RECORDS, change=masked(1))
        cls.b = write(cls.path("b"), records=cls.RECORDS, change=masked(2))
        cls.b_noisy = write(cls.path("b_noisy"), records=cls.RECORDS, change=masked(2, noise=3e-6))
        cls.a2 = write(cls.path("a2"), records=cls.RECORDS, change=combine(floor_change(1e-6), masked(1, 1e-6)))
        # The same masks, but the values differ too: not dropout's.
        cls.b_values = write(cls.path("b_values"), records=cls.RECORDS, change=combine(
            masked(2), scaled(1e-3, 90, only={("activation", "drop")})))

    def test_masks_that_differ_are_said(self):
        rc, out, _ = command(self.a, self.b)
        self.assertEqual(rc, 1)
        first = out.splitlines()[0]
        self.assertTrue(first.startswith("first divergence: activation drop step 0: arises in the forward between "
                                         f"activation fc and activation drop; {DROPOUT}; "), first)
        self.assertTrue(tensortap.diff(self.a, self.b).attrs["dropout_masks_differ"])

    def test_within_the_floor(self):
        rc, out, _ = command(self.a, self.b_noisy)
        self.assertNotIn(DROPOUT, out)  # exact without a floor: the values differ
        rc, out, _ = command(self.a, self.b_noisy, "--floor", self.a2)
        self.assertIn(f"; {DROPOUT}; ", out.splitlines()[0])

    def test_values_that_differ_are_not_masks(self):
        rc, out, _ = command(self.a, self.b_values)
        self.assertEqual(rc, 1)
        self.assertNotIn("dropout", out)
        self.assertFalse(tensortap.diff(self.a, self.b_values).attrs["dropout_masks_differ"])


class ArisesInTheForwardTest(Runs):
    """Item 5: the first activation of a step arises "before" it, never
    "between" a buffer of the step's initial state and it."""

    def test_never_an_initial_state_buffer(self):
        records = tuple(r for r in STEP if r[1] != "lr")  # a buffer, then the forward
        a = write(self.path("a"), records=records)

        def conv1(kind, name, step, rank, x):
            return x * 1.01 if (kind, name) == ("activation", "fc1") else None
        b = write(self.path("b"), records=records, change=conv1)
        rc, out, _ = command(a, b)
        self.assertEqual(rc, 1)
        self.assertTrue(out.startswith("first divergence: activation fc1 step 0: arises in the forward before "
                                       "activation fc1; "), out)
        self.assertEqual(tensortap.diff(a, b).attrs["first_divergence"]["arises"],
                         "in the forward before activation fc1")

        def act(kind, name, step, rank, x):
            return x * 1.01 if (kind, name) == ("activation", "act") else None
        b = write(self.path("b2"), records=records, change=act)
        rc, out, _ = command(a, b)
        self.assertIn(": arises in the forward between activation fc1 and activation act; ", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
