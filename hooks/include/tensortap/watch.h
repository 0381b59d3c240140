#pragma once

#include <memory>

#include <torch/nn/module.h>

#include <tensortap/options.h>
#include <tensortap/recorder.h>

namespace tensortap {

/// Creates a recorder for `options` and hooks it into `module`'s tree:
/// - a gradient hook on every parameter that requires grad (kind `grad`,
///   named by its `named_parameters()` path, e.g. `encoder.0.weight`);
///   the record is the gradient accumulated over the step's backward
///   passes, committed when the step ends;
/// - the parameters themselves at the start of sampled steps (kind `param`,
///   off unless `Options::kinds` includes it);
/// - every `Tap` in the tree, named by its `named_modules()` path.
///
/// Only names selected by the options are hooked. The hooks are removed
/// when the recorder closes or is destroyed; the module must outlive that.
///
/// Example:
/// ```
/// auto model = std::make_shared<Net>();
/// auto rec = tensortap::watch(*model, tensortap::Options("runs/exp1").every(100));
/// ```
std::shared_ptr<Recorder> watch(torch::nn::Module& module, Options options);

/// Hooks an existing recorder into another module tree, as above.
void watch(torch::nn::Module& module, Recorder& recorder);

}  // namespace tensortap
