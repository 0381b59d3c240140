// How the cost of capturing grows with the bytes captured per step (1 MiB to
// 1 GiB, in 10 tensors) and with the number of tensors per step (10 to
// 10,000 tensors of 1 KiB), in every format, on a loop that does a fixed
// amount of compute per step (about 10 ms of matmul) and captures every step.
//
//   bench_scale [--reps N] [--csv PATH] [--quick] [--formats npy,packed,hdf5] [--sweep bytes|tensors]
//   bench_scale --sweep drops    # Overflow::DropNewest against 1-32 capturing threads
//
// For every point and format, measured in the same run: the step time
// without capture (off) and with it (on, flush() included), the time the
// training thread spends inside capture(), and the limits of the same bytes:
// memcpy into a ring as large as staging, and raw write() into the same
// directory, as the format lays them out (one file per tensor for .npy, one
// file for the packed and HDF5 formats). A step is limited by memcpy while
// capture() costs about the copy, and by the disk or the writer thread once
// capture() waits for room in staging (Overflow::Block). Then, without the
// compute, the pipeline's own rate: steps of captures back to back until the
// last is on disk ("drain"), against the raw write() of the same bytes; and
// the files the format created per 1,000 steps. bench/plot_scale.py draws the CSV.
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The training step's own work: a fixed number of matmuls, calibrated once
// to about 10 ms, so every point has the same compute to hide the writer behind.
struct Compute {
  at::Tensor a = at::randn({128, 128}), b = at::randn({128, 128});
  int repeats = 1;
  void operator()() const {
    for (int i = 0; i < repeats; ++i) a.mm(b);
  }
  void calibrate(double target_s) {
    repeats = 20;
    (*this)();
    const Clock::time_point t0 = Clock::now();
    (*this)();
    repeats = std::max(1, static_cast<int>(target_s / (seconds_since(t0) / 20)));
  }
};

struct Point {
  const char* sweep;
  std::int64_t bytes;    // per step
  std::int64_t tensors;  // per step
};

struct Measured {
  double off = 0, on = 0, in_capture = 0, copy = 0, write = 0;  // seconds per step
  double on_compute = 0;  // the compute alone, timed inside the "on" steps: the writer thread may slow it
  double drain = 0;       // a step's captures without compute, until on disk
  double files_per_1000 = 0;
};

struct FormatCase {
  const char* name;
  tensortap::Format format;
  bool one_file;            // raw write() baseline: one file for all, or one per tensor
  std::int64_t most_names;  // points with more tensors a step are skipped
};

const FormatCase kFormats[] = {
    {"npy", tensortap::Format::Npy, false, 1 << 30},
    {"packed", tensortap::Format::Packed, true, 1 << 30},
#ifdef TENSORTAP_HAVE_HDF5
    // HDF5 1.10 creates a name's datasets outside SWMR mode, at a cost that
    // grows with the names in the file (bench_writers' NewName): 10,000 new
    // names take the warm-up tens of minutes.
    {"hdf5", tensortap::Format::Hdf5, true, 1000},
#endif
};

std::vector<at::Tensor> make_tensors(const Point& p) {
  std::vector<at::Tensor> ts;
  const std::int64_t floats = std::max<std::int64_t>(1, p.bytes / p.tensors / 4);
  for (std::int64_t i = 0; i < p.tensors; ++i) ts.push_back(at::full({floats}, static_cast<float>(i)));
  return ts;
}

// Raw write() of the same bytes to the same file system, one write() per
// tensor: into a file each (as .npy lays them out) or appended to one file
// (as the packed and HDF5 formats do). The disk's part of the limit.
double raw_write(const std::vector<at::Tensor>& ts, const std::string& dir, bool one_file) {
  std::filesystem::create_directories(dir);
  const auto fail = [](const std::string& path) {
    std::fprintf(stderr, "bench_scale: cannot write %s\n", path.c_str());
    std::exit(1);
  };
  const Clock::time_point t0 = Clock::now();
  const std::string one = dir + "/all.bin";
  int fd = one_file ? ::open(one.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
  if (one_file && fd < 0) fail(one);
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::string path = one_file ? one : fmt::format("{}/{:05d}.bin", dir, i);
    if (!one_file) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const auto n = static_cast<std::size_t>(ts[i].nbytes());
    if (fd < 0 || ::write(fd, ts[i].data_ptr(), n) != static_cast<ssize_t>(n)) fail(path);
    if (!one_file && ::close(fd) != 0) fail(path);
  }
  if (one_file && ::close(fd) != 0) fail(one);
  const double s = seconds_since(t0);
  std::filesystem::remove_all(dir);
  return s;
}

// This VM slows tmpfs writes down about 6 times once a few GiB of fresh
// memory are in use (pages the hypervisor has to back), so .npy files of the
// untimed steps are removed (the directories stay: the writer made them) and
// each point writes at most about 1 GiB. (A packed segment or an HDF5 file
// that is open while the run goes on stays: see remove_closed_segments.)
void remove_npy_files(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".npy") files.push_back(e.path());
  for (const auto& f : files) std::filesystem::remove(f);
}

// The same for the packed format: the segments the writer has closed (all
// but the newest; it never opens one again). The open one stays.
void remove_closed_segments(const std::string& dir) {
  std::vector<std::filesystem::path> segments;
  if (!std::filesystem::exists(dir + "/packed")) return;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/packed"))
    if (e.path().extension() == ".npys") segments.push_back(e.path());
  std::sort(segments.begin(), segments.end());
  if (!segments.empty()) segments.pop_back();
  for (const auto& f : segments) std::filesystem::remove(f);
}

// The files of a run's records (not index.jsonl, run.json, statistics) and
// their bytes.
struct DataFiles {
  std::int64_t count = 0;
  std::uint64_t bytes = 0;
};
DataFiles data_files(const std::string& dir) {
  DataFiles d;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".npy" || ext == ".npys" || ext == ".h5")) {
      ++d.count;
      d.bytes += e.file_size();
    }
  }
  return d;
}

// memcpy of the step's tensors into a ring as large as staging (two buffers
// of the default 64 MiB), so the destination is as cold in the caches as
// staging's is.
double copy_all(const std::vector<at::Tensor>& ts, std::vector<char>& ring, std::size_t& at) {
  const Clock::time_point t0 = Clock::now();
  for (const at::Tensor& t : ts) {
    const char* p = static_cast<const char*>(t.data_ptr());
    for (auto left = static_cast<std::size_t>(t.nbytes()); left > 0;) {
      if (at == ring.size()) at = 0;
      const std::size_t n = std::min(left, ring.size() - at);
      std::memcpy(ring.data() + at, p, n);
      at += n;
      p += n;
      left -= n;
    }
  }
  return seconds_since(t0);
}

// A recorder of `format` in `dir`, warmed up: both staging buffers touched
// once (steady state), and every name captured once (a name's first record
// creates its directory or dataset, a cost of its first step only).
std::int64_t warm_up(tensortap::Recorder& rec, const std::vector<at::Tensor>& ts,
                     const std::vector<std::string>& names) {
  std::int64_t step = 0;
  const at::Tensor warm = at::zeros({static_cast<std::int64_t>(rec.options().buffer_bytes() / 4)});
  for (int i = 0; i < 2; ++i) {
    rec.step(step++);
    rec.capture("warm", warm);
  }
  rec.step(step++);
  for (std::size_t i = 0; i < ts.size(); ++i) rec.capture(names[i], ts[i]);
  rec.flush();
  return step;
}

// One repetition of one point in one format: off, then on, then the drain,
// then the limits.
Measured measure(const FormatCase& fc, const Compute& compute, const std::vector<at::Tensor>& ts,
                 const std::vector<std::string>& names, std::int64_t steps, const std::string& scratch,
                 std::vector<char>& ring, std::size_t& ring_at) {
  Measured m;
  Clock::time_point t0 = Clock::now();
  for (std::int64_t s = 0; s < steps; ++s) compute();
  m.off = seconds_since(t0) / static_cast<double>(steps);
  const tensortap::Options options = tensortap::Options(scratch + "/run").format(fc.format).overwrite(true);

  {
    tensortap::Recorder rec{options};
    std::int64_t step = warm_up(rec, ts, names);
    remove_npy_files(options.dir());
    remove_closed_segments(options.dir());
    const DataFiles before = data_files(options.dir());
    double in_capture = 0, in_compute = 0;
    t0 = Clock::now();
    for (std::int64_t s = 0; s < steps; ++s) {
      rec.step(step++);
      const Clock::time_point k0 = Clock::now();
      compute();
      in_compute += seconds_since(k0);
      const Clock::time_point c0 = Clock::now();
      for (std::size_t i = 0; i < ts.size(); ++i) rec.capture(names[i], ts[i]);
      in_capture += seconds_since(c0);
    }
    rec.flush();
    m.on = seconds_since(t0) / static_cast<double>(steps);
    m.in_capture = in_capture / static_cast<double>(steps);
    m.on_compute = in_compute / static_cast<double>(steps);
    const DataFiles after = data_files(options.dir());
    if (fc.format == tensortap::Format::Packed) {
      // Segments roll every segment_bytes: from the bytes a step appends,
      // not from the few segments a short run opens.
      const double per_step = static_cast<double>(after.bytes - before.bytes) / static_cast<double>(steps);
      m.files_per_1000 = std::ceil(1000 * per_step / static_cast<double>(options.packed().segment_bytes()));
    } else {
      m.files_per_1000 = 1000.0 * static_cast<double>(after.count - before.count) / static_cast<double>(steps);
    }
    rec.close();
  }
  std::filesystem::remove_all(options.dir());
  {
    // The pipeline's own rate, without compute to hide it behind.
    tensortap::Recorder rec{options};
    std::int64_t step = warm_up(rec, ts, names);
    remove_npy_files(options.dir());
    remove_closed_segments(options.dir());
    t0 = Clock::now();
    for (std::int64_t s = 0; s < steps; ++s) {
      rec.step(step++);
      for (std::size_t i = 0; i < ts.size(); ++i) rec.capture(names[i], ts[i]);
    }
    rec.flush();
    m.drain = seconds_since(t0) / static_cast<double>(steps);
    rec.close();
  }
  std::filesystem::remove_all(options.dir());

  m.copy = copy_all(ts, ring, ring_at);
  m.write = raw_write(ts, scratch + "/raw", fc.one_file);
  return m;
}

// --sweep drops: Overflow::DropNewest against the number of capturing
// threads (issue 46). 1-32 threads share the same work: 16,384 captures of
// 16 KiB (packed, 4 MiB of staging), each after 20 us of busy compute; the
// main thread steps every millisecond. Per count: the share dropped, and
// the rates offered and kept.
void drops_sweep(const std::string& scratch) {
  constexpr int kCaptures = 16384;
  const at::Tensor t = at::ones({4096});  // 16 KiB
  std::printf(
      "| capturing threads | captured | dropped | dropped %% | offered, records/s | kept, records/s | written, MiB/s "
      "|\n|---|---|---|---|---|---|---|\n");
  for (int threads : {1, 2, 4, 8, 16, 32}) {
    const std::string dir = scratch + "/drops";
    std::filesystem::remove_all(dir);
    tensortap::Recorder rec{tensortap::Options(dir)
                                .format(tensortap::Format::Packed)
                                .overflow(tensortap::Overflow::DropNewest)
                                .buffer_bytes(std::size_t{4} << 20)};
    rec.step(0);
    std::atomic<int> running{threads};
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int k = 0; k < threads; ++k)
      pool.emplace_back([&, k] {
        const std::string name = fmt::format("t{}", k);
        for (int i = 0; i < kCaptures / threads; ++i) {
          const auto until = Clock::now() + std::chrono::microseconds(20);
          while (Clock::now() < until) {
          }
          rec.capture(name, t);
        }
        running.fetch_sub(1);
      });
    for (std::int64_t s = 1; running.load() > 0; ++s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      rec.step(s);
    }
    for (auto& th : pool) th.join();
    const double seconds = seconds_since(t0);
    rec.flush();
    const tensortap::Counters c = rec.counters();
    rec.close();
    const double offered = static_cast<double>(c.captured + c.dropped);
    std::printf("| %d | %lld | %lld | %.0f%% | %.0f | %.0f | %.0f |\n", threads, static_cast<long long>(c.captured),
                static_cast<long long>(c.dropped), 100.0 * static_cast<double>(c.dropped) / offered,
                offered / seconds, static_cast<double>(c.captured) / seconds,
                static_cast<double>(c.bytes) / seconds / (1 << 20));
    std::fflush(stdout);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  bool quick = false;
  std::string csv_path;
  std::string format_list;  // empty: every format built
  std::string only_sweep;   // empty: both sweeps
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
      csv_path = argv[++i];
    else if (std::strcmp(argv[i], "--formats") == 0 && i + 1 < argc)
      format_list = argv[++i];
    else if (std::strcmp(argv[i], "--sweep") == 0 && i + 1 < argc)
      only_sweep = argv[++i];
    else {
      std::fprintf(
          stderr,
          "usage: bench_scale [--reps N] [--csv PATH] [--quick] [--formats npy,packed,hdf5] [--sweep bytes|tensors|drops]\n");
      return 2;
    }
  }
  if (only_sweep == "drops") {
    BenchDir scratch;
    drops_sweep(scratch.path);
    return 0;
  }
  at::set_num_threads(1);                 // as bench_training: the writer thread has the other core
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);  // as bench_training: allocation alike in every run
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  Compute compute;
  compute.calibrate(0.010);

  constexpr std::int64_t MiB = std::int64_t{1} << 20;
  std::vector<Point> points;
  for (std::int64_t mb : {1, 4, 16, 64, 256, 1024})
    if (!quick || mb <= 64) points.push_back({"bytes", mb * MiB, 10});
  // Tensors of 1 KiB: what grows is the cost per record.
  for (std::int64_t k : {10, 100, 1000, 10000})
    if (!quick || k <= 1000) points.push_back({"tensors", k * 1024, k});
  if (!only_sweep.empty())
    points.erase(std::remove_if(points.begin(), points.end(), [&](const Point& p) { return only_sweep != p.sweep; }),
                 points.end());
  std::vector<FormatCase> formats;
  for (const FormatCase& fc : kFormats)
    if (format_list.empty() || ("," + format_list + ",").find(std::string(",") + fc.name + ",") != std::string::npos)
      formats.push_back(fc);

  BenchDir scratch;
  std::vector<char> ring(2 * tensortap::Options("").buffer_bytes(), 1);  // touched: warm, like staging
  std::size_t ring_at = 0;
  std::string csv =
      "sweep,format,bytes_per_step,tensors_per_step,steps,off_ms,on_ms,overhead,capture_ms,memcpy_ms,write_ms,"
      "on_compute_ms,drain_ms,files_per_1000_steps\n";
  std::printf(
      "| sweep | format | MiB/step | tensors/step | off ms | on ms | overhead | in capture() ms | compute when on, ms "
      "| memcpy ms | write() ms | drain ms | write() / drain | files per 1000 steps |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Point& p : points) {
    // Fewer steps where a step moves a lot: tmpfs holds every file until
    // the point is done (see remove_npy_files).
    const std::int64_t steps = p.tensors >= 1000 ? std::clamp<std::int64_t>(100000 / p.tensors, 3, 20)
                                                 : std::clamp<std::int64_t>(512 * MiB / p.bytes, 1, 20);
    const int point_reps = p.bytes >= 256 * MiB ? std::min(reps, 2) : reps;
    const std::vector<at::Tensor> ts = make_tensors(p);
    std::vector<std::string> names;
    for (std::int64_t i = 0; i < p.tensors; ++i) names.push_back(fmt::format("t{}", i));
    for (const FormatCase& fc : formats) {
      if (p.tensors > fc.most_names) {
        std::printf("| %s | %s | %.3g | %lld | skipped: more names than this format creates in minutes |\n", p.sweep,
                    fc.name, static_cast<double>(p.bytes) / MiB, static_cast<long long>(p.tensors));
        continue;
      }
      std::vector<double> off, on, in_capture, copy, write, on_compute, drain, files;
      for (int r = 0; r < point_reps; ++r) {
        const Measured m = measure(fc, compute, ts, names, steps, scratch.path, ring, ring_at);
        off.push_back(m.off);
        on.push_back(m.on);
        in_capture.push_back(m.in_capture);
        copy.push_back(m.copy);
        write.push_back(m.write);
        on_compute.push_back(m.on_compute);
        drain.push_back(m.drain);
        files.push_back(m.files_per_1000);
      }
      const double o = median(off), n = median(on);
      const std::string row = fmt::format(
          "{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.0f}", p.sweep, fc.name, p.bytes,
          p.tensors, steps, o * 1e3, n * 1e3, n / o - 1, median(in_capture) * 1e3, median(copy) * 1e3,
          median(write) * 1e3, median(on_compute) * 1e3, median(drain) * 1e3, median(files));
      csv += row + "\n";
      std::printf(
          "| %s | %s | %.3g | %lld | %.2f | %.2f | %+.1f%% | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f |\n",
          p.sweep, fc.name, static_cast<double>(p.bytes) / MiB, static_cast<long long>(p.tensors), o * 1e3, n * 1e3,
          (n / o - 1) * 100, median(in_capture) * 1e3, median(on_compute) * 1e3, median(copy) * 1e3,
          median(write) * 1e3, median(drain) * 1e3, median(write) / median(drain), median(files));
      std::fflush(stdout);
    }
  }
  if (!csv_path.empty()) {
    std::FILE* f = std::fopen(csv_path.c_str(), "w");
    if (f == nullptr || std::fputs(csv.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "bench_scale: cannot write %s\n", csv_path.c_str());
      return 1;
    }
  }
  return 0;
}
