#pragma once

#include <memory>
#include <string>

#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace tensortap {

/// Loads a checkpoint written by `torch::save(model, path)` into `module`:
/// a drop-in for `torch::load(module, path)` that accepts a checkpoint with
/// or without tensortap's modules. `torch::load` refuses a checkpoint saved
/// before a `Tap` was added ("No such serialized submodule"), because the
/// Tap is a child with no entry in it; here a child with no entry is left
/// as it is when it holds no parameter or buffer anywhere below it (a Tap,
/// an activation, a dropout). Everything that has state must be in the
/// checkpoint, as with `torch::load`: a missing parameter, buffer or stateful
/// submodule throws `Error` naming its path and the file. `Tapped<M>` keeps
/// `M`'s names, so it loads like `M` either way. It reads what
/// `Module::save` writes (parameters, buffers, serializable children); a
/// module of yours that overrides `load()` to read more is read as
/// `Module::load` would, without that override.
///
/// Example:
/// ```
/// tensortap::load_checkpoint(*model, "ckpt.pt");   // saved before tensortap was added
/// ```
void load_checkpoint(torch::nn::Module& module, const std::string& path,
                     const c10::optional<c10::Device>& device = c10::nullopt);

/// The same, for a module holder (`torch::nn::Sequential`, a `TORCH_MODULE`).
template <class Contained>
void load_checkpoint(const torch::nn::ModuleHolder<Contained>& module, const std::string& path,
                     const c10::optional<c10::Device>& device = c10::nullopt) {
  load_checkpoint(*module.ptr(), path, device);
}

/// The same, for a module held by a `std::shared_ptr`.
template <class M>
void load_checkpoint(const std::shared_ptr<M>& module, const std::string& path,
                     const c10::optional<c10::Device>& device = c10::nullopt) {
  load_checkpoint(*module, path, device);
}

}  // namespace tensortap
