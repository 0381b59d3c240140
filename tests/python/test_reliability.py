"""Reliability: SIGKILL at random moments, a filesystem that fills up.

    TT_RELIABILITY_PROC=build/tests/reliability_proc PYTHONPATH=python python3 tests/python/test_reliability.py

Prints a summary line per test; tests/README.md has the figures.
"""

import concurrent.futures
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import warnings

import numpy as np

import tensortap
from tensortap._views import summary

PROC = os.environ.get("TT_RELIABILITY_PROC", "build/tests/reliability_proc")
TRIALS_NPY = int(os.environ.get("TT_CRASH_TRIALS", "20"))
TRIALS_H5 = int(os.environ.get("TT_CRASH_TRIALS_H5", "5"))
TRIALS_H5_NEW = int(os.environ.get("TT_CRASH_TRIALS_H5_NEW", "20"))
NUMPY = {"float32": np.float32, "int64": np.int64, "bfloat16": np.float32}


def expected(name, step, shape):
    if name == "small":
        return np.full(shape, step, np.float32)
    if name == "small#1":
        return np.full(shape, -step, np.float32)
    if name == "large":
        return np.full(shape, step, np.float32)
    if name == "bf16":
        return np.full(shape, step % 128, np.float32)
    if name == "ids":
        return np.arange(step, step + 100, dtype=np.int64)
    if name == f"new{step}" or name.startswith(f"new{step}."):
        return np.full(shape, step, np.float32)
    raise AssertionError(name)


def check_index(path):
    """Every line parses but perhaps a torn last one (no newline)."""
    with open(os.path.join(path, "index.jsonl"), "rb") as f:
        raw = f.read()
    lines = raw.split(b"\n")
    records = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            assert i == len(lines) - 1 and not raw.endswith(b"\n"), f"line {i + 1} is broken mid-file"
    return records


# warnings.catch_warnings changes the process's filters: the trials'
# threads take turns.
WARNINGS = threading.Lock()


class CrashTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-crash-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_trials(self, fmt, trials, new_names=False):
        # Trials run three at a time: most of a trial is waiting (for the
        # process to start, for the moment to kill it), so they overlap.
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            results = list(pool.map(lambda t: self.trial(fmt, t, new_names), range(trials)))
        verified = sum(r[0] for r in results)
        left_open = sum(r[1] for r in results)
        tag = fmt + (" with eight new names every step" if new_names else "")
        print(f"\ncrash/{tag}: {trials} SIGKILLs, {verified} indexed records verified, 0 lost or corrupt"
              + (f"; {left_open} killed while making datasets, read as before it with a RunWarning" if fmt == "hdf5" else ""))
        return left_open

    def trial(self, fmt, t, new_names):
        """One SIGKILL at a random moment (seeded by the trial); returns
        (records verified, whether the writer was killed making datasets)."""
        rng = random.Random(1234 + t)
        verified = left_open = 0
        run = os.path.join(self.tmp, f"{fmt}{t}")
        p = subprocess.Popen([PROC, "crash", run, fmt] + (["new_names"] if new_names else []),
                             stdout=subprocess.PIPE, text=True)
        self.assertEqual(p.stdout.readline().strip(), "step 0")
        time.sleep(rng.uniform(0.02, 0.6))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        with open(os.path.join(run, "run.json")) as f:
            self.assertFalse(json.load(f)["closed"])
        records = check_index(run)
        r = tensortap.open(run)
        # A writer killed while making new names' datasets is read as
        # before them, with a RunWarning, never refused.
        with WARNINGS, warnings.catch_warnings(record=True) as caught:  # process-wide: one trial at a time
            warnings.simplefilter("always", tensortap.RunWarning)
            for rec in records[:1]:
                r.load(rec["name"], rec["step"], kind=rec["kind"], mmap=False)
        left_open += any("killed?" in str(w.message) for w in caught)
        for rec in records:
            a = r.load(rec["name"], rec["step"], kind=rec["kind"], mmap=False)
            self.assertEqual(list(a.shape), rec["shape"])
            self.assertEqual(a.dtype, NUMPY[rec["dtype"]])
            np.testing.assert_array_equal(a, expected(rec["name"], rec["step"], a.shape))
        r.close()
        if fmt == "npy":
            # No short file under a final name: every .npy loads whole,
            # indexed or not (a crash between rename and index append).
            for d, _, files in os.walk(os.path.join(run, "npy")):
                for name in files:
                    if name.endswith(".npy") and not name.startswith("."):
                        a = np.load(os.path.join(d, name))
                        self.assertEqual(os.path.getsize(os.path.join(d, name)) % 64, a.nbytes % 64)
        if fmt == "packed":
            # An indexed record is a whole image inside its segment; what
            # follows the last one may be a torn, unindexed tail.
            for rec in records:
                size = os.path.getsize(os.path.join(run, rec["file"]))
                self.assertLessEqual(rec["offset"] + rec["nbytes"], size)
                self.assertEqual(rec["offset"] % 64, 0)
        verified += len(records)
        return verified, left_open

    def test_sigkill_npy(self):
        self.run_trials("npy", TRIALS_NPY)

    def test_a_killed_run_says_what_room_its_lines_files_kept(self):
        # Issue 57: after SIGKILL each lines file keeps the room allocated
        # past its end for a full disk (close() gives it back); `inspect
        # --check` says so, as a note, not a problem.
        run = os.path.join(self.tmp, "killed")
        p = subprocess.Popen([PROC, "crash", run, "packed"], stdout=subprocess.PIPE, text=True)
        self.assertEqual(p.stdout.readline().strip(), "step 0")
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        st = os.stat(os.path.join(run, "index.jsonl"))
        if st.st_blocks * 512 < st.st_size + 2 * st.st_blksize:
            self.skipTest("this file system keeps no blocks past a file's end (no fallocate)")
        out = io.StringIO()
        r = tensortap.open(run)
        self.assertEqual(summary.check(r, out=out), 0)
        r.close()
        self.assertRegex(out.getvalue(), r"note: .*index\.jsonl: \d+ bytes allocated past its end \(room kept for "
                                         r"its lines on a full disk; the recorder did not close\)")
        # A run closed gives the room back: nothing to say.
        closed = os.path.join(self.tmp, "closed")
        self.assertEqual(subprocess.run([PROC, "open", closed], capture_output=True).returncode, 0)
        out = io.StringIO()
        r = tensortap.open(closed)
        summary.check(r, out=out)
        r.close()
        self.assertNotIn("allocated past its end", out.getvalue())

    def test_sigkill_packed(self):
        self.run_trials("packed", TRIALS_NPY)

    def test_sigkill_hdf5(self):
        self.run_trials("hdf5", TRIALS_H5)

    def test_sigkill_hdf5_new_names(self):
        # Most trials kill the writer while it makes datasets. Any such trial
        # failed before the reader cleared the writer's flags ("file is already
        # open for write"); one in a few failed before the writer kept a
        # rollback journal (a torn group: "addr overflow", "incorrect metadata
        # checksum", or an abort in HDF5).
        self.run_trials("hdf5", TRIALS_H5_NEW, new_names=True)


class DiskFullTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tensortap-full-")
        self.fs = os.path.join(self.tmp, "fs")
        os.makedirs(self.fs)
        if os.geteuid() != 0:
            self.skipTest("needs root to mount a 1 MiB tmpfs")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", self.fs], capture_output=True)
        if r.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")

    def tearDown(self):
        subprocess.run(["umount", self.fs], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_to_full(self, *args):
        """Runs `reliability_proc ARGS[0] RUN ARGS[1:]` into the small file
        system; checks the failure was reported once on stderr, with the path
        and errno, and that run.json is closed with exact counts. Returns the
        process, the run, run.json and the index."""
        run = os.path.join(self.fs, "run")
        p = subprocess.run([PROC, args[0], run, *args[1:]], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        reports = [line for line in p.stderr.splitlines() if line.startswith("tensortap: error:")]
        self.assertEqual(len(reports), 1, p.stderr)
        self.assertIn("No space left on device (errno 28)", reports[0])
        self.assertIn(run, reports[0])
        with open(os.path.join(run, "run.json")) as f:
            info = json.load(f)
        records = check_index(run)
        self.assertTrue(info["closed"])
        self.assertEqual(info["records"], len(records))
        self.assertGreaterEqual(info["errors"], 1)
        return p, run, info, records

    @staticmethod
    def outcome(stdout):
        """reliability_proc's fill line as a dict: steps, stopped, captured,
        errors, stats_rows (ints) and error (text)."""
        m = re.match(r"steps (\d+) stopped ([01]) captured (\d+) errors (\d+) stats_rows (\d+) error (.*)",
                     stdout, re.S)
        assert m, stdout
        out = dict(zip(("steps", "stopped", "captured", "errors", "stats_rows"), map(int, m.groups()[:5])))
        out["error"] = m.group(6)
        return out

    def fill(self, policy, steps=40):
        p, run, info, records = self.run_to_full("fill", policy, str(steps))
        o = self.outcome(p.stdout)
        done, stopped, error = o["steps"], o["stopped"] == 1, o["error"]
        files = [f for _, _, fs in os.walk(os.path.join(run, "npy")) for f in fs]
        # What was written before the disk filled is valid.
        self.assertEqual(len(files), len(records))
        for rec in records:
            np.testing.assert_array_equal(np.load(os.path.join(run, rec["file"])),
                                          np.full(16384, rec["step"], np.float32))
        return done, stopped, error, info

    def test_continue(self):
        done, stopped, error, info = self.fill("continue")
        self.assertFalse(stopped)
        self.assertEqual(done, 40)  # training went on
        self.assertIn("No space left on device", error)  # close() rethrew it
        self.assertEqual(info["records"] + info["errors"], 40)
        print(f"\ndisk full/continue: {info['records']} written, {info['errors']} failed, training finished")

    def test_hdf5_new_names_after_full(self):
        # A name first seen after the disk filled makes the HDF5 writer create
        # datasets on a full disk: that must neither abort the process nor
        # leave run.json counting rows the index cannot reach.
        # Each new name's datasets take a chunk of their own: a larger disk,
        # so that it fills part way through the run.
        subprocess.run(["umount", self.fs], capture_output=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", self.fs], check=True)
        run = os.path.join(self.fs, "run")
        p = subprocess.run([PROC, "fill_hdf5", run, "200"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("steps 200 ", p.stdout)
        reports = [line for line in p.stderr.splitlines() if line.startswith("tensortap: error:")]
        self.assertEqual(len(reports), 1, p.stderr)
        with open(os.path.join(run, "run.json")) as f:
            info = json.load(f)
        records = check_index(run)
        self.assertTrue(info["closed"])
        self.assertEqual(info["records"], len(records))
        self.assertGreater(info["records"], 40)  # the disk filled part way, not at once
        self.assertGreaterEqual(info["errors"], 1)
        self.assertEqual(info["records"] + info["errors"], 400)  # every capture accounted for
        # Every indexed record reads back with its values.
        r = tensortap.open(run)
        for rec in r.records:
            a = r.load(rec["name"], rec["step"], kind=rec["kind"])
            np.testing.assert_array_equal(a, np.full(a.shape, rec["step"], np.float32))
        r.close()
        print(f"\ndisk full/hdf5 with new names: {info['records']} indexed and readable, {info['errors']} failed")

    def test_packed_continue(self):
        # Records gathered in the writer's buffer and not yet written when the
        # disk fills are not indexed: each is counted as failed, none is lost
        # from the counts, and every indexed one reads back.
        p, run, info, records = self.run_to_full("fill_packed", "40")
        self.assertIn("steps 40 ", p.stdout)
        self.assertIn("No space left on device", p.stdout)
        self.assertEqual(info["records"] + info["errors"], 40)
        r = tensortap.open(run)
        for rec in r.records:
            np.testing.assert_array_equal(r.load(rec["name"], rec["step"], kind=rec["kind"]),
                                          np.full(16384, rec["step"], np.float32))
        print(f"\ndisk full/packed: {info['records']} written, {info['errors']} failed, training finished")

    def test_packed_indexes_what_was_written_before_the_disk_filled(self):
        # Round 4: index lines waited for the 1 s sync, and once the disk was
        # full every sync failed at the flush of the newest bytes before it
        # could make durable and index the records already in the segment:
        # 16 of 30 written records were indexed. Every record wholly in the
        # segment is indexed now, and reads back.
        p, run, info, records = self.run_to_full("fill_packed", "40")
        with open(os.path.join(run, "packed", "00000000.npys"), "rb") as f:
            data = f.read()
        whole = 0
        offset = 0
        while True:
            f = io.BytesIO(data[offset:])
            try:
                a = np.load(f)
            except Exception:
                break
            if a.shape != (16384,) or not (a == whole).all():
                break
            whole += 1
            offset = (offset + f.tell() + 63) // 64 * 64
        self.assertGreater(whole, 3)
        self.assertEqual(len(records), whole, f"{whole} records wholly in the segment, {len(records)} indexed")
        self.assertEqual(sorted(r["step"] for r in records), list(range(whole)))
        print(f"\ndisk full/packed: {whole} records wholly written, {len(records)} indexed")

    def small_fill(self, fmt, fs, no_fallocate=False):
        """Runs `reliability_proc fill_small` into `fs`, which a filler file
        of half of it the program deletes half way keeps fuller at
        first: the disk fills, frees up, fills again. Returns the run,
        run.json and the index."""
        filler = os.path.join(fs, "filler")
        st = os.statvfs(fs)
        with open(filler, "wb") as f:
            f.write(b"\1" * (st.f_blocks * st.f_frsize // 2))
        run = os.path.join(fs, "run")
        args = [PROC, "fill_small", run, fmt, "200", filler] + (["no_fallocate"] if no_fallocate else [])
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        o = self.outcome(p.stdout)
        self.assertIn("No space left on device", o["error"])
        with open(os.path.join(run, "run.json")) as f:
            info = json.load(f)
        records = check_index(run)
        self.assertTrue(info["closed"])
        self.assertEqual(info["records"], len(records))
        self.assertEqual(info["records"] + info["errors"], 200 * 50)  # every capture accounted for
        # The room it kept is given back at close: no ballast is left.
        self.assertEqual([f for f in os.listdir(run) if f.endswith(".room")], [])
        return run, info, records

    def check_every_written_record_indexed(self, fmt, fs, no_fallocate=False):
        # Round 5: the index lines of a batch went in one append; past the
        # 64 KiB kept for them the append failed whole and was cut back, so
        # every record of the batch was on disk and none indexed (0 of 2,000
        # packed, 0 of 1,003 .npy); the cut also freed the kept room for
        # good (after the disk freed up and filled again, 0 of 200); without
        # fallocate (ext2, NFSv3) 30 records lost them all. Now the index
        # keeps room for a record's line before its bytes are written.
        run, info, records = self.small_fill(fmt, fs, no_fallocate)
        indexed = {(r["file"], r.get("offset")) for r in records}
        if fmt == "npy":
            on_disk = {(os.path.relpath(os.path.join(d, f), run), None)
                       for d, _, fs_ in os.walk(os.path.join(run, "npy")) for f in fs_ if f.endswith(".npy")}
        else:
            on_disk = set()
            for seg in sorted(os.listdir(os.path.join(run, "packed"))):
                with open(os.path.join(run, "packed", seg), "rb") as f:
                    data = f.read()
                for off in range(0, len(data), 64):
                    if data[off:off + 6] != b"\x93NUMPY":
                        continue
                    try:
                        a = np.load(io.BytesIO(data[off:]))
                    except Exception:  # noqa: BLE001 - a torn image is not on disk whole
                        continue
                    # A record's own values (step * 100 + k + 1, never 0):
                    # not a stretch whose header went out but not its data.
                    if a.shape == (16,) and a[0] > 0 and (a == a[0]).all():
                        on_disk.add((f"packed/{seg}", off))
        self.assertGreater(len(on_disk), 50)
        missing = sorted(on_disk - indexed)
        self.assertEqual(missing, [], f"{len(missing)} records on disk but not indexed, e.g. {missing[:5]}")
        # Records of the second filling (after the filler went) are indexed.
        self.assertTrue(any(r["step"] > 100 for r in records), "nothing indexed after the disk freed up")
        r = tensortap.open(run)
        for rec in r.records:
            k = int(rec["name"][1:])
            np.testing.assert_array_equal(r.load(rec["name"], rec["step"], kind=rec["kind"]),
                                          np.full(16, rec["step"] * 100 + k + 1, np.float32))
        print(f"\ndisk full twice/{fmt}{'/no fallocate' if no_fallocate else ''}: {len(on_disk)} records on disk, "
              f"{len(records)} indexed, {info['errors']} refused")

    def test_every_written_record_is_indexed_npy(self):
        # An .npy file takes a page of tmpfs: a larger disk, so that a batch
        # of 500 records (70 KiB of index lines) fits before it fills.
        self.check_every_written_record_indexed("npy", self.remount("8m"))

    def test_every_written_record_is_indexed_packed(self):
        self.check_every_written_record_indexed("packed", self.fs)

    def test_every_written_record_is_indexed_without_fallocate(self):
        # The ballast path, on any machine: the lines files behave as on a
        # file system without fallocate.
        self.check_every_written_record_indexed("packed", self.fs, no_fallocate=True)
        self.check_every_written_record_indexed("npy", self.remount("8m"), no_fallocate=True)

    def remount(self, size):
        subprocess.run(["umount", self.fs], capture_output=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", self.fs], check=True)
        return self.fs

    def test_every_written_record_is_indexed_on_ext2(self):
        # A real file system without fallocate, where one can be mounted.
        image = os.path.join(self.tmp, "ext2.img")
        with open(image, "wb") as f:
            f.truncate(4 << 20)
        mnt = os.path.join(self.tmp, "ext2")
        os.makedirs(mnt)
        # Inodes enough for the .npy run's files: the disk's blocks fill first.
        if subprocess.run(["mke2fs", "-q", "-F", "-t", "ext2", "-N", "8192", image],
                          capture_output=True).returncode != 0:
            self.skipTest("mke2fs is not available")
        r = subprocess.run(["mount", "-o", "loop", image, mnt], capture_output=True)
        if r.returncode != 0:
            self.skipTest(f"cannot mount an ext2 image here: {r.stderr.decode().strip()}")
        try:
            self.check_every_written_record_indexed("packed", mnt)
            shutil.rmtree(os.path.join(mnt, "run"))
            self.check_every_written_record_indexed("npy", mnt)
        finally:
            subprocess.run(["umount", mnt], capture_output=True)

    def test_a_large_capture_on_a_full_disk_is_counted_not_thrown(self):
        # Round 4: a tensor larger than a staging buffer that did not fit the
        # free space was refused with a throw out of capture() under
        # OnError::Continue, and counted nowhere. A full disk is not the
        # caller's error: counted as a failed record; training goes on.
        p, run, info, records = self.run_to_full("fill_large", "npy", "40")
        o = self.outcome(p.stdout)
        self.assertEqual(o["stopped"], 0, p.stdout)
        self.assertEqual(o["steps"], 40)
        self.assertEqual(o["captured"], 40)
        self.assertEqual(info["records"] + info["errors"], 40)
        self.assertIn("No space left on device", o["error"])  # close() rethrew the first
        # A record refused for the disk still gives its statistics row.
        self.assertEqual(o["stats_rows"], 40)

    def test_a_chunked_record_that_fails_still_gives_its_statistics(self):
        # Round 4: the statistics of a record streamed in chunks came only
        # once its last chunk was stored. Here HDF5 (deflating, so nothing
        # is refused at capture) refuses every record on the small disk, and
        # each one's row must still be written.
        run = os.path.join(self.fs, "run")
        p = subprocess.run([PROC, "fill_large", run, "hdf5", "40"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        o = self.outcome(p.stdout)
        self.assertEqual((o["steps"], o["stopped"], o["captured"]), (40, 0, 40), p.stdout)
        self.assertEqual(o["errors"], 40, p.stdout)  # HDF5 keeps 4 MiB of headroom: none fits
        self.assertEqual(o["stats_rows"], 40, p.stdout)

    def check_rules_outlive_the_store(self, fmt):
        # Round 4: statistics and triggers came only after a successful
        # store, so once the disk was full a NaN loss never stopped training
        # under after_dump(Throw), and rows went missing from the table.
        p = subprocess.run([PROC, "fill_rules", os.path.join(self.fs, "run"), fmt, "40"], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        o = self.outcome(p.stdout)
        self.assertEqual(o["stopped"], 1, p.stdout)
        self.assertEqual(o["steps"], 31, p.stdout)  # the NaN of step 30 stops step 31
        self.assertIn("a nan", o["error"])
        self.assertIn("'loss'", o["error"])
        self.assertGreater(o["errors"], 0, p.stdout)  # the disk did fill
        self.assertEqual(o["stats_rows"], 2 * 31, p.stdout)  # x and loss, every step

    def test_rules_and_statistics_outlive_a_full_disk_npy(self):
        self.check_rules_outlive_the_store("npy")

    def test_rules_and_statistics_outlive_a_full_disk_hdf5(self):
        self.check_rules_outlive_the_store("hdf5")

    def test_a_disk_full_at_open_says_so(self):
        # Round 4: run.json's fallback (an in-place rewrite, for a disk that
        # fills during the run) ran at open too, where there is no run.json
        # yet, and reported ENOENT instead of the full disk.
        with open(os.path.join(self.fs, "filler"), "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\1" * 4096)
            except OSError:
                pass
        p = subprocess.run([PROC, "open", os.path.join(self.fs, "run")], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("No space left on device", p.stdout)
        self.assertNotIn("No such file", p.stdout)

    def test_stop(self):
        done, stopped, error, info = self.fill("stop")
        self.assertTrue(stopped)
        self.assertLess(done, 40)
        self.assertIn("capture stopped after an error", error)
        self.assertIn("No space left on device", error)
        self.assertEqual(info["records"] + info["errors"], done)
        print(f"\ndisk full/stop: {info['records']} written, {info['errors']} failed, training stopped at step {done}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
