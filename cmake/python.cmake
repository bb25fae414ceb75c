# Finds what the Python package needs (an interpreter whose `import torch` is this LibTorch,
# pybind11, libtorch_python) and adds it: the extension pipetrain._C and the package's Python
# files, assembled in <build>/python/pipetrain so that PYTHONPATH=<build>/python imports it.
#
# The interpreter: PIPETRAIN_PYTHON_EXECUTABLE, else /usr/bin/python3, else python3 on PATH.
# Debian's python3-torch is built on the same libtorch as libtorch-dev, so its tensors are this
# library's tensors; a pyenv Python on PATH usually has no torch (or another one).
set(_why "")
if(NOT PIPETRAIN_PYTHON_EXECUTABLE)
  find_program(PIPETRAIN_PYTHON_EXECUTABLE NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  find_program(PIPETRAIN_PYTHON_EXECUTABLE NAMES python3)
endif()
if(PIPETRAIN_PYTHON_EXECUTABLE)
  execute_process(
    COMMAND ${PIPETRAIN_PYTHON_EXECUTABLE} -c "import torch, os, sysconfig; print(torch.__version__.split('+')[0]); print(os.path.realpath(os.path.join(os.path.dirname(torch.__file__), 'lib'))); print(sysconfig.get_path('platlib'))"
    OUTPUT_VARIABLE _probe RESULT_VARIABLE _rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_rc EQUAL 0)
    string(REPLACE "\n" ";" _probe "${_probe}")
    list(GET _probe 0 PIPETRAIN_PYTHON_TORCH_VERSION)
    list(GET _probe 1 _torch_lib_dir)
    list(GET _probe 2 PIPETRAIN_PYTHON_PLATLIB)
    # Major.minor only: Debian's TorchConfigVersion says 1.13.0 for its torch 1.13.1.
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _py_mm "${PIPETRAIN_PYTHON_TORCH_VERSION}")
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _lib_mm "${Torch_VERSION}")
    if(_lib_mm AND NOT _lib_mm VERSION_EQUAL _py_mm)
      set(_why "${PIPETRAIN_PYTHON_EXECUTABLE} has torch ${PIPETRAIN_PYTHON_TORCH_VERSION} but the build uses LibTorch ${Torch_VERSION}")
    endif()
  else()
    set(_why "${PIPETRAIN_PYTHON_EXECUTABLE} cannot import torch (install python3-torch)")
  endif()
else()
  set(_why "no python3 found")
endif()
if(NOT _why)
  find_library(PIPETRAIN_TORCH_PYTHON_LIBRARY torch_python HINTS ${_torch_lib_dir} ${TORCH_INSTALL_PREFIX}/lib)
  if(NOT PIPETRAIN_TORCH_PYTHON_LIBRARY)
    set(_why "libtorch_python not found beside ${_torch_lib_dir}")
  endif()
endif()
if(NOT _why)
  set(PYTHON_EXECUTABLE ${PIPETRAIN_PYTHON_EXECUTABLE})  # pybind11's FindPythonLibsNew takes this one
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    set(_why "pybind11 not found (install pybind11-dev)")
  endif()
endif()
if(_why)
  if(PIPETRAIN_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "pipetrain: the Python package cannot be built: ${_why}; or configure with -DPIPETRAIN_PYTHON=OFF")
  endif()
  message(STATUS "pipetrain: Python package off: ${_why}")
  return()
endif()
message(STATUS "pipetrain: Python package on (${PIPETRAIN_PYTHON_EXECUTABLE}, torch ${PIPETRAIN_PYTHON_TORCH_VERSION})")

set(PIPETRAIN_PYTHON_DIR ${CMAKE_BINARY_DIR}/python)
file(GLOB PIPETRAIN_PYTHON_BINDINGS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/python/*.cpp)
# NO_EXTRAS: no link-time optimisation, which costs minutes on two cores for nothing measurable here.
pybind11_add_module(pipetrain_python MODULE NO_EXTRAS ${PIPETRAIN_PYTHON_BINDINGS})
set_target_properties(pipetrain_python PROPERTIES
  OUTPUT_NAME _C
  LIBRARY_OUTPUT_DIRECTORY ${PIPETRAIN_PYTHON_DIR}/pipetrain
  # Installed beside libpipetrain (pip install copies it into the package) or under the prefix.
  INSTALL_RPATH "$ORIGIN;${CMAKE_INSTALL_FULL_LIBDIR}"
  # pip install copies the extension and libpipetrain.so.0 side by side.
  BUILD_RPATH "$ORIGIN")
target_include_directories(pipetrain_python PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(pipetrain_python PRIVATE pipetrain ${PIPETRAIN_TORCH_PYTHON_LIBRARY} fmt::fmt nlohmann_json::nlohmann_json)
# Its own precompiled header: pybind11 compiles with -fvisibility=hidden, which the shared one
# was not built with.
target_precompile_headers(pipetrain_python PRIVATE <torch/extension.h> <vector> <string> <memory>)

# The package's Python files, copied beside the extension.
file(GLOB_RECURSE _py_files RELATIVE ${CMAKE_SOURCE_DIR}/python CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/pipetrain/*.py)
set(_py_outputs "")
foreach(f ${_py_files})
  add_custom_command(OUTPUT ${PIPETRAIN_PYTHON_DIR}/${f}
    COMMAND ${CMAKE_COMMAND} -E copy_if_different ${CMAKE_SOURCE_DIR}/python/${f} ${PIPETRAIN_PYTHON_DIR}/${f}
    DEPENDS ${CMAKE_SOURCE_DIR}/python/${f} VERBATIM)
  list(APPEND _py_outputs ${PIPETRAIN_PYTHON_DIR}/${f})
endforeach()
add_custom_target(pipetrain_python_files ALL DEPENDS ${_py_outputs})
add_dependencies(pipetrain_python pipetrain_python_files)

# cmake --install: the package into <prefix>/lib/python3/dist-packages (on Debian's sys.path for
# the prefix /usr/local; PIPETRAIN_PYTHON_INSTALL_DIR chooses another place).
set(PIPETRAIN_PYTHON_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/python3/dist-packages CACHE STRING
    "Where cmake --install puts the pipetrain Python package (relative to the prefix, or absolute)")
install(TARGETS pipetrain_python LIBRARY DESTINATION ${PIPETRAIN_PYTHON_INSTALL_DIR}/pipetrain)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/python/pipetrain DESTINATION ${PIPETRAIN_PYTHON_INSTALL_DIR}
        FILES_MATCHING PATTERN "*.py")
set(PIPETRAIN_HAS_PYTHON ON)
