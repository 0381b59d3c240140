#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

// A scratch directory for a benchmark, in memory (/dev/shm) when the machine
// has it so the disk does not swamp what is measured, or $TENSORTAP_BENCH_DIR.
struct BenchDir {
  std::string path;
  BenchDir() {
    const char* env = std::getenv("TENSORTAP_BENCH_DIR");
    std::string base = env != nullptr ? env : (::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    std::string pattern = base + "/tensortap-bench-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    path = pattern;
  }
  ~BenchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
