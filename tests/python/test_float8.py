"""The reader's float8 and unsigned-integer records (issue 17, item 15).

    PYTHONPATH=python /usr/bin/python3 tests/python/test_float8.py [RUNS]

Without RUNS: the decoding of every code of every float8 format, against
the definitions (OCP 8-bit floating point, PyTorch), and against PyTorch's
own conversion where the torch at hand has float8. With RUNS (TT_DTYPE_RUNS,
written by dtype_runs): the runs' records read back exactly, in each format.
"""

import json
import math
import os
import sys
import unittest

import numpy as np

import tensortap
from tensortap import _float8

RUNS = os.environ.get("TT_DTYPE_RUNS")

# Per format: (largest finite, smallest normal, smallest subnormal, NaN
# codes, infinity codes, has negative zero); from the OCP specification's
# tables and PyTorch's finfo.
SPEC = {
    "float8_e4m3fn": (448.0, 2.0 ** -6, 2.0 ** -9, {0x7F, 0xFF}, set(), True),
    "float8_e5m2": (57344.0, 2.0 ** -14, 2.0 ** -16, {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}, {0x7C, 0xFC}, True),
    "float8_e4m3fnuz": (240.0, 2.0 ** -7, 2.0 ** -10, {0x80}, set(), False),
    "float8_e5m2fnuz": (57344.0, 2.0 ** -15, 2.0 ** -17, {0x80}, set(), False),
}


class Float8Decoding(unittest.TestCase):
    def test_signed_formats_match_their_definitions_on_every_code(self):
        for name, (largest, normal, subnormal, nans, infs, neg_zero) in SPEC.items():
            with self.subTest(name):
                t = _float8.table(name)
                self.assertEqual(t.dtype, np.float32)
                self.assertEqual({c for c in range(256) if math.isnan(t[c])}, nans)
                self.assertEqual({c for c in range(256) if math.isinf(t[c])}, infs)
                self.assertEqual(t[0], 0.0)
                self.assertFalse(math.copysign(1.0, t[0]) < 0)
                self.assertEqual(math.copysign(1.0, t[0x80]) < 0 and t[0x80] == 0, neg_zero)
                finite = [c for c in range(256) if math.isfinite(t[c])]
                self.assertEqual(max(t[c] for c in finite), largest)
                self.assertEqual(min(t[c] for c in finite), -largest)
                self.assertEqual(t[0x01], subnormal)
                mant_bits = 3 if "e4m3" in name else 2
                self.assertEqual(t[1 << mant_bits], normal)  # exponent field 1, mantissa 0
                # Codes of one sign increase with their value; the sign bit negates.
                pos = [float(t[c]) for c in range(0x80) if math.isfinite(t[c])]
                self.assertEqual(pos, sorted(set(pos)))
                self.assertEqual(len(pos), len([c for c in range(0x80) if math.isfinite(t[c])]))
                for c in range(1, 0x80):
                    if math.isfinite(t[c]):
                        self.assertEqual(t[c | 0x80], -t[c])

    def test_e5m2_is_the_top_byte_of_a_float16(self):
        # An independent decoder: NumPy's IEEE binary16, which e5m2 truncates.
        half = (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float32)
        np.testing.assert_array_equal(_float8.table("float8_e5m2"), half)
        self.assertTrue(np.array_equal(np.signbit(_float8.table("float8_e5m2")), np.signbit(half)))

    def test_e4m3fn_agrees_with_float16_bit_surgery_on_normal_codes(self):
        # e4m3fn's normal numbers re-biased into binary16's fields (bias 7 to 15).
        t = _float8.table("float8_e4m3fn")
        for c in range(256):
            exp, man = (c >> 3) & 0xF, c & 7
            if exp == 0 or (exp == 15 and man == 7):
                continue
            bits = ((c & 0x80) << 8) | ((exp - 7 + 15) << 10) | (man << 7)
            self.assertEqual(t[c], np.array([bits], np.uint16).view(np.float16)[0], hex(c))

    def test_e8m0fnu_is_a_power_of_two_per_code(self):
        t = _float8.table("float8_e8m0fnu")
        self.assertTrue(math.isnan(t[0xFF]))
        for c in range(255):
            self.assertEqual(t[c], np.float32(math.ldexp(1.0, c - 127)), c)
        self.assertEqual(t[127], 1.0)
        self.assertEqual(t[0], 2.0 ** -127)  # a float32 subnormal, still exact

    def test_against_pytorch_where_it_has_float8(self):
        try:
            import torch
        except ImportError:
            torch = None
        names = [n for n in _float8.FORMATS if torch is not None and hasattr(torch, n)]
        if not names:
            self.skipTest("this torch has no float8 dtypes (PyTorch 2.1 or later has)")
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        for name in names:
            with self.subTest(name):
                want = codes.view(getattr(torch, name)).float().numpy()
                got = _float8.table(name)
                np.testing.assert_array_equal(got, want)
                self.assertTrue(np.array_equal(np.signbit(got), np.signbit(want)))

    def test_a_stored_array_that_is_not_uint8_is_refused(self):
        with self.assertRaisesRegex(tensortap.RunError, "float8_e4m3fn.*uint8.*float32"):
            _float8.widen(np.zeros(3, np.float32), "float8_e4m3fn", "index.jsonl:1")


@unittest.skipUnless(RUNS, "TT_DTYPE_RUNS: the runs dtype_runs writes")
class WrittenRuns(unittest.TestCase):
    def formats(self):
        return [f for f in ("npy", "packed", "hdf5") if os.path.isdir(os.path.join(RUNS, f))]

    def test_unsigned_integers_come_back_as_numpys_own(self):
        for fmt in self.formats():
            run = tensortap.open(os.path.join(RUNS, fmt))
            for name, dtype in (("u16", np.uint16), ("u32", np.uint32), ("u64", np.uint64)):
                with self.subTest(format=fmt, name=name):
                    top = 1 << (8 * np.dtype(dtype).itemsize - 1)
                    full = np.iinfo(dtype).max
                    want = np.array([[0, 1, top], [full, full - 1, 12345]], dtype=dtype)
                    got = run.load(name, 0, kind="tensor")
                    self.assertEqual(got.dtype, dtype)
                    np.testing.assert_array_equal(got, want)
                    self.assertEqual(run.series(name, kind="tensor").dtype, dtype)

    def test_float8_records_come_back_as_float32_exactly(self):
        for fmt in self.formats():
            run = tensortap.open(os.path.join(RUNS, fmt))
            for name in _float8.FORMATS:
                with self.subTest(format=fmt, name=name):
                    got = run.load(name, 0, kind="tensor")
                    self.assertEqual(got.dtype, np.float32)
                    want = _float8.table(name).reshape(16, 16)
                    np.testing.assert_array_equal(got, want)
                    self.assertTrue(np.array_equal(np.signbit(got), np.signbit(want)))
                    # tensortap's C++ decoding (its statistics') agrees bit for bit.
                    cpp = np.asarray(run.load(name + ".decoded", 0, kind="tensor"))
                    self.assertEqual(cpp.tobytes(), want.tobytes())
                    self.assertEqual(run.series(name, kind="tensor", lazy=False).dtype, np.float32)

    def test_the_index_keeps_the_real_dtype_and_the_file_the_bytes(self):
        for fmt in self.formats():
            with open(os.path.join(RUNS, fmt, "index.jsonl")) as f:
                dtypes = {r["name"]: r["dtype"] for r in map(json.loads, f)}
            for name in _float8.FORMATS:
                self.assertEqual(dtypes[name], name)
            self.assertEqual((dtypes["u16"], dtypes["u32"], dtypes["u64"]), ("uint16", "uint32", "uint64"))
        # .npy: the file itself is uint8 codes, what NumPy alone reads.
        if "npy" in self.formats():
            raw = np.load(os.path.join(RUNS, "npy", "npy", "tensor", "float8_e4m3fn", "00000000.npy"))
            self.assertEqual(raw.dtype, np.uint8)
            np.testing.assert_array_equal(raw.ravel(), np.arange(256))

    def test_inspect_check_passes(self):
        from tensortap._views.summary import check
        import io

        for fmt in self.formats():
            with self.subTest(format=fmt):
                out = io.StringIO()
                run = tensortap.open(os.path.join(RUNS, fmt))
                self.assertEqual(check(run, out=out), 0, out.getvalue())


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
