"""The Python twin (tensortap.torch) against the C++ recorder's behaviour
(issue 55): record_grads, sampling (steps, start, stop, capture_eval), real
models (output types, layers unfrozen later, rename collisions,
TorchScript), the default kinds, run.json's unset stop, and perturb (whose
bits C++'s tensortap::perturb must reproduce: perturb_vectors.json).

    TT_TWIN_PYTHON=a-python-with-torch PYTHONPATH=python python3 tests/python/test_twin.py
    PYTHONPATH=python python-with-torch tests/python/test_twin.py --write-vectors

Run by a Python without torch, it runs itself again with TT_TWIN_PYTHON;
with neither, every test is skipped, saying so.
"""

import json
import os
import shutil
import sys
import tempfile
import unittest
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VECTORS = os.path.join(HERE, "perturb_vectors.json")
TWIN_PYTHON = os.environ.get("TT_TWIN_PYTHON", "")

try:
    import torch
except ImportError:
    torch = None

if __name__ == "__main__" and torch is None and TWIN_PYTHON and not os.environ.get("TT_TWIN_AGAIN"):
    # This interpreter has no torch: the one that has takes over (once).
    os.execve(TWIN_PYTHON, [TWIN_PYTHON, os.path.abspath(__file__), *sys.argv[1:]],
              dict(os.environ, TT_TWIN_AGAIN="1"))

import tensortap  # noqa: E402

NO_TORCH = "no torch importable here, and TT_TWIN_PYTHON names no Python that has it: the twin is not tested"

if torch is not None:
    import tensortap.torch as ttt


class TwinCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-twin-")
        torch.manual_seed(0)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_dir(self, name="run"):
        return os.path.join(self.tmp, name)

    def load(self, run, kind, name, step):
        with tensortap.open(run) as r:
            return np.asarray(r.load(name, step, kind=kind))


@unittest.skipIf(torch is None, NO_TORCH)
class RecordGrads(TwinCase):
    def test_the_clipped_gradient_once_and_nothing_after(self):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(5, 4)
        run = self.run_dir()
        seen = {}
        with ttt.watch(model, run, kinds=("grad",)) as rec:
            rec.step(0)
            model(x).pow(2).sum().backward()
            raw = {n: p.grad.clone() for n, p in model.named_parameters()}
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            seen = {n: p.grad.clone() for n, p in model.named_parameters()}
            rec.record_grads(opt)
            model(x).sum().backward()  # after record_grads: not added
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.step(1)
            rec.record_grads(opt)  # no .grad yet: left to the end-of-step record
            model(x).sum().backward()
            model(x).sum().backward()
            step1 = {n: p.grad.clone() for n, p in model.named_parameters()}
        with tensortap.open(run) as r:
            self.assertEqual(sorted(r.names("grad")), sorted(seen))  # no name#1: one record each
            for n in seen:
                self.assertEqual(r.steps(n, kind="grad"), [0, 1])
        for n in seen:
            got = self.load(run, "grad", n, 0)
            np.testing.assert_array_equal(got, seen[n].numpy())
            self.assertFalse(np.array_equal(got, raw[n].numpy()), n)  # clipped, not the raw sum
            np.testing.assert_allclose(self.load(run, "grad", n, 1), step1[n].numpy(), rtol=1e-6)

    def test_an_optimizer_of_nothing_watched_warns_once(self):
        model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(other.parameters(), lr=0.1)
        with ttt.watch(model, self.run_dir(), kinds=("grad",)) as rec:
            with self.assertRaisesRegex(ValueError, r"record_grads\(\) before the first step\(\)"):
                rec.record_grads(opt)
            rec.step(0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rec.record_grads(opt)
                rec.record_grads(opt)
            said = [str(w.message) for w in caught]
            self.assertEqual(len(said), 1, said)
            self.assertIn("none of the optimizer's 2 parameters is one this recorder watches", said[0])
            with self.assertRaisesRegex(TypeError, "torch.optim.Optimizer"):
                rec.record_grads(model)


@unittest.skipIf(torch is None, NO_TORCH)
class Sampling(TwinCase):
    def steps_recorded(self, **options):
        model = torch.nn.Linear(2, 2)
        run = self.run_dir(str(len(os.listdir(self.tmp))))
        with ttt.watch(model, run, kinds=("tensor",), **options) as rec:
            for step in range(12):
                rec.step(step)
                rec.capture("loss", model(torch.ones(1, 2)).sum())
        with tensortap.open(run) as r:
            return r.steps("loss", kind="tensor"), r.info["options"]

    def test_every_from_start_until_stop_and_listed_steps(self):
        # As C++'s Sampling::full_bits: [start, stop), every n-th from start;
        # listed steps replace `every`, still within [start, stop).
        self.assertEqual(self.steps_recorded(every=3, start=2, stop=9)[0], [2, 5, 8])
        self.assertEqual(self.steps_recorded(every=5, start=4)[0], [4, 9])
        steps, options = self.steps_recorded(every=4, steps=[0, 3, 5, 7, 20], start=3, stop=7)
        self.assertEqual(steps, [3, 5])
        self.assertEqual((options["steps"], options["start"], options["stop"]), ([0, 3, 5, 7, 20], 3, 7))
        for bad in (dict(stop=-1), dict(start=-2), dict(steps=[1, -1]), dict(steps=[True]), dict(steps="12")):
            run = self.run_dir("bad")
            with self.assertRaises((ValueError, TypeError), msg=bad):
                ttt.watch(torch.nn.Linear(2, 2), run, **bad)
            self.assertFalse(os.path.exists(run), bad)

    def test_eval_passes_are_eval_slash_name(self):
        model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Dropout(0.0))
        run = self.run_dir()
        with ttt.watch(model, run, kinds=("activation",), capture_eval=True) as rec:
            rec.step(0)
            model.eval()
            model(torch.ones(1, 2))
            model.train()
            model(torch.ones(1, 2))
            model.eval()
            with torch.no_grad():
                model(torch.ones(1, 2))
        with tensortap.open(run) as r:
            self.assertEqual(r.names("activation"), ["0", "1", "eval/0", "eval/0#1", "eval/1", "eval/1#1"])
            self.assertTrue(r.info["options"]["capture_eval"])


@unittest.skipIf(torch is None, NO_TORCH)
class RealModels(TwinCase):
    def test_a_structseq_output_keeps_its_type(self):
        class Max(torch.nn.Module):
            def forward(self, x):
                return x.max(dim=1)

        class TopK(torch.nn.Module):
            def forward(self, x):
                return torch.topk(x, 2)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.max, self.top = torch.nn.Linear(4, 4), Max(), TopK()

            def forward(self, x):
                h = self.fc(x)
                return self.max(h).values.sum() + self.top(h).values.sum()

        model = Net()
        run = self.run_dir()
        with ttt.watch(model, run) as rec:
            rec.step(0)
            model(torch.randn(3, 4)).backward()  # .values: an AttributeError on a plain tuple
        with tensortap.open(run) as r:
            self.assertEqual(r.names("activation"), ["fc", "max.0", "max.1", "top.0", "top.1"])
            self.assertEqual(r.names("activation_grad"), ["fc", "max.0", "top.0"])  # indices have none

    def test_a_layer_unfrozen_later_is_recorded(self):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        for p in model.parameters():
            p.requires_grad_(False)
        run = self.run_dir()
        x = torch.ones(3, 2)
        with ttt.watch(model, run, kinds=("grad",)) as rec:
            rec.step(0)
            model[1].weight.requires_grad_(True)  # during step 0: from step 0
            model(x).sum().backward()
            rec.step(1)
            model[0].bias.requires_grad_(True)  # between steps 1 and 2: from step 2
            rec.step(2)
            model(x).sum().backward()
        with tensortap.open(run) as r:
            self.assertEqual(r.names("grad"), ["0.bias", "1.weight"])
            self.assertEqual(r.steps("1.weight", kind="grad"), [0, 2])
            self.assertEqual(r.steps("0.bias", kind="grad"), [2])

    def test_rename_onto_an_existing_name_is_refused(self):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        run = self.run_dir()
        with self.assertRaises(ValueError) as e:
            ttt.watch(model, run, rename={"0": "1"})
        self.assertIn("module paths '0' and '1' would both be recorded as '1'", str(e.exception))
        # Parameters too, where the modules' own outputs are not recorded.
        twins = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        with self.assertRaisesRegex(ValueError, r"parameters '0.weight' and '1.weight' would both be recorded as "
                                                r"'0.weight'"):
            ttt.watch(twins, run, rename={"1": "0"}, modules=[])
        self.assertFalse(os.path.exists(run))
        ttt.watch(model, run, rename={"0": "lin"}).close()  # a name of its own is fine

    def script(self, module):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.11's word on torch.jit
            return torch.jit.script(module)

    def test_a_torchscript_module(self):
        model = self.script(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)))
        run = self.run_dir()
        with self.assertRaisesRegex(TypeError, r"the model \(RecursiveScriptModule\) is a TorchScript module"):
            ttt.watch(model, run, kinds=("activation", "activation_grad"))
        self.assertFalse(os.path.exists(run))  # nothing left behind
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rec = ttt.watch(model, run)
        said = [str(w.message) for w in caught]
        self.assertEqual(len(said), 1, said)
        self.assertIn("the model (RecursiveScriptModule) is a TorchScript module, which takes no forward hooks",
                      said[0])
        with rec:
            rec.step(0)
            loss = model(torch.randn(4, 3)).pow(2).sum()
            rec.capture("loss", loss)
            loss.backward()
        with tensortap.open(run) as r:
            self.assertEqual(r.kinds(), ["buffer", "grad", "tensor"])
            self.assertEqual(r.names("grad"), ["0.bias", "0.weight", "1.bias", "1.weight"])

    def test_a_torchscript_submodule(self):
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), self.script(torch.nn.Sequential(torch.nn.Linear(3, 2))))
        run = self.run_dir()
        with self.assertWarnsRegex(UserWarning, r"module '1' \(RecursiveScriptModule\) is a TorchScript module"):
            rec = ttt.watch(model, run, kinds=("activation", "grad"))
        with rec:
            rec.step(0)
            model(torch.randn(2, 3)).sum().backward()
        with tensortap.open(run) as r:
            self.assertEqual(r.names("activation"), ["0"])
            self.assertEqual(r.names("grad"), ["0.bias", "0.weight", "1.0.bias", "1.0.weight"])

    def test_the_default_kinds_take_buffers(self):
        # A BatchNorm momentum bug shows in running_mean first.
        self.assertEqual(ttt.DEFAULT_KINDS, ("activation", "activation_grad", "buffer", "grad", "tensor"))
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        run = self.run_dir()
        with ttt.watch(model, run) as rec:
            rec.step(0)
            model(torch.randn(4, 2)).sum().backward()
        with tensortap.open(run) as r:
            self.assertEqual(r.names("buffer"), ["1.num_batches_tracked", "1.running_mean", "1.running_var"])
            self.assertEqual(r.names("param"), [])


@unittest.skipIf(torch is None, NO_TORCH)
class Taps(TwinCase):
    def test_the_modules_nonlinearities_and_the_doctor_reads_them(self):
        # Names with no "relu" in them (a Sequential's indices): run.json's
        # "taps" tells the doctor which module is a ReLU (issue 75 (3)).
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Tanh())
        with torch.no_grad():
            model[0].bias.fill_(-50.0)  # every unit of the ReLU below zero: dead
        run = self.run_dir()
        with ttt.watch(model, run, kinds=["activation"]) as rec:
            for s in range(4):
                rec.step(s)
                model(torch.randn(16, 4))
        with open(os.path.join(run, "run.json")) as f:
            self.assertEqual(json.load(f)["taps"], {"1": "relu", "3": "tanh"})
        frame = tensortap.doctor(run, rules=["dead_relu"])
        self.assertEqual(list(frame.name), ["1"])
        self.assertNotIn("inferred", frame.message[0])


@unittest.skipIf(torch is None, NO_TORCH)
class UnsetStop(TwinCase):
    def test_null_written_and_both_read(self):
        run = self.run_dir()
        ttt.watch(torch.nn.Linear(2, 2), run).close()
        with open(os.path.join(run, "run.json")) as f:
            info = json.load(f)
        self.assertIsNone(info["options"]["stop"])
        for stop in (None, -1, 7):
            info["options"]["stop"] = stop
            with open(os.path.join(run, "run.json"), "w") as f:
                json.dump(info, f)
            with tensortap.open(run) as r:
                self.assertEqual(r.info["options"]["stop"], stop)
                self.assertTrue(r.closed)


# -- perturb -------------------------------------------------------------------

def bits_of(t):
    """A tensor's elements as unsigned bit patterns, row-major."""
    kind = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    signed = t.detach().reshape(-1).contiguous().view(kind) if t.is_floating_point() else t.reshape(-1)
    return [int(v) & ((1 << (8 * t.element_size())) - 1) for v in signed.tolist()]


def from_bits(bits, dtype, shape):
    kind = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}.get(dtype)
    width = torch.tensor([], dtype=dtype).element_size() * 8
    signed = [b - (1 << width) if b >= 1 << (width - 1) else b for b in bits]
    if kind is None:
        return torch.tensor(signed, dtype=dtype).reshape(shape)
    return torch.tensor(signed, dtype=kind).view(dtype).reshape(shape)


def vector_model():
    """The fixed model of perturb_vectors.json: names with dots, every float
    dtype, zeros of both signs, the extremes, infinities, NaN, a 2-D shape
    (k row-major), an integer parameter left alone."""
    f32max, f64max = 3.4028234663852886e38, 1.7976931348623157e308
    inf, nan = float("inf"), float("nan")
    values = {
        "enc.weight": (torch.float32, [2, 3], [1.0, -0.0, 0.0, f32max, -f32max, 2.0 ** -149]),
        "enc.bias": (torch.float32, [4], [inf, -inf, nan, -(2.0 ** -149)]),
        "enc.grid": (torch.float32, [3, 4], [(i - 5.5) / 3 for i in range(12)]),
        "dec.weight": (torch.float64, [3, 2], [1.0, -1.0, 0.0, -0.0, f64max, 5e-324]),
        "dec.bias": (torch.float64, [3], [nan, -inf, -f64max]),
        "scale": (torch.float16, [2, 4], [65504.0, -65504.0, 0.0, -0.0, 2.0 ** -24, 1.0, inf, nan]),
        "gate": (torch.bfloat16, [2, 3], [1.0, -0.0, 0.0, 3.3895313892515355e38, -(2.0 ** -133), nan]),
        "count": (torch.int64, [3], [0, -1, 7]),
    }
    model = torch.nn.Module()
    model.enc, model.dec = torch.nn.Module(), torch.nn.Module()
    for name, (dtype, shape, vals) in values.items():
        owner, _, leaf = name.rpartition(".")
        t = torch.tensor(vals, dtype=torch.float64).to(dtype).reshape(shape)
        (getattr(model, owner) if owner else model).register_parameter(
            leaf, torch.nn.Parameter(t, requires_grad=dtype.is_floating_point))
    return model


def perturbed_vectors():
    entries = []
    for seed in (0, 1):
        for ulps in (1, 3):
            model = vector_model()
            before = {n: bits_of(p) for n, p in model.named_parameters()}
            ttt.perturb(model, ulps=ulps, seed=seed)
            for n, p in model.named_parameters():
                entries.append({"name": n, "dtype": str(p.dtype).replace("torch.", ""), "shape": list(p.shape),
                                "seed": seed, "ulps": ulps, "values_before": before[n], "values_after": bits_of(p)})
    return entries


M64 = (1 << 64) - 1


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for c in data:
        h = ((h ^ c) * 0x100000001b3) & M64
    return h


def splitmix64_finaliser(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def splitmix_up(name, seed, k):
    """The direction of element k, by the specification, in Python integers."""
    state = fnv1a64(name.encode("utf-8")) ^ (seed * 0x9E3779B97F4A7C15 & M64)
    return splitmix64_finaliser((state + (k + 1) * 0x9E3779B97F4A7C15) & M64) >> 63 == 1


def reference_step(x, up, ulps):
    """One element moved by torch.nextafter, step by step: the specification
    written independently of perturb's bit arithmetic."""
    if not torch.isfinite(x):
        return x
    for _ in range(ulps):
        toward = torch.tensor(float("inf") if up else float("-inf"), dtype=x.dtype)
        if x == 0:  # both zeros leave to the smallest subnormal of the direction's sign
            y = torch.nextafter(torch.tensor(0.0, dtype=x.dtype), toward)
        else:
            y = torch.nextafter(x, toward)
        if torch.isinf(y):  # the largest finite value stays
            break
        x = y
    return x


@unittest.skipIf(torch is None, NO_TORCH)
class Perturb(TwinCase):
    def test_hand_checked_values(self):
        from tensortap.torch import _moved_bits

        def moved(value, dtype, up, ulps=1):
            t = torch.tensor([value], dtype=dtype)
            kind, width, inf_bits = ttt._float_formats(torch)[dtype]
            out = _moved_bits(t.view(kind).numpy(), width, inf_bits, np.array([up]), ulps)
            return torch.from_numpy(out).view(dtype).item()

        self.assertEqual(moved(1.0, torch.float32, True), 1.0000001192092896)
        self.assertEqual(moved(1.0, torch.float32, False), 0.9999999403953552)
        self.assertEqual(repr(moved(-0.0, torch.float32, False)), repr(-(2.0 ** -149)))
        self.assertEqual(moved(-0.0, torch.float32, True), 2.0 ** -149)
        self.assertEqual(moved(0.0, torch.float64, False), -5e-324)
        self.assertEqual(moved(65504.0, torch.float16, True), 65504.0)  # the largest finite stays
        self.assertEqual(moved(-65504.0, torch.float16, False), -65504.0)
        self.assertEqual(moved(65504.0, torch.float16, False, 3), 65408.0)  # ulp 32
        self.assertEqual(repr(moved(-(2.0 ** -149), torch.float32, True)), "-0.0")  # toward zero: its own side's
        self.assertEqual(moved(2.0 ** -149, torch.float32, False, 3), -(2.0 ** -148))  # and across
        self.assertEqual(moved(1.0, torch.bfloat16, True), 1.0078125)
        self.assertTrue(np.isnan(moved(float("nan"), torch.float32, True)))
        self.assertEqual(moved(float("-inf"), torch.float64, True), float("-inf"))

    def test_the_hash_and_the_generator(self):
        # Published values: FNV-1a 64 of "" and "a"; splitmix64's first
        # output from seed 0 (its finaliser of the golden gamma).
        self.assertEqual(fnv1a64(b""), 0xcbf29ce484222325)
        self.assertEqual(fnv1a64(b"a"), 0xaf63dc4c8601ec8c)
        self.assertEqual(splitmix64_finaliser(0x9E3779B97F4A7C15), 0xe220a8397b1dcdaf)
        self.assertEqual(ttt._fnv1a64(b"a"), 0xaf63dc4c8601ec8c)
        name = "enc.weight"
        got = ttt._directions(name, 3, 0, 300).tolist()
        self.assertEqual(got, [splitmix_up(name, 3, k) for k in range(300)])
        self.assertEqual(ttt._directions(name, 3, 100, 5).tolist(), got[100:105])  # a later chunk
        self.assertTrue(20 < sum(got[:100]) < 80)

    def test_the_vectors_c_plus_plus_checks(self):
        # The file is what perturb computes, and what the specification says
        # element by element (torch.nextafter, Python integers).
        with open(VECTORS) as f:
            expected = json.load(f)
        self.assertEqual(perturbed_vectors(), expected)
        dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                  "float64": torch.float64, "int64": torch.int64}
        for e in expected:
            dtype = dtypes[e["dtype"]]
            before = from_bits(e["values_before"], dtype, e["shape"]).reshape(-1)
            if not dtype.is_floating_point:
                self.assertEqual(e["values_after"], e["values_before"], e["name"])
                continue
            want = [reference_step(before[k], splitmix_up(e["name"], e["seed"], k), e["ulps"])
                    for k in range(before.numel())]
            self.assertEqual(e["values_after"], bits_of(torch.stack(want)), (e["name"], e["seed"], e["ulps"]))
        self.assertEqual({e["dtype"] for e in expected}, set(dtypes))

    def test_order_strides_ties_and_refusals(self):
        # A non-contiguous parameter moves as its row-major copy does.
        base = torch.randn(3, 4)
        a, b = torch.nn.Module(), torch.nn.Module()
        a.register_parameter("w", torch.nn.Parameter(base.t().contiguous().t().clone()))  # column-major storage
        b.register_parameter("w", torch.nn.Parameter(base.clone()))
        self.assertFalse(a.w.is_contiguous())
        ttt.perturb(a, seed=5)
        ttt.perturb(b, seed=5)
        self.assertTrue(torch.equal(a.w, b.w))
        self.assertFalse(torch.equal(a.w, base))
        # A tied weight moves once, under its first name.
        tied = torch.nn.Module()
        tied.emb, tied.head = torch.nn.Embedding(4, 3), torch.nn.Linear(3, 4, bias=False)
        tied.head.weight = tied.emb.weight
        before = tied.emb.weight.detach().clone()
        self.assertIsNone(ttt.perturb(tied, ulps=1))
        moved = (tied.emb.weight.detach().view(torch.int32) - before.view(torch.int32)).abs()
        self.assertTrue(bool((moved <= 1).all()) and bool((moved == 1).any()))
        for bad in (dict(ulps=0), dict(ulps=1025), dict(ulps=True), dict(seed=-1), dict(seed=1 << 64),
                    dict(ulps=1.0)):
            with self.assertRaises(ValueError, msg=bad):
                ttt.perturb(tied, **bad)
        with self.assertRaisesRegex(TypeError, "torch.nn.Module"):
            ttt.perturb(object())


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-vectors"]:
        if torch is None:
            sys.exit(NO_TORCH)
        with open(VECTORS, "w") as f:  # one parameter a line
            f.write("[\n" + ",\n".join(json.dumps(e) for e in perturbed_vectors()) + "\n]\n")
        print(f"wrote {VECTORS}")
        sys.exit(0)
    unittest.main(verbosity=2)
