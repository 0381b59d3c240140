// Training-like processes for test_reliability.py.
//   reliability_proc crash DIR npy|hdf5|packed [new_names]
//       captures every step until killed: tensors of 1 KiB to 1 MiB, several
//       names, a repeat, bfloat16; prints "step N" now and then. With
//       new_names, no 1 MiB tensor but eight names never seen before every step
//       ("new<step>", "new<step>.<k>"), so an HDF5 writer often dies while making datasets
//   reliability_proc fill DIR continue|stop STEPS
//       captures 64 KiB a step into a small filesystem until it is full
//   reliability_proc fill_hdf5 DIR STEPS
//       the same in an HDF5 run, and a name never seen before every step, so
//       new datasets are created after the disk filled
//   reliability_proc fill_packed DIR STEPS
//       `fill DIR continue STEPS` in a Format::Packed run
//   reliability_proc fill_large DIR npy|hdf5 STEPS
//       256 KiB a step through a 64 KiB staging buffer (streamed in chunks,
//       checked against the free space before it starts, but not in HDF5,
//       which deflates here), statistics every step, OnError::Continue
//   reliability_proc fill_rules DIR npy|hdf5 STEPS
//       64 KiB a step and a 0-d "loss", NaN at step STEPS - 10, with
//       statistics every step and dump_on(non_finite()).after_dump(Throw)
//   reliability_proc fill_small DIR npy|packed STEPS FILLER [no_fallocate]
//       50 records of 64 bytes a step, flushed every 20 steps (120 KiB of index
//       lines a batch, where a full disk lost them all in round 4); at step
//       STEPS / 2 it deletes the file
//       FILLER, so the disk frees up and fills a second time. no_fallocate:
//       the lines files keep their room as on a file system without
//       fallocate (a ballast file), whatever this one supports
// Each fill prints one line: "steps <s> stopped <0|1> captured <c> errors <e>
// stats_rows <r> error <what step() or close() threw>".
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include <tensortap/tensortap.h>

#include "writers/src/lines_file.h"

using tensortap::Options;

static int crash(const std::string& dir, tensortap::Format format, bool new_names) {
  tensortap::Recorder rec(Options(dir).format(format).buffer_bytes(1 << 20));
  for (int64_t s = 0;; ++s) {
    rec.step(s);
    rec.capture("small", at::full({256}, static_cast<double>(s)));
    rec.capture("small", at::full({256}, static_cast<double>(-s)));  // small#1
    if (!new_names)  // with new names, the writer's time goes to making datasets
      rec.capture("large", at::full({512, 512}, static_cast<double>(s)));                 // 1 MiB: streamed in chunks
    rec.capture("bf16", at::full({64}, static_cast<double>(s % 128)).to(at::kBFloat16));  // exact in bfloat16
    rec.capture("ids", at::arange(s, s + 100, at::kLong));
    // Eight names a step never seen before: a crash finds the writer making
    // datasets often, in a file holding thousands of names after a while.
    if (new_names)
      for (int k = 0; k < 8; ++k)
        rec.capture("new" + std::to_string(s) + (k == 0 ? "" : "." + std::to_string(k)),
                    at::full({64}, static_cast<double>(s)));
    if (s % 20 == 0) {
      std::printf("step %lld\n", static_cast<long long>(s));
      std::fflush(stdout);
    }
  }
}

enum class Fill { Plain, Large, Rules };

static int fill(const std::string& dir, bool stop, int64_t steps, tensortap::Format format, Fill what = Fill::Plain) {
  const bool hdf5 = format == tensortap::Format::Hdf5;
  Options options = Options(dir)
                        .on_error(stop ? tensortap::OnError::Stop : tensortap::OnError::Continue)
                        .format(format)
                        // One row a chunk: the disk fills row by row, not at the first chunk.
                        .hdf5(tensortap::Hdf5Options().chunk_bytes(64 << 10));
  if (what == Fill::Large)
    options.buffer_bytes(64 << 10).stats_every(1).hdf5(tensortap::Hdf5Options().chunk_bytes(64 << 10).deflate(1));
  if (what == Fill::Rules)
    options.stats_every(1).dump_on(tensortap::Trigger::non_finite()).after_dump(tensortap::AfterDump::Throw);
  tensortap::Recorder rec(options);
  int64_t s = 0;
  bool stopped = false;
  std::string error;
  try {
    for (; s < steps; ++s) {
      rec.step(s);
      rec.capture("x", at::full({what == Fill::Large ? 65536 : 16384}, static_cast<double>(s)));  // 256 or 64 KiB
      if (hdf5 && what == Fill::Plain) rec.capture("new" + std::to_string(s), at::full({64}, static_cast<double>(s)));
      if (what == Fill::Rules)
        rec.capture("loss", at::scalar_tensor(s == steps - 10 ? std::nan("") : static_cast<double>(s), at::kFloat));
      // With Stop (and the rules), let the writer catch up so the error
      // surfaces at the next step() (flush() itself rethrows it: not what
      // is tested here); with Continue, training does not look at all.
      if (stop || what == Fill::Rules) {
        try {
          rec.flush();
        } catch (const tensortap::Error&) {
        }
      }
    }
  } catch (const tensortap::Error& e) {
    stopped = true;
    error = e.what();
  }
  try {
    rec.close();
  } catch (const tensortap::Error& e) {
    if (error.empty()) error = e.what();
  }
  const tensortap::Counters c = rec.counters();
  std::printf("steps %lld stopped %d captured %lld errors %lld stats_rows %lld error %s\n", static_cast<long long>(s),
              stopped ? 1 : 0, static_cast<long long>(c.captured), static_cast<long long>(c.errors),
              static_cast<long long>(c.stats_rows), error.c_str());
  return 0;
}

static int fill_small(const std::string& dir, tensortap::Format format, int64_t steps, const std::string& filler,
                      bool no_fallocate) {
  if (no_fallocate) tensortap::detail::testing::set_fallocate_unsupported(true);
  tensortap::Recorder rec(Options(dir).format(format));
  std::string error;
  for (int64_t s = 0; s < steps; ++s) {
    rec.step(s);
    for (int k = 0; k < 50; ++k)
      // Never 0: a record's stretch whose bytes never came reads as zeros.
      rec.capture("r" + std::to_string(k), at::full({16}, static_cast<double>(s * 100 + k + 1), at::kFloat));
    // Twenty steps' records are a batch (about 120 KiB of index lines, more
    // than the 64 KiB a lines file kept in round 4), as where training
    // computes between steps; the failure of a flush is close()'s to report.
    if (s % 20 == 19) {
      try {
        rec.flush();
      } catch (const tensortap::Error&) {
      }
    }
    if (s == steps / 2) std::remove(filler.c_str());
  }
  try {
    rec.close();
  } catch (const tensortap::Error& e) {
    error = e.what();
  }
  const tensortap::Counters c = rec.counters();
  std::printf("steps %lld stopped 0 captured %lld errors %lld stats_rows %lld error %s\n", static_cast<long long>(steps),
              static_cast<long long>(c.captured), static_cast<long long>(c.errors),
              static_cast<long long>(c.stats_rows), error.c_str());
  return 0;
}

// Opens a recorder in DIR and closes it: prints "opened", or the error.
static int open_only(const std::string& dir) {
  try {
    tensortap::Recorder rec{Options(dir)};
    rec.close();
  } catch (const tensortap::Error& e) {
    std::printf("error %s\n", e.what());
    return 1;
  }
  std::printf("opened\n");
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "open" && argc == 3) return open_only(argv[2]);
  if (mode == "crash" && (argc == 4 || (argc == 5 && std::string(argv[4]) == "new_names"))) {
    const std::string f = argv[3];
    return crash(argv[2],
                 f == "hdf5"     ? tensortap::Format::Hdf5
                 : f == "packed" ? tensortap::Format::Packed
                                 : tensortap::Format::Npy,
                 argc == 5);
  }
  if (mode == "fill" && argc == 5)
    return fill(argv[2], std::string(argv[3]) == "stop", std::atoll(argv[4]), tensortap::Format::Npy);
  if (mode == "fill_hdf5" && argc == 4) return fill(argv[2], false, std::atoll(argv[3]), tensortap::Format::Hdf5);
  if (mode == "fill_packed" && argc == 4) return fill(argv[2], false, std::atoll(argv[3]), tensortap::Format::Packed);
  if ((mode == "fill_large" || mode == "fill_rules") && argc == 5)
    return fill(argv[2], false, std::atoll(argv[4]),
                std::string(argv[3]) == "hdf5" ? tensortap::Format::Hdf5 : tensortap::Format::Npy,
                mode == "fill_large" ? Fill::Large : Fill::Rules);
  if (mode == "fill_small" && (argc == 6 || (argc == 7 && std::string(argv[6]) == "no_fallocate")))
    return fill_small(argv[2], std::string(argv[3]) == "packed" ? tensortap::Format::Packed : tensortap::Format::Npy,
                      std::atoll(argv[4]), argv[5], argc == 7);
  std::fprintf(stderr,
               "usage: reliability_proc crash DIR npy|hdf5|packed [new_names] | fill DIR continue|stop STEPS | "
               "fill_hdf5 DIR STEPS | fill_packed DIR STEPS | fill_small DIR npy|packed STEPS FILLER [no_fallocate] | "
               "open DIR\n");
  return 2;
}
