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
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/device.cpp
  ${PROJECT_SOURCE_DIR}/sdk/src/cuda/pinned.cpp)

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
    add_library(tensortap_cuda_kernels OBJECT sdk/src/cuda/stats_kernel.cu)
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
