"""`tensortap diff --floor A2` and where a difference arises (issue 54,
items 1-3, the diff's side), on runs written here by the twin's writer (no
build, no torch): deterministic, a second or two.

    PYTHONPATH=python python3 tests/python/test_diff_floor.py

A2 stands for A's program run again with its initial weights moved by
tensortap.torch.perturb: its step-0 params are A's moved by one ulp, its
other records A's with a relative error of a chosen size (what rounding
grows into). The runs of the real twin and the C++ port are the lead's
example (examples/port_check).
"""

import contextlib
import io
import math
import os
import shutil
import tempfile
import unittest
import zlib

import numpy as np

import tensortap
from tensortap import __main__ as cli
from tensortap._writer import RunWriter, default_options

# A step as the C++ recorder and the twin order it: parameters and buffers as
# the step begins, a captured learning rate, the forward, the loss, the
# backward in reverse order, the parameters' gradients, a gradient norm.
STEP = (("param", "w1", (4, 4)), ("param", "w2", (4,)), ("buffer", "bn.mean", (4,)), ("tensor", "lr", ()),
        ("activation", "fc1", (8, 4)), ("activation", "act", (8, 4)), ("activation", "fc2", (8, 4)),
        ("tensor", "loss", ()), ("activation_grad", "fc2", (8, 4)), ("activation_grad", "act", (8, 4)),
        ("activation_grad", "fc1", (8, 4)), ("grad", "w2", (4,)), ("grad", "w1", (4, 4)),
        ("tensor", "grad_norm", ()))


def command(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["diff", *args])
    return rc, out.getvalue(), err.getvalue()


def value(kind, name, step, shape, rank=0):
    """A's value of one record: the same for every run, by its key."""
    seed = zlib.crc32(repr((kind, name, step, rank)).encode())
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape).astype(np.float32)


def ulp_moved(x, ulps=1, seed=0):
    """x with each element moved `ulps` ulps up or down."""
    up = np.random.default_rng(seed).integers(0, 2, x.shape).astype(bool)
    out = x.copy()
    for _ in range(ulps):
        out = np.where(up, np.nextafter(out, np.float32(np.inf)), np.nextafter(out, np.float32(-np.inf)))
    return out.astype(np.float32)


def write(path, steps=2, change=None, skip=(), records=STEP, world=1, extra=()):
    """A run of `records` at each step; change(kind, name, step, rank, x)
    returns the record's value in this run (None: A's); `skip`: (kind,
    name, step) left out; `extra`: more (kind, name, step, array)."""
    for rank in range(world):
        w = RunWriter(path, default_options(1, ["tensor"]), overwrite=True, rank=rank, world_size=world)
        for step in range(steps):
            for kind, name, shape in records:
                if (kind, name, step) in skip:
                    continue
                x = value(kind, name, step, shape, rank)
                if change is not None:
                    y = change(kind, name, step, rank, x)
                    x = x if y is None else np.asarray(y, dtype=np.float32)
                w.write(kind, name, step, x, "float32")
        for kind, name, step, x in extra:
            w.write(kind, name, step, np.asarray(x), str(np.asarray(x).dtype))
        w.close()
    return path


def floor_change(rel, seed=7, ulps=1):
    """A2: step-0 params moved by `ulps` ulps, everything else off by about `rel`."""
    def change(kind, name, step, rank, x):
        if kind == "param" and step == 0:
            return ulp_moved(x, ulps, seed)
        return (x * (1 + rel * signs(x.shape, seed + step))).astype(np.float32)
    return change


def signs(shape, seed):
    """+1 or -1 at random, per element: a relative error of exactly the size asked."""
    return np.random.default_rng(seed).choice([-1.0, 1.0], shape)


class Case(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-diff-floor-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)


class FloorTest(Case):
    def setUp(self):
        super().setUp()
        self.a = write(self.path("a"))
        self.a2 = write(self.path("a2"), change=floor_change(1e-5))

    def test_rounding_noise_is_noise_and_a_bug_is_not(self):
        # B: the port whose rounding differs as much as A2's (a few times its
        # relative error), but for one activation at step 1, off by 1e-3.
        def port(kind, name, step, rank, x):
            noise = signs(x.shape, 99 + step)
            y = x * (1 + 3e-5 * noise)
            if (kind, name, step) == ("activation", "fc2", 1):
                y = x * (1 + 1e-2 * noise)
            return y.astype(np.float32) if not (kind == "param" and step == 0) else None
        b = write(self.path("b"), change=port)
        rc, out, err = command(self.a, b, "--floor", self.a2)
        self.assertEqual(rc, 1, out + err)
        lines = out.splitlines()
        n = 2 * len(STEP)
        self.assertTrue(lines[0].startswith("first divergence: activation fc2 step 1: arises in the forward between "
                                            "activation act and activation fc2; "), out)
        self.assertIn(", rel_norm ", lines[0])
        self.assertIn(", floor_rel_norm ", lines[0])
        noise = n - 2 - 1  # the two step-0 params are equal; fc2 at step 1 differs
        self.assertEqual(lines[-1], f"compared {n}, differ 1, noise {noise}, only in A 0, only in B 0")
        df = tensortap.diff(self.a, b, floor=self.a2, factor=10)
        self.assertEqual(list(df.columns[-2:]), ["rel_norm", "floor_rel_norm"])
        self.assertEqual((df.status == "noise").sum(), noise)
        self.assertEqual(df.attrs["first_divergence"]["arises"], "in the forward between activation act and "
                         "activation fc2")
        self.assertTrue((df.floor_rel_norm > 0).sum() >= noise)
        # The page colours a record against its floor: log10(rel_norm / floor's), the factor the line.
        from tensortap._pages.diff import Collector

        cells = Collector(floor=True)
        for r in df.to_dict("records"):
            cells(dict(r, _floor=not math.isnan(r["floor_rel_norm"]), _u=2.0 ** -24, _a_zero=False))
        shade = {(c[1], c[2], c[3]): c[5] for c in cells.cells}
        self.assertGreater(shade[("activation", "fc2", 1)], 1.0)
        self.assertTrue(all(v <= 1.0 for (kind, name, step), v in shade.items()
                            if (kind, name, step) != ("activation", "fc2", 1) and math.isfinite(v)))
        # Without the floor, every record but the equal params differs.
        rc, out, _ = command(self.a, b)
        self.assertEqual(out.splitlines()[-1], f"compared {n}, differ {n - 2}, only in A 0, only in B 0")
        # The faithful port alone: all noise, exit 0.
        b_ok = write(self.path("b_ok"), change=lambda k, nm, s, r, x: port(k, nm, s, r, x)
                     if (k, nm, s) != ("activation", "fc2", 1) else (x * 1.00002).astype(np.float32))
        rc, out, _ = command(self.a, b_ok, "--floor", self.a2)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.splitlines()[-1], f"compared {n}, differ 0, noise {n - 2}, only in A 0, only in B 0")
        # A smaller factor makes the same records differences.
        self.assertEqual(command(self.a, b_ok, "--floor", self.a2, "--factor", "0.5")[0], 1)

    def test_no_division_a_zero_record_and_one_the_perturbation_misses(self):
        z = np.zeros(16, np.float32)
        one = np.full(16, 3.0, np.float32)
        eps = np.float32(2.0 ** -24)
        extra_a = [("grad", "zero", 1, z), ("tensor", "data", 1, one)]
        a = write(self.path("a"), extra=extra_a)
        a2 = write(self.path("a2"), change=floor_change(1e-5),
                   extra=[("grad", "zero", 1, np.full(16, 1e-20, np.float32)), ("tensor", "data", 1, one)])
        cases = ((np.full(16, 5e-20, np.float32), one * (1 + 8 * eps), "noise", "noise"),
                 (np.full(16, 1e-18, np.float32), one * (1 + 64 * eps), "differ", "differ"))
        for zero_b, data_b, want_zero, want_data in cases:
            with self.subTest(zero=want_zero, data=want_data):
                b = write(self.path("b"), extra=[("grad", "zero", 1, zero_b), ("tensor", "data", 1, data_b)])
                df = tensortap.diff(a, b, floor=a2).set_index(["kind", "name", "step"])
                # 0 in A: ||b|| against ||a2||, no division by ||a||.
                self.assertEqual(df.loc[("grad", "zero", 1), "status"], want_zero)
                self.assertTrue(math.isinf(df.loc[("grad", "zero", 1), "rel_norm"]))
                # Not reached by the perturbation (A2 equal to A): 4 u ||a|| times 10.
                self.assertEqual(df.loc[("tensor", "data", 1), "floor_rel_norm"], 0.0)
                self.assertEqual(df.loc[("tensor", "data", 1), "status"], want_data)

    def test_a_nonfinite_disagreement_is_never_noise(self):
        def nan_b(kind, name, step, rank, x):
            if (kind, name, step) == ("activation", "act", 1):
                y = x.copy()
                y.flat[0] = np.nan
                return y
            return None
        b = write(self.path("b"), change=nan_b)
        df = tensortap.diff(self.a, b, floor=self.a2, factor=1e30)
        self.assertEqual(list(df[df.status != "equal"].status), ["differ"])
        # The same NaN in A2 does not make it a floor either.
        a2 = write(self.path("a2nan"), change=lambda *k: nan_b(*k) if k[:3] == ("activation", "act", 1)
                   else floor_change(1e-5)(*k))
        df = tensortap.diff(self.a, b, floor=a2, factor=1e30)
        self.assertEqual(list(df[df.status != "equal"].status), ["differ"])

    def test_integer_records_count_differing_elements(self):
        base = np.arange(40, dtype=np.int64)

        def moved(k):
            x = base.copy()
            x[:k] += 1
            return x
        a = write(self.path("ai"), extra=[("tensor", "tokens", 0, base), ("tensor", "mask", 0, base % 2 == 0)])
        a2 = write(self.path("a2i"), change=floor_change(1e-5),
                   extra=[("tensor", "tokens", 0, moved(2)), ("tensor", "mask", 0, base % 3 == 0)])
        for k, want in ((20, "noise"), (21, "differ")):
            with self.subTest(k=k):
                b = write(self.path("bi"), extra=[("tensor", "tokens", 0, moved(k)),
                                                  ("tensor", "mask", 0, base % 2 == 0)])
                df = tensortap.diff(a, b, floor=a2).set_index(["kind", "name", "step"])
                self.assertEqual(df.loc[("tensor", "tokens", 0), "status"], want)
                self.assertEqual(df.loc[("tensor", "mask", 0), "status"], "equal")

    def test_records_without_a_floor_are_judged_by_the_tolerance(self):
        a2 = write(self.path("a2s"), change=floor_change(1e-5), skip={("grad", "w1", 1), ("grad", "w2", 1)})
        b = write(self.path("b"), change=lambda k, n, s, r, x: (x * 1.001).astype(np.float32)
                  if (k, s) == ("grad", 1) else None)
        rc, out, _ = command(self.a, b, "--floor", a2, "--rtol", "1e-2")
        self.assertEqual(rc, 0, out)
        self.assertIn("without floor (2: not in A2, judged by --rtol/--atol):", out)
        self.assertIn("  grad w2 step 1", out)
        df = tensortap.diff(self.a, b, floor=a2)
        self.assertEqual(df.attrs["without_floor"], 2)
        self.assertEqual(set(df[df.status == "differ"].name), {"w1", "w2"})

    def test_saturated_and_uninformative(self):
        # A2 drifts away with the steps (chaotic training): from step 3 the
        # median floor_rel_norm passes 1e-3. One gradient is rounding noise
        # from its first step (30% off in A2).
        def drifting(kind, name, step, rank, x):
            if kind == "param" and step == 0:
                return ulp_moved(x)
            rel = (1e-6, 1e-5, 1e-4, 5e-4, 1e-2, 0.1)[step]
            if (kind, name) == ("grad", "w2"):
                rel = 0.3
            return (x * (1 + rel * signs(x.shape, step))).astype(np.float32)
        # A bias initialised to zero: moved to a subnormal in A2, its
        # floor_rel_norm is inf, a ratio to nothing; it counts in neither finding.
        zero = np.zeros(4, np.float32)
        a = write(self.path("a6"), steps=6, extra=[("param", "zero_bias", 0, zero)])
        a2 = write(self.path("a26"), steps=6, change=drifting, extra=[("param", "zero_bias", 0, ulp_moved(zero))])
        rc, out, _ = command(a, a, "--floor", a2)
        self.assertEqual(rc, 0, out)
        self.assertIn("floor saturated from step 4: the median floor_rel_norm passes 0.001", out)
        self.assertIn("uninformative (rounding noise in A itself): 1 records, e.g. grad w2", out)
        df = tensortap.diff(a, a, floor=a2)
        self.assertEqual(df.attrs["floor_saturated_step"], 4)
        self.assertEqual(df.attrs["uninformative"], [{"rank": 0, "kind": "grad", "name": "w2", "step": 0}])
        # No floor, no such findings.
        self.assertNotIn("floor_saturated_step", tensortap.diff(a, a).attrs)


class RefusedFloorTest(Case):
    def setUp(self):
        super().setUp()
        self.a = write(self.path("a"))
        self.b = write(self.path("b"))

    def refused(self, a2, *more, a=None):
        rc, out, err = command(a or self.a, self.b, "--floor", a2, *more)
        self.assertEqual(rc, 2, out + err)
        self.assertEqual(out, "")
        return err

    def test_a_without_step_0_params(self):
        a = write(self.path("a_np"), skip={("param", "w1", 0), ("param", "w2", 0)})
        err = self.refused(write(self.path("a2"), skip={("param", "w1", 0), ("param", "w2", 0)}), a=a)
        self.assertIn("A has no param records at step 0", err)
        self.assertIn("record kind param", err)

    def test_params_further_than_ulps(self):
        a2 = write(self.path("a2"), change=floor_change(1e-5, ulps=2))
        err = self.refused(a2)
        self.assertIn("A2 is not A perturbed by at most 1 ulp(s): param w1 step 0: element 0 is 2 ulps from A's", err)
        self.assertEqual(command(self.a, self.b, "--floor", a2, "--ulps", "2")[0], 0)
        with self.assertRaisesRegex(ValueError, "param w1 step 0"):
            tensortap.diff(self.a, self.b, floor=a2, ulps=1)

    def test_records_that_differ_in_kind_name_or_shape(self):
        err = self.refused(write(self.path("a2x"), change=floor_change(1e-5), extra=[("grad", "w3", 0, np.ones(2))]))
        self.assertIn("its grad w3 step 0 is not in A", err)
        shapes = tuple((k, n, (2, 8) if (k, n) == ("activation", "fc1") else s) for k, n, s in STEP)
        err = self.refused(write(self.path("a2s"), change=floor_change(1e-5), records=shapes))
        self.assertIn("activation fc1 step 0 is float32 [8, 4] in A, float32 [2, 8] in A2", err)
        err = self.refused(write(self.path("a2m"), change=floor_change(1e-5), skip={("param", "w2", 0)}))
        self.assertIn("A2 has no param w2 step 0", err)

    def test_an_unperturbed_a2_is_said(self):
        rc, out, _ = command(self.a, self.b, "--floor", self.a)
        self.assertEqual(rc, 0)
        self.assertIn("floor: A2's step-0 parameters are A's bit for bit (not perturbed?)", out)


class ArisesTest(Case):
    """Where the first divergence arises (DESIGN.md section 10)."""

    def arises(self, differs, records=STEP, steps=2, world=1, skip=()):
        a = write(self.path("a"), steps=steps, records=records, world=world, skip=skip)

        def change(kind, name, step, rank, x):
            return (x * 1.01).astype(np.float32) if (kind, name, step, rank) in differs else None
        b = write(self.path("b"), steps=steps, records=records, world=world, change=change, skip=skip)
        rc, out, _ = command(a, b)
        self.assertEqual(rc, 1, out)
        first = out.splitlines()[0]
        df = tensortap.diff(a, b)
        clause = df.attrs["first_divergence"]["arises"]
        self.assertIn(f": arises {clause}; ", first)
        return first.split(": arises ")[0], clause

    def test_each_clause(self):
        cases = [
            ({("param", "w1", 0, 0)}, "param w1 step 0", "in the initial state"),
            ({("buffer", "bn.mean", 0, 0)}, "buffer bn.mean step 0", "in the initial state"),
            ({("activation", "fc2", 0, 0), ("activation", "fc2", 1, 0)}, "activation fc2 step 0",
             "in the forward between activation act and activation fc2"),
            ({("activation", "fc1", 0, 0)}, "activation fc1 step 0",
             "in the forward between tensor lr and activation fc1"),
            ({("tensor", "loss", 0, 0), ("activation_grad", "fc2", 0, 0)}, "tensor loss step 0", "in the loss"),
            ({("tensor", "lr", 0, 0)}, "tensor lr step 0", "in a captured tensor lr"),
            ({("tensor", "grad_norm", 0, 0)}, "tensor grad_norm step 0", "in a captured tensor grad_norm"),
            ({("activation_grad", "fc2", 0, 0)}, "activation_grad fc2 step 0",
             "in the backward between tensor loss and activation_grad fc2"),
            ({("grad", "w2", 0, 0)}, "grad w2 step 0", "in the backward between activation_grad fc1 and grad w2"),
            ({("param", "w1", 1, 0), ("activation", "fc1", 1, 0)}, "param w1 step 1",
             "in the update between steps 0 and 1"),
            ({("buffer", "bn.mean", 1, 0)}, "buffer bn.mean step 1", "in a buffer: bn.mean between steps 0 and 1"),
            ({("activation", "act", 1, 0)}, "activation act step 1",
             "in the forward between activation fc1 and activation act"),
        ]
        for differs, where, clause in cases:
            with self.subTest(clause=clause, where=where):
                got_where, got = self.arises(differs)
                self.assertEqual((got_where, got), ("first divergence: " + where, clause))

    def test_without_params_the_update_and_the_forward_are_not_told_apart(self):
        no_params = tuple(r for r in STEP if r[0] not in ("param", "buffer", "tensor"))
        where, clause = self.arises({("activation", "act", 1, 0)}, records=no_params)
        self.assertEqual(where, "first divergence: activation act step 1")
        self.assertEqual(clause, "between steps 0 and 1 (record kind param to tell the update from the forward)")
        # At the first step, nothing before it: "before".
        _, clause = self.arises({("activation", "fc1", 0, 0)}, records=no_params)
        self.assertEqual(clause, "in the forward before activation fc1")

    def test_a_loss_without_activations_and_a_recomputed_forward(self):
        loss_only = (("param", "w", (2,)), ("tensor", "loss", ()), ("grad", "w", (2,)))
        _, clause = self.arises({("tensor", "loss", 0, 0)}, records=loss_only)
        self.assertEqual(clause, "in the loss")
        # Activation checkpointing: the forward's activations recorded again
        # during the backward, after a gradient; they differ, so the
        # gradient before them is not where it arises.
        recompute = (("param", "w", (2,)), ("grad", "w", (2,)), ("activation", "block#1", (2,)))
        _, clause = self.arises({("grad", "w", 0, 0), ("activation", "block#1", 0, 0)}, records=recompute)
        self.assertEqual(clause, "in the forward (activation block#1 differs, recorded after it)")

    def test_a_rank(self):
        where, clause = self.arises({("activation", "fc2", 1, 1)}, world=2)
        self.assertEqual(where, "first divergence: activation fc2 step 1 rank 1")
        self.assertEqual(clause, "in the forward between activation act and activation fc2")


class OneSidedKindsTest(Case):
    def test_a_kind_the_other_run_does_not_record_names_the_fix(self):
        no_state = tuple(r for r in STEP if r[0] not in ("buffer", "param"))
        a = write(self.path("a"))
        b = write(self.path("b"), records=no_state)
        rc, out, _ = command(a, b)
        self.assertEqual(rc, 1)
        self.assertIn("only in A: 2 buffer records (record kind buffer in B: Options::kinds, or "
                      "tensortap.torch.watch(kinds=...))", out)
        self.assertIn("only in A: 4 param records (record kind param in B: ", out)
        self.assertEqual(out.splitlines()[-1], f"compared {2 * len(no_state)}, differ 0, only in A 6, only in B 0")
        rc, out, _ = command(b, a)
        self.assertIn("only in B: 2 buffer records (record kind buffer in A: ", out)
        # A kind both record, with a record missing: no such line.
        c = write(self.path("c"), skip={("buffer", "bn.mean", 1)})
        rc, out, _ = command(a, c)
        self.assertIn("only in A (1):", out)
        self.assertNotIn("record kind", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
