# Precompiled headers (tests/README.md, "Time"): LibTorch's headers are
# parsed once per build tree for the programs that include <torch/torch.h>
# or most of it, not once per unit.
#
# Where they pay was measured, unit by unit, on both LibTorches
# (.ninja_log, a cold build of 2026-11-27):
# - the test program (tests/unit/, Catch and <torch/torch.h>): its units
#   took 423 s of a core against 2.11 and 345 s with the set (43 s to make
#   it), 400 s and 392 s against 1.13, whose headers are smaller;
# - the programs (examples, tests/programs, benchmarks), one set reused by
#   all: 20 s a unit including <torch/torch.h> became 12 s;
# - not the library's parts: most of their units include ATen's core
#   headers only, and a set of ATen cost them more to make and load than it
#   saved (writers 32 s became 45 s, sdk 70 s became 91 s against 2.11).
# Most of a unit's time is code generation, which no header set saves:
# tests/unit/test_tapped.cpp alone takes over two minutes of a core.
#
# A set holds only headers of LibTorch and Catch, never tensortap's, so a
# change to tensortap never rebuilds one. It makes its headers visible to
# every unit of its target: a source that forgot an include would compile
# here, so fmt's include-order check (ctest build.fmt_from_linked), which
# preprocesses every unit, configures with TENSORTAP_PRECOMPILE_HEADERS=OFF,
# and every public header compiles alone (tensortap_header_check, no set).
# A precompiled header is valid only for the flags it was made with (GCC
# checks -fPIC, and macros such as HDF5's, and otherwise parses the headers
# again, warning under -Winvalid-pch, which CMake adds): the programs share
# tensortap_programs_pch's set, which links what they link.
option(TENSORTAP_PRECOMPILE_HEADERS "Precompile LibTorch's headers for the tests, examples and benchmarks" ON)

# The programs: tests, examples and benchmarks include <torch/torch.h> or a
# handful of the torch::nn and optim headers it gathers, and
# <tensortap/tensortap.h>, which includes torch::nn's module headers.
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
