#pragma once

#include <cstdint>
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

/// Sets `module`'s parameters and buffers to a run's `param` and `buffer`
/// records at `step`, by name: how a C++ port starts from the Python
/// model's weights (recorded by the Python twin, tensortap.torch, with kinds
/// param and buffer), or from another C++ run. The run is read through its
/// index: `.npy`, packed, or HDF5 in a build with HDF5; `rank` picks a
/// multi-rank run's `rank<r>/`. Before anything is set, every parameter and
/// buffer of `module` must have a record at `step` of its shape and dtype
/// (bfloat16 comes back exactly), and, with `strict`, every `param` and
/// `buffer` record at `step` a tensor of `module`: otherwise `Error` lists
/// the first names missing, left over or mismatched, and nothing is set. A
/// tensor registered under two names (tied weights) is set once, by
/// whichever name the run recorded it under. Values are copied into the
/// module's tensors (their devices kept), without autograd.
///
/// Example:
/// ```
/// tensortap::load_params(*model, "runs/py", /*step=*/0);
/// ```
void load_params(torch::nn::Module& module, const std::string& run, std::int64_t step, std::int64_t rank = 0,
                 bool strict = true);

/// The same, for a module holder (`torch::nn::Sequential`, a `TORCH_MODULE`).
template <class Contained>
void load_params(const torch::nn::ModuleHolder<Contained>& module, const std::string& run, std::int64_t step,
                 std::int64_t rank = 0, bool strict = true) {
  load_params(*module.ptr(), run, step, rank, strict);
}

/// The same, for a module held by a `std::shared_ptr`.
template <class M>
void load_params(const std::shared_ptr<M>& module, const std::string& run, std::int64_t step, std::int64_t rank = 0,
                 bool strict = true) {
  load_params(*module, run, step, rank, strict);
}

/// Moves every floating parameter of `module` (float16, bfloat16, float32,
/// float64; in `named_parameters()` order, a tied one once) by `ulps` units
/// in the last place of its own dtype, up or down: the reference run of a
/// port check's noise floor (`tensortap diff A B --floor A2`), bit-identical
/// to `tensortap.torch.perturb(model, ulps, seed)` for the same names and
/// seed. Each element's direction comes from its parameter's name, `seed`
/// and its flat index (docs/diff.md gives the rule); zeros move to the
/// smallest subnormal, the largest finite value and non-finite values stay.
/// `ulps` is 1 to 1024. In place, without autograd.
///
/// Example:
/// ```
/// tensortap::perturb(*model, /*ulps=*/1, /*seed=*/0);   // before the first step()
/// ```
void perturb(torch::nn::Module& module, std::int64_t ulps = 1, std::uint64_t seed = 0);

/// The same, for a module holder.
template <class Contained>
void perturb(const torch::nn::ModuleHolder<Contained>& module, std::int64_t ulps = 1, std::uint64_t seed = 0) {
  perturb(*module.ptr(), ulps, seed);
}

/// The same, for a module held by a `std::shared_ptr`.
template <class M>
void perturb(const std::shared_ptr<M>& module, std::int64_t ulps = 1, std::uint64_t seed = 0) {
  perturb(*module, ulps, seed);
}

}  // namespace tensortap
