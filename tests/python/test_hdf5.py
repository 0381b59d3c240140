"""HDF5 runs, read by h5py: while the writer appends (SWMR), after the writer
is killed with SIGKILL, and with the compression and chunking options.

    TT_HDF5_PROC=build/tests/hdf5_proc PYTHONPATH=python python3 tests/python/test_hdf5.py
"""

import os
import shutil
import signal
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

import tensortap

PROC = os.environ.get("TT_HDF5_PROC", "build/tests/hdf5_proc")


class Hdf5Test(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-h5-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, steps, sleep_ms):
        run = os.path.join(self.tmp, "run")
        p = subprocess.Popen([PROC, "append", run, str(steps), str(sleep_ms)], stdout=subprocess.PIPE, text=True)
        return run, p

    def test_an_open_reader_does_not_stop_new_names(self):
        # h5py keeps a shared lock on a file it has open; the writer once
        # asked for an exclusive one to create a new name's datasets, failed,
        # and stopped writing the run.
        run = os.path.join(self.tmp, "run")
        p = subprocess.Popen([PROC, "append", run, "20", "20", "new_names"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.assertEqual(p.stdout.readline().strip(), "flushed 0")
        with h5py.File(os.path.join(run, "tensors.h5"), "r", swmr=True) as f:
            self.assertEqual(f["tensor/x/data"].shape[0], 1)
            # Held open while the writer makes 19 more names. (What the
            # reader's cached metadata says after them is HDF5 1.10's
            # business: reopen to see new names, as the README says.)
            out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertNotIn("tensortap: error", err)
        r = tensortap.open(run)
        self.assertEqual(r.names("tensor"), sorted(["x"] + [f"new{s}" for s in range(20)]))
        self.assertEqual(r.info["errors"], 0)
        np.testing.assert_array_equal(r.load("new19", 19, kind="tensor"), np.full(2, 19, np.float32))
        r.close()

    def test_reader_sees_rows_while_the_writer_appends(self):
        run, p = self.start(steps=30, sleep_ms=20)
        try:
            self.assertEqual(p.stdout.readline().strip(), "flushed 0")
            seen = set()
            with h5py.File(os.path.join(run, "tensors.h5"), "r", swmr=True) as f:
                data, steps = f["/tensor/x/data"], f["/tensor/x/steps"]
                for line in p.stdout:
                    flushed = int(line.split()[1])
                    data.refresh()
                    steps.refresh()
                    # Every step flushed so far is there, complete.
                    self.assertGreaterEqual(data.shape[0], flushed + 1)
                    for row in range(flushed + 1):
                        self.assertEqual(steps[row], row)
                        np.testing.assert_array_equal(data[row], np.full((4, 3), row, np.float32))
                    seen.add(flushed)
            self.assertEqual(p.wait(timeout=60), 0)
            self.assertGreater(len(seen), 10)  # it really was read while growing
        finally:
            p.kill()
            p.wait()

    def test_after_sigkill_every_flushed_step_is_readable(self):
        run, p = self.start(steps=100000, sleep_ms=5)
        last = -1
        for line in p.stdout:
            last = int(line.split()[1])
            if last >= 20:
                break
        p.send_signal(signal.SIGKILL)
        p.wait()
        path = os.path.join(run, "tensors.h5")
        # The file is still marked as open by a SWMR writer: a SWMR reader
        # opens it as it is (a plain open needs `h5clear -s` first).
        with h5py.File(path, "r", swmr=True) as f:
            data, steps = f["/tensor/x/data"], f["/tensor/x/steps"]
            self.assertGreaterEqual(data.shape[0], last + 1)
            for row in range(last + 1):
                self.assertEqual(steps[row], row)
                np.testing.assert_array_equal(data[row], np.full((4, 3), row, np.float32))
        # The index agrees: every line points at a complete row.
        r = tensortap.open(run)
        self.assertFalse(r.closed)
        self.assertGreaterEqual(len(r.records), last + 1)
        for rec in r.records:
            np.testing.assert_array_equal(r.load("x", rec["step"], kind="tensor"),
                                          np.full((4, 3), rec["step"], np.float32))
        r.close()

    def test_compression_and_chunking(self):
        subprocess.run([PROC, "options", self.tmp], check=True)
        gz, plain = os.path.join(self.tmp, "gzip"), os.path.join(self.tmp, "plain")
        with h5py.File(os.path.join(gz, "tensors.h5"), "r") as f, \
                h5py.File(os.path.join(plain, "tensors.h5"), "r") as g:
            for name in ("scalar", "row", "wide"):
                a, b = f[f"/tensor/{name}/data"], g[f"/tensor/{name}/data"]
                self.assertEqual(a.compression, "gzip")
                self.assertEqual(a.compression_opts, 4)
                self.assertTrue(a.shuffle)
                self.assertIsNone(b.compression)
                np.testing.assert_array_equal(a[:], b[:])
                # About 1 MiB a chunk at most; several small rows share one.
                chunk_bytes = np.prod(a.chunks) * a.dtype.itemsize
                self.assertLessEqual(chunk_bytes, 1 << 20, (name, a.chunks))
                self.assertEqual(a.shape[0], 20)
            self.assertEqual(f["/tensor/scalar/data"].chunks, (256,))
            # Sized from the rows: 4 KB rows share chunks of about 64 KiB.
            self.assertEqual(f["/tensor/row/data"].chunks, (16, 1000))
            self.assertEqual(f["/tensor/wide/data"].chunks[0], 1)
            np.testing.assert_array_equal(f["/tensor/scalar/data"][:], np.arange(20.0))
            np.testing.assert_array_equal(f["/tensor/scalar/steps"][:], np.arange(20))
        self.assertLess(os.path.getsize(os.path.join(gz, "tensors.h5")),
                        os.path.getsize(os.path.join(plain, "tensors.h5")) / 10)


if __name__ == "__main__":
    unittest.main(verbosity=2)
