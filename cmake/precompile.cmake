# Precompiled headers (tests/README.md, "Time"). LibTorch's headers are most
# of every unit's compile time: a unit that includes <torch/torch.h> spends
# 12-20 s of its compile on them, one of the library's 2-10 s. Each header
# set below is compiled once per build tree, and the targets that include
# those headers load it instead of parsing them again.
#
# What a set holds: only headers of LibTorch (and Catch), never
# tensortap's own, so a change to tensortap never rebuilds one; and only
# headers the target's sources really include (ARCHITECTURE.md's parts
# include ATen, not torch/torch.h). A set makes its headers visible to every
# unit of the target, so a source that forgets an include still compiles
# here: the units of the library are compiled without them by ctest
# consumer.cxx20 (TENSORTAP_PRECOMPILE_HEADERS=OFF), and every public
# header alone by tensortap_header_check, which never uses one.
#
# A precompiled header is only valid for the flags it was built with (GCC
# checks -fPIC among them and silently parses the headers instead, warning
# under -Winvalid-pch, which CMake adds), so the library's PIC objects and
# the programs have sets of their own: a program reuses
# tensortap_programs_pch's (REUSE_FROM), built once.
option(TENSORTAP_PRECOMPILE_HEADERS "Precompile LibTorch's headers for the library, tests, examples and benchmarks"
       ON)

# The library's parts: ATen (writers/, sdk/), and for hooks/ the torch::nn
# headers that tap.h and watch.h include.
set(TENSORTAP_PCH_LIBRARY <ATen/ATen.h>)
# (1.13's instancenorm.h does not include the functional header it uses:
# tap.h includes it first, and so does this list.)
set(TENSORTAP_PCH_HOOKS <ATen/ATen.h> <torch/nn/module.h> <torch/nn/cloneable.h>
    <torch/nn/modules/container/sequential.h> <torch/nn/functional/instancenorm.h> <torch/nn/modules/batchnorm.h>
    <torch/nn/modules/instancenorm.h>)
# Programs: tests, examples and benchmarks include <torch/torch.h> or a
# handful of the torch::nn and optim headers it gathers, and
# <tensortap/tensortap.h>, which includes the torch::nn ones above.
set(TENSORTAP_PCH_PROGRAMS <torch/torch.h>)

# tensortap_precompile(TARGET HEADERS...): TARGET's own set.
function(tensortap_precompile target)
  if(TENSORTAP_PRECOMPILE_HEADERS)
    target_precompile_headers(${target} PRIVATE ${ARGN})
  endif()
endfunction()

# tensortap_precompiled(TARGET...): each program reuses the programs' set,
# tensortap_programs_pch's, made at the first call: it links the library,
# as the programs do, so its flags are theirs.
function(tensortap_precompiled)
  if(NOT TENSORTAP_PRECOMPILE_HEADERS)
    return()
  endif()
  if(NOT TARGET tensortap_programs_pch)
    file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/programs_pch.cpp
         CONTENT "// The programs' precompiled headers (cmake/precompile.cmake).\n")
    add_library(tensortap_programs_pch OBJECT ${PROJECT_BINARY_DIR}/programs_pch.cpp)
    target_link_libraries(tensortap_programs_pch PRIVATE tensortap::tensortap)
    target_precompile_headers(tensortap_programs_pch PRIVATE ${TENSORTAP_PCH_PROGRAMS})
  endif()
  foreach(_target IN LISTS ARGN)
    target_precompile_headers(${_target} REUSE_FROM tensortap_programs_pch)
  endforeach()
endfunction()
