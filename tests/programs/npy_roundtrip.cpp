// Reads every .npy in IN_DIR with load_npy (read and mapped, which must
// agree) and writes it to OUT_DIR with save_npy, for numpy_roundtrip.py to
// compare with what NumPy wrote.
//   npy_roundtrip IN_DIR OUT_DIR
#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>

#include <tensortap/npy.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: npy_roundtrip IN_DIR OUT_DIR\n");
    return 2;
  }
  std::filesystem::create_directories(argv[2]);
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(argv[1])) {
    if (e.path().extension() != ".npy") continue;
    const at::Tensor read = tensortap::load_npy(e.path().string());
    const at::Tensor mapped = tensortap::load_npy(e.path().string(), tensortap::LoadOptions().mmap(true));
    if (!at::equal(read, mapped)) {
      std::fprintf(stderr, "%s: read and mapped differ\n", e.path().c_str());
      return 1;
    }
    tensortap::save_npy((std::filesystem::path(argv[2]) / e.path().filename()).string(), read);
    ++n;
  }
  std::printf("npy_roundtrip: %d files\n", n);
  return n > 0 ? 0 : 1;
}
