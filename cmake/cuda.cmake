# The CUDA transfer engine (sdk/src/cuda), included by the root CMakeLists
# once the tensortap target exists. Two levels:
#
#   TENSORTAP_HAVE_CUDA_ENGINE  the CUDA toolkit is found. The engine (CUDA
#                               runtime API only) is built with its tests
#                               and benchmark, GPU or not, so CI compiles it.
#   TENSORTAP_HAVE_CUDA         LibTorch has CUDA too (TARGET torch_cuda).
#                               The engine and its LibTorch glue are part of
#                               tensortap and CUDA tensors go through them.
#
# Without CUDA LibTorch the library itself never links libcudart: the engine
# is then a separate library, tensortap_cuda_engine, that only tests and
# benchmarks link. Either way they link that name.

option(TENSORTAP_WITH_CUDA "Build the CUDA transfer engine when the CUDA toolkit is found" ON)

# The engine (the copier thread and the device state it drives) and the
# pinned host memory for staging. Full paths: tests/ compiles them too.
set(TENSORTAP_CUDA_ENGINE_SOURCES
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/engine.cpp
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/copier.cpp
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/step_groups.cpp
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/batch.cpp
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/device.cpp
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/pinned.cpp)

# Only the architectures this nvcc can compile (`nvcc --list-gpu-arch`),
# whatever LibTorch's CMake proposes. It puts its list into
# CMAKE_CUDA_FLAGS as -gencode pairs: TORCH_CUDA_ARCH_LIST's, or without one
# and without a GPU its "Common" list, which names architectures a newer
# nvcc refuses (LibTorch 2.11 and 2.15 with nvcc 13: compute_50 and
# compute_101a, "nvcc fatal: Unsupported gpu architecture"). The pairs this
# nvcc does not list are dropped, as are such entries of
# TENSORTAP_CUDA_ARCHITECTURES, and the configure says which.
macro(tensortap_cuda_supported_architectures)
  execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-arch OUTPUT_VARIABLE _tt_listed
                  RESULT_VARIABLE _tt_rc ERROR_QUIET)
  string(REGEX MATCHALL "compute_[0-9]+" _tt_supported "${_tt_listed}")
  if(_tt_rc EQUAL 0 AND _tt_supported)
    set(_tt_dropped "")
    string(REGEX MATCHALL "-gencode[ =]arch=compute_[0-9]+[a-z]?,code=[^ ]+" _tt_pairs "${CMAKE_CUDA_FLAGS}")
    foreach(_tt_pair IN LISTS _tt_pairs)
      string(REGEX MATCH "compute_[0-9]+" _tt_base "${_tt_pair}")
      if(NOT _tt_base IN_LIST _tt_supported)
        string(REPLACE "${_tt_pair}" "" CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
        list(APPEND _tt_dropped "${_tt_base}")
      endif()
    endforeach()
    set(_tt_kept "")
    foreach(_tt_arch IN LISTS TENSORTAP_CUDA_ARCHITECTURES)
      string(REGEX MATCH "^[0-9]+" _tt_number "${_tt_arch}")
      if("compute_${_tt_number}" IN_LIST _tt_supported)
        list(APPEND _tt_kept "${_tt_arch}")
      else()
        list(APPEND _tt_dropped "${_tt_arch}")
      endif()
    endforeach()
    if(NOT _tt_kept)
      # None left: PTX of the oldest this nvcc has, which every newer GPU runs.
      list(GET _tt_supported 0 _tt_oldest)
      string(REPLACE "compute_" "" _tt_oldest "${_tt_oldest}")
      set(_tt_kept "${_tt_oldest}-virtual")
    endif()
    set(TENSORTAP_CUDA_ARCHITECTURES "${_tt_kept}")
    if(_tt_dropped)
      list(REMOVE_DUPLICATES _tt_dropped)
      message(STATUS "tensortap: architectures this nvcc does not support, left out: ${_tt_dropped}")
    endif()
  endif()
endmacro()

set(TENSORTAP_HAVE_CUDA_ENGINE OFF)
set(TENSORTAP_HAVE_CUDA OFF)
if(TENSORTAP_WITH_CUDA)
  # LibTorch with CUDA may have looked for the toolkit already.
  if(NOT TARGET CUDA::cudart)
    find_package(CUDAToolkit QUIET)
  endif()
  if(TARGET CUDA::cudart)
    set(TENSORTAP_HAVE_CUDA_ENGINE ON)
  endif()
endif()

if(TENSORTAP_HAVE_CUDA_ENGINE AND TARGET torch_cuda)
  set(TENSORTAP_HAVE_CUDA ON)
  target_sources(tensortap_sdk PRIVATE ${TENSORTAP_CUDA_ENGINE_SOURCES} sdk/src/cuda/capture.cpp)
  target_compile_definitions(tensortap_sdk PRIVATE TENSORTAP_HAVE_CUDA)
  # LibTorch's own name for the runtime, when it has one: a consumer's
  # find_package(Torch) defines it again, CUDA::cudart it may not.
  if(TARGET torch::cudart)
    target_link_libraries(tensortap_sdk PRIVATE torch::cudart)
    target_link_libraries(tensortap PRIVATE torch::cudart)
  else()
    target_link_libraries(tensortap_sdk PRIVATE CUDA::cudart)
    target_link_libraries(tensortap PRIVATE CUDA::cudart)
  endif()
  add_library(tensortap_cuda_engine INTERFACE)
  target_link_libraries(tensortap_cuda_engine INTERFACE tensortap CUDA::cudart)
  message(STATUS "tensortap: CUDA engine on (LibTorch with CUDA, toolkit ${CUDAToolkit_VERSION})")
  # The fused statistics kernels (sdk/src/cuda/stats_kernel.cu): nvcc, no
  # LibTorch headers, objects of the library as the TensorBoard code's are,
  # so no target here has CUDA as a link language (their runtime calls
  # resolve in the libcudart LibTorch links). PyTorch's CMake has enabled
  # CUDA already and adds TORCH_CUDA_ARCH_LIST's architectures to
  # CMAKE_CUDA_FLAGS: the kernels are built for those and ours. Without nvcc
  # (a LibTorch that does not ask for it), statistics of CUDA tensors take
  # ATen's reductions (some 40 kernels a tensor instead of 2).
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # SASS for the H100/H200, and PTX that any later GPU compiles at load.
    set(TENSORTAP_CUDA_ARCHITECTURES "75-virtual;90-real" CACHE STRING
        "CUDA architectures of tensortap's own kernels (CMake's CUDA_ARCHITECTURES syntax)")
    tensortap_cuda_supported_architectures()
    add_library(tensortap_cuda_kernels OBJECT sdk/src/cuda/stats_kernel.cu sdk/src/cuda/batch_kernel.cu)
    set_target_properties(tensortap_cuda_kernels PROPERTIES CUDA_ARCHITECTURES "${TENSORTAP_CUDA_ARCHITECTURES}"
                          CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
    target_include_directories(tensortap_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR})
    target_sources(tensortap PRIVATE $<TARGET_OBJECTS:tensortap_cuda_kernels>)
    target_compile_definitions(tensortap_sdk PRIVATE TENSORTAP_HAVE_FUSED_STATS)
    message(STATUS "tensortap: fused statistics kernels on (${CMAKE_CUDA_COMPILER}, ${TENSORTAP_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "tensortap: no CUDA compiler: statistics of CUDA tensors through ATen's reductions")
  endif()
else()
  target_sources(tensortap_sdk PRIVATE sdk/src/cuda/capture_none.cpp)
  if(TENSORTAP_HAVE_CUDA_ENGINE)
    add_library(tensortap_cuda_engine STATIC ${TENSORTAP_CUDA_ENGINE_SOURCES})
    set_target_properties(tensortap_cuda_engine PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_include_directories(tensortap_cuda_engine PRIVATE ${PROJECT_SOURCE_DIR})
    target_link_libraries(tensortap_cuda_engine PUBLIC tensortap CUDA::cudart)
    tensortap_use_fmt(tensortap_cuda_engine)
    if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
      target_compile_options(tensortap_cuda_engine PRIVATE -Wall -Wextra)
    endif()
    message(STATUS "tensortap: CUDA engine built for its tests only (LibTorch has no CUDA; toolkit ${CUDAToolkit_VERSION})")
  else()
    message(STATUS "tensortap: CUDA toolkit not found: no CUDA engine")
  endif()
endif()
