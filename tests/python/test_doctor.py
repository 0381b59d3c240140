"""The doctor's rules, each at its boundaries, on runs written here (a
statistics table, or records through the Python writer), and its command:
lines, exit statuses, --set, --rules, --json, ranks, the DataFrame
(tensortap/_doctor/rules.py defines the rules; ctest doctor.rules, one tree).
With TT_E2E_DIR (the e2e runs), statistics computed from records are checked
against the recorder's own.

    python3 tests/python/test_doctor.py
"""

import contextlib
import io
import json
import math
import os
import shutil
import tempfile
import unittest
import unittest.mock
import warnings

import numpy as np

import tensortap
from tensortap import __main__ as cli
from tensortap._doctor import command as DC
from tensortap._doctor import rules as D
from tensortap._doctor.rows import statistics
from tensortap._writer import RunWriter, default_options

FIELDS = ("step", "series") + tensortap.STATS_FIELDS
DTYPE = np.dtype([(f, "<f8" if f in ("min", "max", "mean", "std", "norm") else "<i8") for f in FIELDS])


def stat(values):
    """The statistics row of `values`."""
    return statistics(np.asarray(values, dtype=np.float64))[0]


def with_rms(rms, numel=100):
    """A row of `numel` values of magnitude `rms`."""
    return stat(np.full(numel, rms))


class Runs(unittest.TestCase):
    """Runs written into a temporary directory."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tt-doctor-")
        # Every RuntimeWarning is a failure: the rules divide and take logs of
        # statistics that may be 0.
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("error", RuntimeWarning)

    def tearDown(self):
        self._warnings.__exit__(None, None, None)
        shutil.rmtree(self.tmp)

    def run_dir(self, rows, name="run", rank=None, world=1, records=(), dumps=None, options=None):
        """A run whose statistics table holds `rows`, [(step, kind, name, row)] in
        the order written, and full `records`, [(step, kind, name, array)]; None
        rows: no table at all."""
        path = os.path.join(self.tmp, name)
        w = RunWriter(path, dict(default_options(1, list(tensortap.KINDS)), **(options or {})), overwrite=True,
                      rank=rank or 0, world_size=world)
        for step, kind, n, a in records:
            a = np.asarray(a, dtype=np.float32)
            w.write(kind, n, step, a, "float32")
        w.close()
        d = w.path
        if rows is not None:
            series = {}
            table = np.zeros(len(rows), DTYPE)
            for i, (step, kind, n, row) in enumerate(rows):
                table[i]["step"] = step
                table[i]["series"] = series.setdefault((kind, n), len(series))
                for f in tensortap.STATS_FIELDS:
                    table[i][f] = row[f]
            np.save(os.path.join(d, "stats.npy"), table)
            with open(os.path.join(d, "stats_series.jsonl"), "w") as f:
                for (kind, n), i in series.items():
                    f.write(json.dumps({"series": i, "kind": kind, "name": n}) + "\n")
        if dumps is not None:
            with open(os.path.join(d, "run.json")) as f:
                info = json.load(f)
            info["dumps"] = dumps
            with open(os.path.join(d, "run.json"), "w") as f:
                json.dump(info, f)
        return path

    def findings(self, path, rule, **params):
        frame = tensortap.doctor(path, rules=[rule], params={f"{rule}.{k}": v for k, v in params.items()})
        return frame, [tuple(r) for r in frame[["kind", "name", "first_step", "last_step"]].itertuples(index=False)]

    def command(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(["doctor", *argv])
        return status, out.getvalue().splitlines(), err.getvalue()


class EpisodesTest(unittest.TestCase):
    def test_patience_bridging_and_closing(self):
        c = np.array([1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 1], bool)
        m = np.arange(len(c), dtype=float)
        sid = np.zeros(len(c), np.int64)
        # Two at the start: short of patience 3. 3..5 opens it; the gap at 6 is
        # bridged, 7 extends it; 8 and 9 close it; 10 alone is short again.
        self.assertEqual(D.episodes(sid, c, m, 3, True), [(3, 7, 7.0)])
        self.assertEqual(D.episodes(sid, c, m, 3, False), [(3, 7, 3.0)])
        self.assertEqual(D.episodes(sid, c, m, 1, True), [(0, 7, 7.0), (10, 10, 10.0)])

    def test_a_series_boundary_is_never_bridged(self):
        c = np.ones(6, bool)
        sid = np.array([0, 0, 0, 1, 1, 1])
        self.assertEqual(D.episodes(sid, c, np.zeros(6), 3, True), [(0, 2, 0.0), (3, 5, 0.0)])
        self.assertEqual(D.episodes(sid, c, np.zeros(6), 4, True), [])


class RulesTest(Runs):
    def test_vanishing_gradient(self):
        rows = []
        for s in range(20):
            rows.append((s, "grad", "fc1.weight", with_rms(1e-9 if 10 <= s < 15 else 1e-3)))
            rows.append((s, "grad", "fc2.weight", with_rms(1e-7)))                    # at the threshold: not below
            rows.append((s, "grad", "fc3.weight", with_rms(1e-9 if s in (3, 4) else 1e-3)))  # 2 < patience 3
            rows.append((s, "grad", "norm.bias", with_rms(0.0)))                      # a bias: not judged
        path = self.run_dir(rows)
        frame, found = self.findings(path, "vanishing_gradient")
        self.assertEqual(found, [("grad", "fc1.weight", 10, 14)])
        self.assertAlmostEqual(frame.value[0] / 1e-9, 1.0)
        self.assertEqual(frame.threshold[0], 1e-7)
        self.assertEqual(frame.message[0], "RMS 1e-9 below 1e-7")
        self.assertIn(("grad", "norm.bias", 0, 19), self.findings(path, "vanishing_gradient", include="")[1])

    def test_exploding_tensor_names_the_first_tensor_of_a_blow_up(self):
        rows = []
        for s in range(20):
            bad = 5 <= s <= 8
            rows.append((s, "activation", "a", stat([1.0, 1e3] if s == 12 else [1.0, 2.0])))
            rows.append((s, "activation", "b", stat([np.nan, 1.0] if bad else [1.0])))
            rows.append((s, "grad", "w", stat([np.inf, 1.0] if 6 <= s <= 8 or s == 17 else [1.0])))
        path = self.run_dir(rows)
        frame, found = self.findings(path, "exploding_tensor")
        # Steps 5-8 are one blow-up: b was first (a row before w in step 5);
        # step 17 is another, w's.
        self.assertEqual(found, [("activation", "b", 5, 8), ("grad", "w", 17, 17)])
        self.assertEqual(frame.message[0], "1 of 2 values non-finite (NaN 1); then 1 more tensor")
        self.assertEqual((frame.value[0], frame.threshold[0]), (1.0, 0.0))
        frame, found = self.findings(path, "exploding_tensor", bound=100)
        self.assertEqual(found, [("activation", "b", 5, 8), ("activation", "a", 12, 12), ("grad", "w", 17, 17)])
        self.assertEqual((frame.value[1], frame.threshold[1]), (1e3, 100.0))

    def test_all_zero_spares_a_parameter_at_its_first_step(self):
        rows = []
        for s in range(6):
            rows.append((s, "param", "bn.bias", stat([0.0, 0.0] if s == 0 else [0.1, 0.2])))   # zero-init, trained
            rows.append((s, "param", "frozen.weight", stat([0.0, 0.0])))                      # never moves
            rows.append((s, "activation", "x", stat([0.0, 0.0] if s in (3, 4) else [1.0, 0.0])))
            rows.append((s, "activation", "y", stat([0.0] if s == 2 else [1.0])))             # once: < patience 2
        frame, found = self.findings(self.run_dir(rows), "all_zero")
        self.assertEqual(found, [("param", "frozen.weight", 1, 5), ("activation", "x", 3, 4)])
        self.assertEqual(frame.message[1], "all 2 values zero")

    def test_unchanged_tensor_needs_a_gradient(self):
        rows = []
        for s in range(6):
            for n in ("stuck.weight", "frozen.weight", "still.weight", "moving.weight"):
                rows.append((s, "param", n, stat([1.0, 2.0 + (s if n == "moving.weight" else 0)])))
            rows.append((s, "grad", "stuck.weight", stat([0.5, 0.5])))
            rows.append((s, "grad", "still.weight", stat([0.0, 0.0])))      # a zero gradient: nothing to apply
            rows.append((s, "grad", "moving.weight", stat([0.5, 0.5])))
        frame, found = self.findings(self.run_dir(rows), "unchanged_tensor")
        # Identical from step 0: 3 identical evaluations at step 2; the episode starts at 0.
        self.assertEqual(found, [("param", "stuck.weight", 0, 5)])
        self.assertAlmostEqual(frame.value[0], math.sqrt(0.5))
        frame, found = self.findings(self.run_dir(rows), "unchanged_tensor", num_steps=7)
        self.assertEqual(found, [])
        no_grads = [r for r in rows if r[1] != "grad"]
        frame, _ = self.findings(self.run_dir(no_grads, name="no_grads"), "unchanged_tensor")
        self.assertIn("needs kind grad", frame.attrs["not_evaluated"]["unchanged_tensor"])

    def test_loss_not_decreasing(self):
        def run(values, name):
            return self.run_dir([(s, "tensor", "loss", stat(v)) for s, v in enumerate(values)], name=name)

        flat = run([2.3] * 60, "flat")
        frame, found = self.findings(flat, "loss_not_decreasing")
        # Whole windows of 20: evaluated at the 40th and 60th values (steps 39, 59).
        self.assertEqual(found, [("tensor", "loss", 39, 59)])
        self.assertEqual((frame.value[0], frame.threshold[0]), (0.0, 0.001))
        # A run that learned and plateaus is healthy.
        learned = run(list(np.linspace(2.3, 0.5, 30)) + [0.5] * 50, "learned")
        self.assertEqual(self.findings(learned, "loss_not_decreasing")[1], [])
        # 4% below its start and flat: never 5% below, so not decreasing.
        slow = run([2.3] * 20 + [2.21] * 40, "slow")
        self.assertEqual(self.findings(slow, "loss_not_decreasing")[1], [("tensor", "loss", 59, 59)])
        short = run([2.3] * 39, "short")
        frame, _ = self.findings(short, "loss_not_decreasing")
        self.assertEqual(frame.attrs["not_evaluated"]["loss_not_decreasing"],
                         "needs 2 x window = 40 values of tensor 'loss'; it has 39")
        self.assertEqual(self.findings(short, "loss_not_decreasing", window=10)[1], [("tensor", "loss", 19, 29)])
        frame, _ = self.findings(short, "loss_not_decreasing", name="g_loss")
        self.assertIn("no tensor named 'g_loss'", frame.attrs["not_evaluated"]["loss_not_decreasing"])

    def test_dead_relu(self):
        rows = []
        for s in range(5):
            rows.append((s, "activation", "relu1", stat([0.0] * 99 + [1.0])))   # 99% zero
            rows.append((s, "activation", "relu2", stat([0.0] * 9 + [1.0])))    # 90%: alive enough
            rows.append((s, "activation", "hidden", stat([0.0] * 10)))          # not a ReLU's name
            rows.append((s, "activation", "relu1_input", stat([0.0] * 10)))     # a ReLU's input: not judged
        frame, found = self.findings(self.run_dir(rows), "dead_relu")
        self.assertEqual(found, [("activation", "relu1", 0, 4)])
        self.assertEqual(frame.message[0], "99% of values zero, above 95%")
        self.assertEqual(self.findings(self.run_dir(rows, name="b"), "dead_relu", threshold=0.8)[1],
                         [("activation", "relu1", 0, 4), ("activation", "relu2", 0, 4)])

    def test_saturation_from_statistics_is_a_lower_bound_of_the_values(self):
        rng = np.random.default_rng(1)
        rows, exact = [], {}
        for kind in ("tanh", "sigmoid", "tanh_input", "sigmoid_input"):
            for i in range(150):
                name = f"{kind.split('_')[0]}{i}" + ("_input" if kind.endswith("_input") else "")
                x = rng.normal(size=rng.integers(1, 200)) * 10 ** rng.uniform(-1, 2.5)
                v = x if kind.endswith("_input") else np.tanh(x) if kind == "tanh" else (1 + np.tanh(x / 2)) / 2
                rows.append((0, "activation", name, stat(v)))
                exact[name] = D.saturation_measure(name, 0.1)(v)
        frame = tensortap.doctor(self.run_dir(rows), rules=["saturated_activation"],
                                 params={"saturated_activation.threshold": 1e-9, "saturated_activation.patience": 1})
        bounds = dict(zip(frame.name, frame.value))
        self.assertGreater(len(bounds), 100)
        for name, bound in bounds.items():
            self.assertLessEqual(bound, exact[name] + 1e-12, name)

    def test_saturated_activation(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(5, 256))
        rows, records = [], []
        for s in range(5):
            rows.append((s, "activation", "tanh1", stat(np.tanh(100 * x[s]))))
            rows.append((s, "activation", "tanh1_input", stat(100 * x[s])))
            rows.append((s, "activation", "tanh2", stat(np.tanh(x[s]))))
            rows.append((s, "activation", "softmax", stat(np.tanh(100 * x[s]))))   # not judged
            records += [(s, kind, n, np.tanh(100 * x[s]) if n in ("tanh1", "softmax") else 100 * x[s] if n ==
                         "tanh1_input" else np.tanh(x[s])) for _, kind, n, _ in rows[-4:]]
        frame, found = self.findings(self.run_dir(rows), "saturated_activation")
        # From statistics: the output's bound suffices; the input's (|x| up to
        # 300, mean square 1e4) does not.
        self.assertEqual(found, [("activation", "tanh1", 0, 4)])
        self.assertTrue(frame.message[0].startswith("at least "), frame.message[0])
        frame, found = self.findings(self.run_dir(None, name="records", records=records), "saturated_activation")
        self.assertEqual(found, [("activation", "tanh1", 0, 4), ("activation", "tanh1_input", 0, 4)])
        self.assertAlmostEqual(frame.value[1], float(np.max(np.mean(np.abs(100 * x) > np.arctanh(np.sqrt(0.9)),
                                                                      axis=1))), places=6)

    def test_tensor_variance(self):
        rows = []
        for s in range(30):
            rows.append((s, "activation", "up", stat([0.0, 2.0 * (1000 if s >= 20 else 1)])))
            rows.append((s, "grad", "down.weight", stat([0.0, 2.0 / (1000 if s >= 25 else 1)])))
            rows.append((s, "activation", "steady", stat([0.0, 2.0 * (50 if s >= 20 else 1)])))
            rows.append((s, "tensor", "loss", stat([1e-6 if s >= 20 else 1.0])))     # kind tensor: not judged
        frame, found = self.findings(self.run_dir(rows), "tensor_variance")
        # The median of 50 holds the old level until more than half are new.
        self.assertEqual(found, [("activation", "up", 20, 29), ("grad", "down.weight", 25, 29)])
        self.assertEqual((frame.value[0], frame.threshold[0]), (1000.0, 100.0))
        self.assertAlmostEqual(frame.value[1], 1e-3)
        self.assertEqual(frame.threshold[1], 0.01)
        self.assertEqual(self.findings(self.run_dir(rows, name="w"), "tensor_variance", window=5)[1],
                         [("activation", "up", 20, 22), ("grad", "down.weight", 25, 27)])

    def test_poor_weight_initialization(self):
        def rows(stds):
            return [(s, "activation", f"relu{i + 1}_input", stat([-sd, sd])) for s in (0, 1)
                    for i, sd in enumerate(stds)]

        frame, _ = self.findings(self.run_dir(rows([1.0, 0.01, 100.0])), "poor_weight_initialization")
        self.assertEqual(list(frame.kind), [None])
        self.assertEqual((frame.first_step[0], frame.last_step[0], frame.value[0]), (0, 0, 1e4))
        self.assertIn("(relu2_input) to 100 (relu3_input)", frame.message[0])
        status, lines, _ = self.command(self.run_dir(rows([1.0, 0.01, 100.0]), name="c"), "--rules",
                                        "poor_weight_initialization")
        self.assertTrue(lines[1].startswith("poor_weight_initialization: - - steps 0..0: std spans 0.01"), lines)
        self.assertEqual(lines[0], "likely cause: " + lines[1])
        self.assertEqual(self.findings(self.run_dir(rows([1.0, 0.3, 2.0]), name="ok"),
                                       "poor_weight_initialization")[1], [])
        frame, _ = self.findings(self.run_dir(rows([1.0]), name="one"), "poor_weight_initialization")
        self.assertIn("needs two activations", frame.attrs["not_evaluated"]["poor_weight_initialization"])

    def test_weight_update_ratio(self):
        w = np.linspace(1.0, 2.0, 16)
        records = []
        for s in range(6):
            records.append((s, "param", "fast.weight", w * (1.5 ** s)))              # r = 0.5 a step
            records.append((s, "param", "fine.weight", w * (1.001 ** s)))            # r = 1e-3
            records.append((s, "param", "slow.weight", w + (1e-6 if s >= 3 else 0)))  # r ~ 0, then one move
            records.append((s, "param", "frozen.weight", w))                          # no gradient: never judged
            records.append((s, "param", "fast.bias", w * (1.5 ** s)))                 # a bias: not judged
            records.append((s, "grad", "slow.weight", np.ones(16)))
        path = self.run_dir(None, records=records)
        frame, found = self.findings(path, "weight_update_ratio")
        # slow.weight: too slow at 0-1, 1-2, 3-4, 4-5; the move at 2-3 is one
        # evaluation: bridged, one episode.
        self.assertEqual(found, [("param", "fast.weight", 0, 5), ("param", "slow.weight", 0, 5)])
        self.assertAlmostEqual(frame.value[0], 0.5, places=5)
        self.assertEqual(frame.message[1], "update ratio 0 a step, below 1e-8")
        # Every other step recorded: the ratio is per step.
        sparse = self.run_dir(None, name="sparse", records=[r for r in records if r[0] % 2 == 0])
        frame, found = self.findings(sparse, "weight_update_ratio")
        self.assertAlmostEqual(frame.value[0], (1.5 ** 2 - 1) / 2, places=5)

    def test_stalled_training(self):
        dumps = [{"step": 7, "reason": "stall", "steps": [], "last_step": 7, "stalled_seconds": 612.5},
                 {"step": 9, "reason": "request", "steps": []}]
        path = self.run_dir([(0, "tensor", "loss", stat([1.0]))], dumps=dumps, options={"stall_after_ms": 600000})
        status, lines, _ = self.command(path, "--rules", "stalled_training", "--all")
        self.assertEqual(lines, ["stalled_training: - - steps 7..7: no step() for 612 s after step 7 "
                                 "(stall_after 600 s)", "1 finding"])
        self.assertEqual(status, 1)
        frame, _ = self.findings(path, "stalled_training")
        self.assertEqual((frame.value[0], frame.threshold[0]), (612.5, 600.0))
        plain = self.run_dir([(0, "tensor", "loss", stat([1.0]))], name="plain")
        status, lines, _ = self.command(plain, "--rules", "stalled_training")
        self.assertEqual(lines, ["stalled_training: not evaluated: the run was recorded without stall_after "
                                 "(Options::stall_after)", "0 findings"])
        self.assertEqual(status, 2)


class CommandTest(Runs):
    def planted(self, name="run", **kw):
        rows = []
        for s in range(5):
            rows.append((s, "activation", "relu1", stat([0.0] * 99 + [1.0])))
            rows.append((s, "activation", "aten::add/relu", stat([0.0] * 100)))   # colons in a name
            rows.append((s, "grad", "fc.weight", with_rms(0.1)))
        return self.run_dir(rows, name=name, **kw)

    def test_lines_and_exit_statuses(self):
        path = self.planted()
        status, lines, err = self.command(path, "--rules", "dead_relu,vanishing_gradient,stalled_training", "--all")
        self.assertEqual(status, 1)
        # Per tensor, in the model's order (relu1 is written first each step).
        self.assertEqual(lines, [
            "dead_relu: activation relu1 steps 0..4: 99% of values zero, above 95%",
            "dead_relu: activation aten::add/relu steps 0..4: 100% of values zero, above 95%",
            "stalled_training: not evaluated: the run was recorded without stall_after (Options::stall_after)",
            "2 findings"])
        self.assertEqual(err, "")
        # By default: the likely cause, then one line for the two (their episodes overlap).
        status, grouped, _ = self.command(path, "--rules", "dead_relu,vanishing_gradient,stalled_training")
        self.assertEqual((status, grouped), (1, [
            "likely cause: dead_relu: activation relu1 steps 0..4: 99% of values zero, above 95%",
            "dead_relu: 2 activations (relu1 ... aten::add/relu) steps 0..4: 99%..100% of values zero, above 95%",
            "stalled_training: not evaluated: the run was recorded without stall_after (Options::stall_after)",
            "1 finding"]))
        # The message is what follows "steps <first>..<last>: ", colons in the name or not.
        frame = tensortap.doctor(path, rules=["dead_relu"])
        self.assertEqual(list(frame.message), [ln.split(" steps 0..4: ", 1)[1] for ln in lines[:2]])
        self.assertEqual(list(frame.group), [0, 0])
        status, lines, _ = self.command(path, "--rules", "vanishing_gradient")
        self.assertEqual((status, lines), (0, ["0 findings"]))
        status, lines, _ = self.command(path, "--rules", "dead_relu", "--set", "dead_relu.include=^relu")
        self.assertEqual((status, lines[-1]), (1, "1 finding"))
        # No rule could be evaluated: 2.
        status, lines, _ = self.command(path, "--rules", "weight_update_ratio,poor_weight_initialization")
        self.assertEqual(status, 2)
        self.assertEqual(lines[-1], "0 findings")

    def test_bad_input_is_refused_by_name(self):
        path = self.planted()
        for args, said in [
                (["--rules", "dead_relu,nope"], "no rule 'nope'"),
                (["--rules", ""], "--rules wants rule names"),
                (["--set", "nope.x=1"], "no rule 'nope'"),
                (["--set", "dead_relu.nope=1"], "dead_relu has no parameter 'nope'; its parameters: include, "
                                                "threshold, patience"),
                (["--set", "dead_relu.threshold=1.5"], "dead_relu.threshold='1.5': wants a number between 0 and 1"),
                (["--set", "dead_relu.threshold=nan"], "wants a number"),
                (["--set", "dead_relu.patience=2.5"], "dead_relu.patience='2.5': wants an integer >= 1"),
                (["--set", "dead_relu.patience=0"], "wants an integer >= 1"),
                (["--set", "dead_relu.include=("], "dead_relu.include='(': wants a regular expression"),
                (["--set", "all_zero.kinds=grad+weights"], "'weights' is not a kind"),
                (["--set", "dead_relu.threshold"], "wants <rule>.<parameter>=<value>"),
                (["--set", "dead_relu.threshold=0.5", "--set", "dead_relu.threshold=0.6"], "given twice"),
                (["--rules", "all_zero", "--set", "dead_relu.threshold=0.5"], "not among the rules evaluated"),
                (["--set", "stalled_training.x=1"], "its parameters: none")]:
            status, lines, err = self.command(path, *args)
            self.assertEqual((status, lines), (2, []), args)
            self.assertIn(said, err, args)
        status, _, err = self.command(os.path.join(self.tmp, "missing"))
        self.assertEqual(status, 2)
        self.assertIn("not a tensortap run", err)
        with self.assertRaisesRegex(ValueError, "dead_relu.threshold='True': wants a number"):
            tensortap.doctor(path, params={"dead_relu.threshold": True})

    def test_json(self):
        path = self.planted()
        status, lines, _ = self.command(path, "--json", "--rules", "dead_relu,stalled_training")
        self.assertEqual(status, 1)
        objects = [json.loads(ln) for ln in lines]
        self.assertEqual(list(objects[0]), list(D.COLUMNS))
        self.assertEqual(objects[1]["name"], "aten::add/relu")
        self.assertEqual((objects[1]["rank"], objects[1]["value"], objects[1]["threshold"], objects[1]["group"]),
                         (0, 1.0, 0.95, 0))
        self.assertEqual(objects[-1], {"rule": "stalled_training", "not_evaluated": "the run was recorded without "
                                       "stall_after (Options::stall_after)"})
        self.assertEqual(len(objects), 3)

    def test_ranks(self):
        for r in (0, 1):
            rows = [(s, "activation", "relu1", stat([0.0] * 100 if r == 1 else [0.0, 1.0])) for s in range(4)]
            self.run_dir(rows, name="ranks", rank=r, world=2)
        path = os.path.join(self.tmp, "ranks")
        status, lines, _ = self.command(path, "--rules", "dead_relu")
        line = "dead_relu: activation relu1 rank 1 steps 0..3: 100% of values zero, above 95%"
        self.assertEqual(lines, ["likely cause: " + line, line, "1 finding"])
        frame = tensortap.doctor(path, rules=["dead_relu"])
        self.assertEqual(list(frame.columns), list(D.COLUMNS))
        self.assertEqual(list(frame["rank"]), [1])

    def test_frame(self):
        path = self.planted()
        frame = tensortap.doctor(tensortap.open(path), params={"dead_relu.threshold": 0.995})
        self.assertEqual(list(frame.columns), list(D.COLUMNS))
        self.assertEqual([str(frame[c].dtype) for c in ("rank", "first_step", "last_step", "value", "threshold")],
                         ["int64", "int64", "int64", "float64", "float64"])
        # relu1 (99% zero) is below 99.5%; the other is all zero (all_zero too):
        # the dead unit first, its zeros' consequence after.
        self.assertEqual(list(zip(frame.rule, frame.name)), [("dead_relu", "aten::add/relu"),
                                                              ("all_zero", "aten::add/relu")])
        self.assertEqual(list(frame.group), [0, 1])
        self.assertEqual(frame.attrs["statistics"], {0: "statistics"})
        self.assertEqual(set(frame.attrs["not_evaluated"]), {"loss_not_decreasing", "saturated_activation",
                                                             "poor_weight_initialization", "weight_update_ratio",
                                                             "unchanged_tensor", "stalled_training"})
        empty = tensortap.doctor(path, rules="vanishing_gradient")
        self.assertEqual((len(empty), list(empty.columns)), (0, list(D.COLUMNS)))

    def test_statistics_from_records_are_said_once(self):
        records = [(s, "activation", "relu1", [0.0] * 99 + [1.0]) for s in range(4)]
        for r in (0, 1):
            self.run_dir(None, name="two", rank=r, world=2, records=records)
        status, lines, err = self.command(os.path.join(self.tmp, "two"), "--rules", "dead_relu")
        self.assertEqual(status, 1)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("no statistics table (stats.npy) (ranks 0, 1): the rules use statistics computed from the "
                      "full records", err)


class InspectTest(Runs):
    """`tensortap inspect` counts the health rules' live firings (dumps whose
    reason is a rule's name) and points to the doctor; it evaluates no rule."""

    def inspect(self, path):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = cli.main(["inspect", path])
        return status, out.getvalue().splitlines()

    def test_live_firings_are_counted_and_the_doctor_named(self):
        fired = [{"step": s, "reason": rule, "steps": [], "kind": "activation", "name": "relu1",
                  "trigger": {"kind": rule}, "value": 1.0, "threshold": 0.95}
                 for s, rule in ((3, "dead_relu"), (9, "vanishing_gradient"), (12, "dead_relu"))]
        others = [{"step": 20, "reason": "stall", "steps": [], "last_step": 20, "stalled_seconds": 2.0},
                  {"step": 21, "reason": "nan", "steps": []}, {"step": 22, "reason": ["dead_relu"], "steps": []}]
        # A name no terminal should see raw, and a space: the hint's path is escaped and quoted.
        path = self.run_dir([(0, "tensor", "loss", stat([1.0]))], name="run \x1b[31m red", dumps=fired + others)
        # Evaluating the rules is the doctor's: inspect must not, however long they would take.
        with unittest.mock.patch.object(DC, "evaluate", side_effect=AssertionError("inspect evaluated the rules")):
            status, lines = self.inspect(path)
        self.assertEqual(status, 0)
        self.assertIn("  health rules fired live: 3 (dead_relu 2, vanishing_gradient 1)", lines)
        self.assertEqual(lines[-1], "  run tensortap doctor 'run_dir_prefix/run \\x1b[31m red' for the training health "
                         "rules".replace("run_dir_prefix", self.tmp))
        self.assertNotIn("\x1b", "\n".join(lines))

    def test_none_fired(self):
        plain = self.run_dir([(0, "tensor", "loss", stat([1.0]))], name="plain")
        _, lines = self.inspect(plain)
        self.assertEqual(lines[-2:], ["  health rules fired live: 0 (none was on)",
                                      f"  run tensortap doctor {plain} for the training health rules"])
        watched = self.run_dir([(0, "tensor", "loss", stat([1.0]))], name="watched",
                               options={"dump_on": [{"kind": "spike", "name": "loss"}, {"kind": "vanishing_gradient"},
                                                    {"kind": "dead_relu", "threshold": 0.9}]})
        _, lines = self.inspect(watched)
        self.assertIn("  health rules fired live: 0 (on: vanishing_gradient, dead_relu)", lines)


class RecordsTest(unittest.TestCase):
    """Statistics computed from records are the recorder's (the e2e runs have
    both: records every 2nd step, statistics every step)."""

    def test_the_recorders_statistics(self):
        root = os.environ.get("TT_E2E_DIR")
        if not root:
            self.skipTest("TT_E2E_DIR not set (ctest doctor.rules sets it)")
        compared = 0
        for name in ("train", "dtypes", "train_packed"):
            run = tensortap.open(os.path.join(root, name))
            table, series = run.stats_table()
            by_key = {}
            for row in table:
                by_key[(series[int(row["series"])], int(row["step"]))] = row
            for rec in run.records:
                want = by_key[((rec["kind"], rec["name"]), rec["step"])]
                got = statistics(run.load(rec["name"], rec["step"], kind=rec["kind"]))[0]
                for f in tensortap.STATS_FIELDS:
                    np.testing.assert_allclose(got[f], want[f], rtol=1e-12, atol=1e-300,
                                               err_msg=f"{name}: {rec['kind']} {rec['name']} {rec['step']} {f}")
                compared += 1
        self.assertGreater(compared, 100)

    def test_extremes_neither_overflow_nor_vanish(self):
        for v in (1e300, 1e-310):
            got = statistics(np.full(5, v))[0]
            self.assertAlmostEqual(got["norm"] / (v * math.sqrt(5)), 1.0)
            self.assertEqual(got["std"], 0.0)


if __name__ == "__main__":
    unittest.main()
