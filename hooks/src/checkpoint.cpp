#include <tensortap/checkpoint.h>

#include <exception>
#include <string>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
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

// A tensor of the module and the checkpoint's value for it.
struct Pending {
  torch::Tensor target;
  torch::Tensor value;
};

std::string shape_of(const torch::Tensor& t) {
  std::string out = "[";
  for (std::size_t i = 0; i < t.sizes().size(); ++i) out += (i ? ", " : "") + std::to_string(t.sizes()[i]);
  return out + "]";
}

// Reads what Module::load would (parameters, buffers, then each child's
// archive), except that a stateless child with no entry is skipped, and
// sets nothing: every name, shape and dtype is checked first (once, a
// checkpoint of Linear(3, 2) loaded into a Linear(4, 5) changed its weight
// to [2, 3], and a refused load had overwritten the submodules before the
// one refused). Modules' own load() overrides are not called: LibTorch's
// modules have none.
void read_into(torch::nn::Module& m, torch::serialize::InputArchive& archive, const std::string& prefix,
               const std::string& file, std::vector<Pending>& out) {
  const auto read = [&](const std::string& key, const torch::Tensor& t, bool buffer) {
    const char* what = buffer ? "buffer" : "parameter";
    torch::Tensor value;
    bool found = false;
    try {
      found = archive.try_read(key, value, buffer);
    } catch (const c10::Error& e) {
      detail::fail("load_checkpoint: '{}': {} '{}': {}", file, what, path_of(prefix, key), e.what_without_backtrace());
    }
    if (!found)
      detail::fail("load_checkpoint: '{}' has no {} '{}' (a checkpoint of another model?)", file, what,
                   path_of(prefix, key));
    if (t.defined() && (value.sizes() != t.sizes() || value.scalar_type() != t.scalar_type()))
      detail::fail("load_checkpoint: '{}': {} '{}' is {} {} in the checkpoint and {} {} in the model; nothing was "
                   "loaded (a checkpoint of another model?)",
                   file, what, path_of(prefix, key), c10::toString(value.scalar_type()), shape_of(value),
                   c10::toString(t.scalar_type()), shape_of(t));
    out.push_back({t, std::move(value)});
  };
  for (auto& p : m.named_parameters(/*recurse=*/false)) read(p.key(), p.value(), false);
  for (auto& b : m.named_buffers(/*recurse=*/false)) read(b.key(), b.value(), true);
  for (const auto& c : m.named_children()) {
    // What torch::save leaves out, torch::load does not look for.
    if (!c.value()->is_serializable()) continue;
    torch::serialize::InputArchive child;
    if (archive.try_read(c.key(), child)) {
      read_into(*c.value(), child, path_of(prefix, c.key()), file, out);
    } else if (has_state(*c.value())) {
      detail::fail("load_checkpoint: '{}' has no submodule '{}', which has parameters or buffers (a checkpoint of "
                   "another model?); nothing was loaded",
                   file, path_of(prefix, c.key()));
    }
  }
}

// Whether `path` is a zip archive written by Python's torch.save() of a
// plain object (a state_dict): its data.pkl beside no constants.pkl, where
// torch::save (a TorchScript archive) writes both. LibTorch calls it
// "corrupted", which sends the user the wrong way.
bool is_python_pickle(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    return reader.hasRecord("data.pkl") && !reader.hasRecord("constants.pkl");
  } catch (...) {
    return false;  // not a zip archive of LibTorch's form: not a pickle of torch.save either
  }
}

}  // namespace

void load_checkpoint(torch::nn::Module& module, const std::string& path, const c10::optional<c10::Device>& device) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, device);
  } catch (const c10::Error& e) {
    if (is_python_pickle(path))
      detail::fail(
          "load_checkpoint: '{}' is a Python state_dict (torch.save of a dict), not a checkpoint torch::save "
          "writes: save it with `torch.save({{k: v for k, v in sd.items()}})` and load it with "
          "`torch::pickle_load`, or record the Python run with the twin (tensortap.torch, kinds param and "
          "buffer) and use `tensortap::load_params`",
          path);
    detail::fail("load_checkpoint: '{}': {}", path, e.what_without_backtrace());
  }
  std::vector<Pending> pending;
  read_into(module, archive, "", path, pending);
  // Every value checked: set them as torch::load does (InputArchive's
  // try_read), the tensor kept, its data the checkpoint's.
  c10::NoGradGuard no_grad;
  for (Pending& p : pending) {
    if (!p.target.defined()) continue;  // an undefined buffer: nothing to set, as torch::load
    if (p.target.device() != p.value.device())
      p.target.set_data(p.value);
    else
      p.target.set_(p.value);
  }
}

}  // namespace tensortap
