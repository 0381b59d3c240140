# The fmt tensortap compiles against must be the fmt it links: a header of
# one version and a library of another fail at link or at run time. PyTorch's wheels install fmt headers of their own in
# torch/include/fmt (a header-only fmt of another major version, used
# privately by libtorch, which exports none of its symbols). That folder is
# in the `torch` target's include directories, and so on every command line
# that links torch; where it comes before the found fmt's folder, tensortap
# would compile against torch's headers and link the found libfmt: undefined
# fmt::vN symbols, or two fmts mixed. Ordering target_link_libraries() cannot
# fix this: imported include directories are passed as -isystem, and GCC
# drops an -I or -isystem for a folder that is a system folder already
# (/usr/include, where Debian's fmt lives), so the system fmt is searched
# last whatever the order.
#
# So: a folder in the build tree that holds only a link named `fmt` to the
# found fmt's headers, put first (BEFORE) as a plain -I, which the compiler
# searches before every -isystem. LibTorch's public headers (torch/torch.h,
# ATen, c10) include no fmt header in 1.13 or 2.x; only c10d's logging and
# the Python bindings do, which tensortap's own sources do not include.
# Programs that use no fmt themselves (the examples) keep torch's order:
# for them torch's headers should see torch's fmt.
#
# tests/build/check_fmt_order.py (ctest build.fmt_from_linked) proves it with a
# torch whose include folder holds a poisoned fmt/.

set(TENSORTAP_FMT_INCLUDE ${PROJECT_BINARY_DIR}/fmt_include)

# The found fmt's header folder: the entry of fmt::fmt's include
# directories that holds fmt/core.h (an installed fmt's, or the source tree's
# of an fmt built by add_subdirectory, inside $<BUILD_INTERFACE:...>).
get_target_property(_tensortap_fmt_dirs fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
set(_tensortap_fmt_headers "")
foreach(_dir IN LISTS _tensortap_fmt_dirs)
  string(REGEX REPLACE "^\\$<BUILD_INTERFACE:(.*)>$" "\\1" _dir "${_dir}")
  if(NOT _dir MATCHES "^\\$<" AND EXISTS "${_dir}/fmt/core.h")
    set(_tensortap_fmt_headers "${_dir}/fmt")
    break()
  endif()
endforeach()
if(NOT _tensortap_fmt_headers)
  message(FATAL_ERROR "tensortap: no fmt/core.h in fmt::fmt's include directories (${_tensortap_fmt_dirs}); "
                      "fmt_DIR is ${fmt_DIR}")
endif()

file(MAKE_DIRECTORY ${TENSORTAP_FMT_INCLUDE})
# Replaced when a reconfigure finds another fmt.
set(_tensortap_fmt_link "")
if(IS_SYMLINK ${TENSORTAP_FMT_INCLUDE}/fmt)
  file(READ_SYMLINK ${TENSORTAP_FMT_INCLUDE}/fmt _tensortap_fmt_link)
endif()
if(NOT _tensortap_fmt_link STREQUAL _tensortap_fmt_headers)
  file(REMOVE ${TENSORTAP_FMT_INCLUDE}/fmt)
  file(CREATE_LINK ${_tensortap_fmt_headers} ${TENSORTAP_FMT_INCLUDE}/fmt SYMBOLIC)
endif()
message(STATUS "tensortap: compiling against fmt ${fmt_VERSION} (${_tensortap_fmt_headers})")

# Compiles `target` against the found fmt, ahead of any other fmt on its
# include path, and links it.
function(tensortap_use_fmt target)
  target_include_directories(${target} BEFORE PRIVATE ${TENSORTAP_FMT_INCLUDE})
  target_link_libraries(${target} PRIVATE fmt::fmt)
endfunction()
