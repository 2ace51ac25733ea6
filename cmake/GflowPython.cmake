# Finds what the Python package needs (python/CMakeLists.txt):
#   GFLOW_HAVE_PYTHON: pybind11 + the headers of the interpreter that
#                      find_package(Python) picks (the _gflow module);
#   GFLOW_HAVE_TORCH:  also libtorch with TorchConfig.cmake and libtorch_python
#                      (the _gflow_torch module, the torch.distributed backend).
# GFLOW_BUILD_PYTHON / GFLOW_BUILD_TORCH: AUTO (build what is found), ON
# (fail when missing) or OFF.
set(GFLOW_HAVE_PYTHON OFF)
set(GFLOW_HAVE_TORCH OFF)
# The interpreter: -DPython_EXECUTABLE=... picks one; by default Debian's
# /usr/bin/python3, where its python3-dev and libtorch live, rather than
# whichever python3 is first on PATH (often a virtual environment without
# them).
if(NOT GFLOW_BUILD_PYTHON STREQUAL "OFF")
  if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter for the Python package")
  endif()
  set(PYBIND11_FINDPYTHON ON)
  find_package(Python COMPONENTS Interpreter Development.Module QUIET)
  if(Python_FOUND)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python_FOUND AND pybind11_FOUND)
    set(GFLOW_HAVE_PYTHON ON)
    message(STATUS "gflow: Python package for ${Python_EXECUTABLE} (${Python_VERSION}), "
                   "pybind11 ${pybind11_VERSION}")
  elseif(GFLOW_BUILD_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "GFLOW_BUILD_PYTHON=ON needs pybind11 (pybind11-dev) and the headers "
                        "of ${Python_EXECUTABLE} (python3-dev)")
  else()
    message(STATUS "gflow: no Python package (pybind11-dev or python3-dev missing)")
  endif()
endif()

if(GFLOW_HAVE_PYTHON AND NOT GFLOW_BUILD_TORCH STREQUAL "OFF")
  find_package(Torch CONFIG QUIET)
  if(Torch_FOUND)
    find_library(GFLOW_TORCH_PYTHON_LIBRARY torch_python HINTS "${TORCH_INSTALL_PREFIX}/lib")
  endif()
  if(Torch_FOUND AND GFLOW_TORCH_PYTHON_LIBRARY)
    set(GFLOW_HAVE_TORCH ON)
    message(STATUS "gflow: torch.distributed backend against libtorch ${Torch_VERSION}")
    # As torch.utils.cpp_extension does: the pybind11 ABI identity torch was
    # built with, so that _gflow_torch shares pybind11's type registry with
    # torch (its Backend/ProcessGroup and Store types) even when torch came
    # from pip, built by another compiler. The C++ ABI flag comes with
    # TORCH_CXX_FLAGS.
    execute_process(
      COMMAND ${Python_EXECUTABLE} -c
              "import torch; print(';'.join(getattr(torch._C, '_PYBIND11_' + k) for k in ('COMPILER_TYPE', 'STDLIB', 'BUILD_ABI')))"
      OUTPUT_VARIABLE _gflow_pybind_abi RESULT_VARIABLE _gflow_pybind_rc
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set(GFLOW_TORCH_PYBIND_DEFINITIONS "")
    if(_gflow_pybind_rc EQUAL 0)
      list(LENGTH _gflow_pybind_abi _gflow_pybind_n)
      if(_gflow_pybind_n EQUAL 3)
        list(GET _gflow_pybind_abi 0 _c)
        list(GET _gflow_pybind_abi 1 _s)
        list(GET _gflow_pybind_abi 2 _a)
        set(GFLOW_TORCH_PYBIND_DEFINITIONS PYBIND11_COMPILER_TYPE="${_c}" PYBIND11_STDLIB="${_s}"
                                           PYBIND11_BUILD_ABI="${_a}")
      endif()
    endif()
  elseif(GFLOW_BUILD_TORCH STREQUAL "ON")
    message(FATAL_ERROR "GFLOW_BUILD_TORCH=ON needs libtorch-dev (TorchConfig.cmake, "
                        "libtorch_python)")
  else()
    message(STATUS "gflow: no torch.distributed backend (libtorch-dev not found)")
  endif()
endif()
