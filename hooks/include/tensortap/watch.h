#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include <tensortap/options.h>
#include <tensortap/recorder.h>

// TorchScript's module, declared only: <torch/script.h> is not pulled into
// every file that includes tensortap.
namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace tensortap {

/// Creates a recorder for `options` and hooks it into `module`'s tree:
/// - a gradient hook on every parameter that requires grad (kind `grad`,
///   named by its `named_parameters()` path, e.g. `encoder.0.weight`);
///   the record is the gradient accumulated over the step's backward
///   passes, committed when the step ends;
/// - the parameters themselves at the start of sampled steps (kind `param`,
///   off unless `Options::kinds` includes it);
/// - every `Tap` in the tree, named by its `named_modules()` path. The
///   watched module itself, if it is a tap point (`watch(*tapped_net)` of a
///   `Tapped<Net>`), has no path: its output is named by the prefix of
///   `watch(module, recorder, prefix)`, or `root`.
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

/// Hooks an existing recorder into another module tree, as above: one run
/// for several models (a GAN's generator and discriminator). With a
/// `prefix`, every name from this module gets it: `watch(*gen, *rec, "G")`
/// records `G/conv1.weight`, so two models with the same parameter names
/// stay apart.
///
/// Throws `Error`, hooking nothing, if the recorder is closed, if this
/// recorder already watches one of the module's parameters or tap points
/// (watching a module twice would record everything twice), or if a name
/// collides with one the recorder already watches (give a prefix).
///
/// Example:
/// ```
/// auto rec = tensortap::watch(*disc, tensortap::Options("runs/gan"));
/// tensortap::watch(*gen, *rec, "G");
/// ```
void watch(torch::nn::Module& module, Recorder& recorder, const std::string& prefix = "");

/// A TorchScript module (`torch::jit::load`, fine-tuned in C++), watched as
/// far as it can be: the gradients of its parameters (kind `grad`, by its
/// `named_parameters()` names, `fc.weight`), by default and through
/// `record_grads`, the parameters and the buffers. Activations are not
/// hooked: a scripted module takes no forward hook from C++. Capture them
/// with `Options::capture_ops` (every ATen op's output, named by the op) or
/// `capture()` of the outputs; README, "TorchScript modules".
///
/// Example:
/// ```
/// torch::jit::Module model = torch::jit::load("model.pt");
/// auto rec = tensortap::watch(model, tensortap::Options("runs/ft"));
/// ```
std::shared_ptr<Recorder> watch(torch::jit::Module& module, Options options);

/// `watch(module, options)` into an existing recorder, with names prefixed
/// as for a `torch::nn::Module`.
void watch(torch::jit::Module& module, Recorder& recorder, const std::string& prefix = "");

}  // namespace tensortap
