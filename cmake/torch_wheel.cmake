# tensortap_torch_wheel_link_options(OUT): the linker options a program
# linking the torch wheel's LibTorch needs. The wheel keeps CUDA's libraries
# in nvidia/*/lib beside torch/ (TORCH_INSTALL_PREFIX): libtorch_cuda.so
# finds them at run time through its own RPATH, but the linker checking an
# executable against it needs them named (-rpath-link), or it reports
# libcudart.so.13 and the rest "not found". Empty for any other LibTorch.
# Used by the build (the tensortap target) and by the installed package
# config, for the LibTorch the consumer found: no path of the machine that
# built tensortap is baked into the package.
function(tensortap_torch_wheel_link_options out)
  set(options "")
  if(DEFINED TORCH_INSTALL_PREFIX AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
    file(GLOB dirs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
    foreach(d IN LISTS dirs)
      if(IS_DIRECTORY "${d}")
        get_filename_component(d "${d}" REALPATH)
        list(APPEND options "LINKER:-rpath-link,${d}")
      endif()
    endforeach()
  endif()
  set(${out} "${options}" PARENT_SCOPE)
endfunction()
