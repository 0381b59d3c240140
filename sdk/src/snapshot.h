#pragma once

// How a tensor's values become the C-order bytes a record stores, on the
// host or on its device.

#include <cstddef>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace tensortap::detail {

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

}  // namespace tensortap::detail
