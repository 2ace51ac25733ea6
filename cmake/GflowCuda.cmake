# CUDA kernels and the NCCL backend (issue 7), built into a separate shared
# library, libgflow_cuda.so, that libgflow loads with dlopen only when a
# device tensor appears: libgflow itself never links the CUDA runtime or
# NCCL, so it loads and runs CPU work on machines without a GPU driver.
#
#   GFLOW_WITH_CUDA = AUTO | ON | OFF   (AUTO: build it when nvcc is found)
#   GFLOW_WITH_NCCL = AUTO | ON | OFF   (AUTO: with CUDA, when NCCL is found)
#
# NCCL ships no CMake config: it is found with find_path/find_library under
# the CUDA toolkit (/usr/local/cuda on these machines) or NCCL_ROOT.
set(GFLOW_WITH_CUDA "AUTO" CACHE STRING "Build the CUDA kernels component: AUTO, ON or OFF")
set(GFLOW_WITH_NCCL "AUTO" CACHE STRING "Build the NCCL backend (needs CUDA): AUTO, ON or OFF")
set_property(CACHE GFLOW_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set_property(CACHE GFLOW_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)

set(GFLOW_HAVE_CUDA OFF)
set(GFLOW_HAVE_NCCL OFF)

# Sanitizer builds instrument host code only; device code and the CUDA
# runtime do not mix with them, so AUTO means OFF there.
set(_gflow_cuda_wanted ${GFLOW_WITH_CUDA})
if(_gflow_cuda_wanted STREQUAL "AUTO" AND GFLOW_SANITIZE)
  set(_gflow_cuda_wanted OFF)
endif()

if(NOT _gflow_cuda_wanted STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # A100 (sm_80) and H100/H200 (sm_90), plus PTX for newer GPUs.
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(GFLOW_HAVE_CUDA ON)
  elseif(_gflow_cuda_wanted STREQUAL "ON")
    message(FATAL_ERROR "GFLOW_WITH_CUDA=ON but no CUDA compiler (nvcc) was found; "
                        "set CMAKE_CUDA_COMPILER or install the CUDA toolkit")
  else()
    message(STATUS "gflow: nvcc not found; CUDA kernels and the NCCL backend are not built")
  endif()
endif()

if(GFLOW_HAVE_CUDA AND NOT GFLOW_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(GFLOW_HAVE_NCCL ON)
    message(STATUS "gflow: NCCL ${NCCL_LIBRARY}")
  elseif(GFLOW_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "GFLOW_WITH_NCCL=ON but nccl.h / libnccl were not found (set NCCL_ROOT)")
  else()
    message(STATUS "gflow: NCCL not found; the NCCL backend is not built")
  endif()
elseif(GFLOW_WITH_NCCL STREQUAL "ON" AND NOT GFLOW_HAVE_CUDA)
  message(FATAL_ERROR "GFLOW_WITH_NCCL=ON needs CUDA (GFLOW_WITH_CUDA)")
endif()
