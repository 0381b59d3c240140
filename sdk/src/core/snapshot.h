#pragma once

// How a tensor's values become the C-order bytes a record stores, on the
// host or on its device.

#include <cstddef>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

namespace tensortap::detail {

/// The address of `t`'s first element, to read its bytes. LibTorch 2.1 and
/// later have const_data_ptr(), which reads a lazily cloned (copy-on-write)
/// tensor where it is: data_ptr() would first give it a copy of its own,
/// on the training thread. 1.13 has only data_ptr(), and no lazy clones.
inline const void* bytes_of(const at::Tensor& t) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return t.const_data_ptr();
#else
  return t.data_ptr();
#endif
}

/// Whether `src`'s memory already holds its values as C-order bytes of
/// `stored`, so a byte copy (memcpy, cudaMemcpyAsync) snapshots it. A
/// conjugate or negative view is "contiguous" but its bytes are not its
/// values; a strided view or another dtype needs ATen's copy.
inline bool is_byte_copy(const at::Tensor& src, c10::ScalarType stored) {
  return src.scalar_type() == stored && src.is_contiguous() && !src.is_conj() && !src.is_neg();
}

/// Copies `src` (a CPU tensor) into `dst` as C-order bytes of dtype
/// `stored` (`nbytes` of them).
void copy_into(char* dst, const at::Tensor& src, c10::ScalarType stored, std::size_t nbytes);

/// Copies elements `[first, first + count)` of `src` (a CPU tensor), in C
/// order, into `dst` as dtype `stored`: one chunk of a record streamed
/// through staging, without a copy of the whole tensor.
void copy_elements(char* dst, const at::Tensor& src, c10::ScalarType stored, std::int64_t first, std::int64_t count);

}  // namespace tensortap::detail
