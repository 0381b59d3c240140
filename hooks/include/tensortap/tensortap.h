#pragma once

/// tensortap: capture activations, gradients and parameters of a LibTorch
/// training run, off the training thread, into `.npy` files, HDF5 or packed
/// `.npy` segments.
///
/// Example:
/// ```
/// #include <tensortap/tensortap.h>
///
/// auto rec = tensortap::watch(*model, tensortap::Options("runs/exp1").every(100));
/// for (int64_t step = 0; step < steps; ++step) {
///   rec->step(step);
///   auto loss = loss_fn(model->forward(x), y);
///   rec->capture("loss", loss);
///   loss.backward();
///   opt.step();
///   opt.zero_grad();
/// }
/// rec->close();
/// ```

#include <tensortap/checkpoint.h>
#include <tensortap/error.h>
#include <tensortap/npy.h>
#include <tensortap/options.h>
#include <tensortap/recorder.h>
#include <tensortap/tap.h>
#include <tensortap/watch.h>
