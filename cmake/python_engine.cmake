# tensortap._engine (sdk/python/engine.cpp): the C++ recorder for Python,
# tensortap.torch.watch(..., engine="native"). Built against a torch wheel's
# LibTorch, with its pybind11 and libtorch_python, for the interpreter that
# has NumPy (TENSORTAP_PYTHON, whose headers Debian's python3-dev installs),
# into ${PROJECT_BINARY_DIR}/python/tensortap/: the package's __init__
# extends its path to it (the tests put ${PROJECT_BINARY_DIR}/python on
# PYTHONPATH). Not with Debian's LibTorch 1.13, which has no Python side.
# `pip install ./python` configures this project for it too (python/setup.py:
# the library and this target only), and copies the module into the package.
option(TENSORTAP_BUILD_PYTHON_ENGINE "Build tensortap._engine where LibTorch is a torch wheel's" ON)
set(TENSORTAP_HAVE_PYTHON_ENGINE OFF)
if(TENSORTAP_BUILD_PYTHON_ENGINE AND DEFINED TORCH_INSTALL_PREFIX
   AND EXISTS "${TORCH_INSTALL_PREFIX}/lib/libtorch_python.so" AND TENSORTAP_PYTHON)
  set(Python3_EXECUTABLE ${TENSORTAP_PYTHON})
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  if(Python3_Development.Module_FOUND)
    set(TENSORTAP_HAVE_PYTHON_ENGINE ON)
    add_library(tensortap_python_engine MODULE sdk/python/engine.cpp)
    # The internal headers it calls (the front end, the option table).
    target_include_directories(tensortap_python_engine PRIVATE ${PROJECT_SOURCE_DIR} ${Python3_INCLUDE_DIRS})
    target_link_libraries(tensortap_python_engine PRIVATE tensortap "${TORCH_INSTALL_PREFIX}/lib/libtorch_python.so")
    tensortap_use_fmt(tensortap_python_engine)
    # torch/extension.h's module name; the wheel's pybind11 ABI tag.
    target_compile_definitions(tensortap_python_engine PRIVATE TORCH_EXTENSION_NAME=_engine)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
                    OUTPUT_VARIABLE _tensortap_ext_suffix OUTPUT_STRIP_TRAILING_WHITESPACE)
    set_target_properties(tensortap_python_engine PROPERTIES
      PREFIX "" OUTPUT_NAME _engine SUFFIX "${_tensortap_ext_suffix}"
      LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/python/tensortap
      # It finds LibTorch in a torch package installed beside it (a
      # site-packages that `pip install ./python` put it in), else where the
      # torch it was built against is. Only before torch is imported: after,
      # LibTorch's libraries are loaded already.
      BUILD_RPATH "$ORIGIN/../torch/lib;${TORCH_INSTALL_PREFIX}/lib")
    message(STATUS "tensortap: tensortap._engine for ${Python3_EXECUTABLE} (${Python3_VERSION})")
  else()
    message(STATUS "tensortap: no tensortap._engine: no Python headers for ${TENSORTAP_PYTHON} (python3-dev)")
  endif()
endif()
