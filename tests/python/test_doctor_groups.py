"""The doctor's output a user reads (issue 75): findings grouped (one rule and
kind on tensors whose episodes overlap), causes before consequences with the
likely cause first, --all's line per finding, the `group` column; and the
rules that need no naming convention: run.json's "taps" and a ReLU inferred
from its statistics (tensortap/_doctor/groups.py, taps.py; ctest
doctor.groups).

    PYTHONPATH=python python3 tests/python/test_doctor_groups.py
"""

import json
import os
import unittest

import tensortap
from test_doctor import Runs, stat, with_rms


class GroupsTest(Runs):
    def with_taps(self, path, taps):
        with open(os.path.join(path, "run.json")) as f:
            info = json.load(f)
        info["taps"] = taps
        with open(os.path.join(path, "run.json"), "w") as f:
            json.dump(info, f)
        return path

    def test_one_line_per_group_and_every_line_under_all(self):
        rows = []
        for s in range(12):
            for i in (4, 3, 2, 1):  # a backward's order: the last layer's gradient first
                # fc1..fc3 vanish together from step 0, fc4 alone from step 8.
                tiny = i < 4 and s < 6 or i == 4 and s >= 8
                rows.append((s, "grad", f"fc{i}.weight", with_rms(1e-9 if tiny else 0.1)))
        path = self.run_dir(rows)
        status, lines, _ = self.command(path, "--rules", "vanishing_gradient")
        self.assertEqual(status, 1)
        self.assertEqual(lines, [
            "likely cause: vanishing_gradient: grad fc1.weight steps 0..5: RMS 1e-9 below 1e-7",
            "vanishing_gradient: 3 grads (fc1.weight ... fc3.weight) steps 0..5: RMS 1e-9 below 1e-7",
            "vanishing_gradient: grad fc4.weight steps 8..11: RMS 1e-9 below 1e-7",
            "2 findings"])
        status, every, _ = self.command(path, "--rules", "vanishing_gradient", "--all")
        self.assertEqual(every, [f"vanishing_gradient: grad fc{i}.weight steps {a}..{b}: RMS 1e-9 below 1e-7"
                                 for i, a, b in ((1, 0, 5), (2, 0, 5), (3, 0, 5), (4, 8, 11))] + ["4 findings"])
        frame = tensortap.doctor(path, rules=["vanishing_gradient"])
        self.assertEqual(list(frame.group), [0, 0, 0, 1])
        _, js, _ = self.command(path, "--rules", "vanishing_gradient", "--json")
        self.assertEqual([json.loads(x)["group"] for x in js], [0, 0, 0, 1])

    def test_a_tensor_with_two_episodes_is_one_group(self):
        rows = []
        for s in range(12):
            rows.append((s, "activation", "relu1", stat([0.0] * 100 if s < 4 or s >= 8 else [1.0] * 100)))
        status, lines, _ = self.command(self.run_dir(rows), "--rules", "dead_relu")
        self.assertEqual(lines[1:], ["dead_relu: activation relu1 steps 0..11: 100% of values zero, above 95% "
                                     "(2 episodes)", "1 finding"])

    def test_causes_before_consequences(self):
        rows = []
        for s in range(8):
            # The gradient vanishes from step 0; the layer before it is dead from step 2: the dead unit first.
            rows.append((s, "activation", "relu1", stat([0.0] * 100 if s >= 2 else [1.0, 0.0] * 50)))
            rows.append((s, "grad", "fc1.weight", with_rms(1e-9)))
        path = self.run_dir(rows)
        _, lines, _ = self.command(path, "--rules", "vanishing_gradient,dead_relu,all_zero")
        self.assertEqual(lines, [
            "likely cause: dead_relu: activation relu1 steps 2..7: 100% of values zero, above 95%",
            "dead_relu: activation relu1 steps 2..7: 100% of values zero, above 95%",
            "vanishing_gradient: grad fc1.weight steps 0..7: RMS 1e-9 below 1e-7",
            "all_zero: activation relu1 steps 2..7: all 100 values zero",
            "3 findings"])
        frame = tensortap.doctor(path, rules=["vanishing_gradient", "dead_relu", "all_zero"])
        self.assertEqual(list(frame.rule), ["dead_relu", "vanishing_gradient", "all_zero"])

    def test_statistics_stopped_stays_above(self):
        rows = [(s, "activation", "relu1", stat([0.0] * 100)) for s in range(4)]
        path = self.run_dir(rows, options={})
        with open(os.path.join(path, "run.json")) as f:
            info = json.load(f)
        info["monitoring"] = {"statistics_stopped_at": 3, "reason": "budget", "resumed_at": None}
        with open(os.path.join(path, "run.json"), "w") as f:
            json.dump(info, f)
        _, lines, _ = self.command(path, "--rules", "dead_relu")
        self.assertTrue(lines[0].startswith("statistics stopped at step 3"), lines)
        self.assertTrue(lines[1].startswith("likely cause: dead_relu"), lines)

    def test_declared_taps_are_judged_by_their_function(self):
        rows = []
        for s in range(4):
            rows.append((s, "activation", "hidden1", stat([0.0] * 100)))          # a dead ReLU, by declaration
            rows.append((s, "activation", "relu_like", stat([0.0] * 100)))        # named so, declared a tanh
            rows.append((s, "activation", "gate", stat([0.999] * 100)))           # a saturated sigmoid
        path = self.with_taps(self.run_dir(rows), {"hidden1": "relu", "relu_like": "tanh", "gate": "sigmoid"})
        frame = tensortap.doctor(path, rules=["dead_relu", "saturated_activation"])
        self.assertEqual(sorted(zip(frame.rule, frame.name)), [("dead_relu", "hidden1"),
                                                               ("saturated_activation", "gate")])
        self.assertNotIn("inferred", " ".join(frame.message))
        # Without the declaration, "gate" (its name holds neither tanh nor sigmoid) is not judged.
        plain = self.run_dir(rows, name="plain")
        frame = tensortap.doctor(plain, rules=["saturated_activation"])
        self.assertIn("saturated_activation", frame.attrs["not_evaluated"])

    def test_a_declared_sigmoid_from_records(self):
        records = [(s, "activation", "g", [0.999] * 50 + [0.5] * 10) for s in range(4)]
        path = self.with_taps(self.run_dir(None, records=records), {"g": "sigmoid"})
        frame = tensortap.doctor(path, rules=["saturated_activation"])
        self.assertEqual(list(frame.name), ["g"])
        self.assertAlmostEqual(frame.value[0], 50 / 60)

    def test_a_relu_inferred_from_its_statistics(self):
        rows = []
        for s in range(4):
            rows.append((s, "activation", "hidden2", stat([0.0] * 99 + [2.0])))     # no negative value, zeros
            rows.append((s, "activation", "linear", stat([0.0] * 99 + [-2.0])))     # a negative value: no ReLU
            rows.append((s, "activation", "zeros", stat([0.0] * 100)))              # never positive: no evidence
        path = self.run_dir(rows)
        status, lines, _ = self.command(path, "--rules", "dead_relu", "--all")
        self.assertEqual(lines, ["dead_relu: activation hidden2 steps 0..3: 99% of values zero, above 95% "
                                 "(ReLU inferred: min 0, 99% zeros)", "1 finding"])
        # Declared as another function: never inferred.
        self.with_taps(path, {"hidden2": "gelu"})
        frame = tensortap.doctor(path, rules=["dead_relu"])
        self.assertEqual(len(frame), 0)

    def test_poor_initialization_on_the_declared_outputs(self):
        rows = [(s, "activation", f"act{i}", stat([0.0, sd])) for s in (0, 1) for i, sd in enumerate((1.0, 0.01, 2))]
        path = self.with_taps(self.run_dir(rows), {"act0": "relu", "act1": "relu", "act2": "relu"})
        frame = tensortap.doctor(path, rules=["poor_weight_initialization"])
        self.assertEqual(len(frame), 1)
        self.assertIn("(the nonlinearities' outputs: declared, or ReLUs inferred)", frame.message[0])


if __name__ == "__main__":
    unittest.main()
