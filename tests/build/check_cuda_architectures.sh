#!/bin/sh
# Regression check (issue 46): configures this tree against the LibTorch the
# build found with TORCH_CUDA_ARCH_LIST unset, as a user who follows the
# README without a GPU does, and compiles tensortap's own kernels. LibTorch's
# CMake then proposes its "Common" list, which names architectures a newer
# nvcc refuses (nvcc 13: compute_50, compute_101a); cmake/cuda.cmake must
# keep only those `nvcc --list-gpu-arch` lists.
#   check_cuda_architectures.sh SOURCE WORK PREFIX_PATH CUDA_COMPILER CUDA_TOOLKIT_ROOT
set -eu
src=$1 work=$2 prefix=$3 nvcc=$4 toolkit=$5
unset TORCH_CUDA_ARCH_LIST
rm -rf "$work"
cmake -S "$src" -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix" \
  -DTENSORTAP_WITH_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc" "-DCUDAToolkit_ROOT=$toolkit" \
  -DTENSORTAP_BUILD_TESTS=OFF -DTENSORTAP_BUILD_BENCH=OFF -DTENSORTAP_BUILD_EXAMPLES=OFF \
  ${CMAKE_CUDA_COMPILER_LAUNCHER:+"-DCMAKE_CUDA_COMPILER_LAUNCHER=$CMAKE_CUDA_COMPILER_LAUNCHER"} >"$work.log" 2>&1 ||
  { cat "$work.log"; exit 1; }
grep "Added CUDA NVCC flags\|tensortap: architectures\|fused statistics" "$work.log" || true
grep -q "fused statistics kernels on" "$work.log" || { echo "FAIL: no CUDA compiler in the configure"; exit 1; }
cmake --build "$work" --target tensortap_cuda_kernels
echo "OK: tensortap's kernels compile with TORCH_CUDA_ARCH_LIST unset"
rm -rf "$work" "$work.log"
