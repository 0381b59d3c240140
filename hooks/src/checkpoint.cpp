#include <tensortap/checkpoint.h>

#include <exception>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>

#include <tensortap/error.h>

#include "writers/src/check.h"

namespace tensortap {
namespace {

// Whether `m` or anything below it has a parameter or buffer: what a
// checkpoint must hold an entry for.
bool has_state(const torch::nn::Module& m) { return !m.parameters().empty() || !m.buffers().empty(); }

std::string path_of(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// What Module::load does (parameters, buffers, then each child's archive),
// except that a stateless child with no entry is skipped. Modules' own
// load() overrides are not called: LibTorch's modules have none.
void load_into(torch::nn::Module& m, torch::serialize::InputArchive& archive, const std::string& prefix,
               const std::string& file) {
  const auto read = [&](const std::string& key, torch::Tensor& t, bool buffer) {
    bool found = false;
    try {
      found = archive.try_read(key, t, buffer);
    } catch (const c10::Error& e) {
      detail::fail("load_checkpoint: '{}': {} '{}': {}", file, buffer ? "buffer" : "parameter", path_of(prefix, key),
                   e.what_without_backtrace());
    }
    if (!found)
      detail::fail("load_checkpoint: '{}' has no {} '{}' (a checkpoint of another model?)", file,
                   buffer ? "buffer" : "parameter", path_of(prefix, key));
  };
  for (auto& p : m.named_parameters(/*recurse=*/false)) read(p.key(), p.value(), false);
  for (auto& b : m.named_buffers(/*recurse=*/false)) read(b.key(), b.value(), true);
  for (const auto& c : m.named_children()) {
    // What torch::save leaves out, torch::load does not look for.
    if (!c.value()->is_serializable()) continue;
    torch::serialize::InputArchive child;
    if (archive.try_read(c.key(), child)) {
      load_into(*c.value(), child, path_of(prefix, c.key()), file);
    } else if (has_state(*c.value())) {
      detail::fail("load_checkpoint: '{}' has no submodule '{}', which has parameters or buffers (a checkpoint of "
                   "another model?)",
                   file, path_of(prefix, c.key()));
    }
  }
}

}  // namespace

void load_checkpoint(torch::nn::Module& module, const std::string& path, const c10::optional<c10::Device>& device) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, device);
  } catch (const c10::Error& e) {
    detail::fail("load_checkpoint: '{}': {}", path, e.what_without_backtrace());
  }
  // As torch::load: the values are copied into the tensors in place.
  c10::NoGradGuard no_grad;
  load_into(module, archive, "", path);
}

}  // namespace tensortap
