# cmake -DGFLOW_LAYER_ROOT=<dir> -P check_layers.cmake
#
# Fails (exit 1) when a file under <dir>/<layer>/ includes a layer above its
# own, or a header the layer may not use, with one line per offending include:
#   src/x/y.h includes z/w.h: layer x may not include layer z (order: ...)
# Only quoted includes whose first path component is a layer (or gflow/) are
# checked; system headers (<...>) are not. A directory under <dir> that is
# not a layer fails too, so a new layer is added here deliberately.
#
# The rules (issue 16, docs/architecture.md):
# - common(0) < cuda(1) < kernels, bootstrap, topology(2) < transport(3)
#   < backend(4) < core(5) < gradient(6); a layer includes its own rank and
#   below.
# - gflow/communicator.h (the public front door) is not included from
#   common, cuda, kernels, transport or backend.
# - cuda includes only common/ and, of the public headers, gflow/types.h and
#   gflow/error.h.
cmake_minimum_required(VERSION 3.25)

if(NOT GFLOW_LAYER_ROOT OR NOT IS_DIRECTORY "${GFLOW_LAYER_ROOT}")
  message(FATAL_ERROR "check_layers.cmake: set -DGFLOW_LAYER_ROOT=<the src directory>")
endif()

set(_order "common < cuda < kernels, bootstrap, topology < transport < backend < core < gradient")
set(_rank_common 0)
set(_rank_cuda 1)
set(_rank_kernels 2)
set(_rank_bootstrap 2)
set(_rank_topology 2)
set(_rank_transport 3)
set(_rank_backend 4)
set(_rank_core 5)
set(_rank_gradient 6)
set(_no_front_door common cuda kernels transport backend)
set(_cuda_public gflow/types.h gflow/error.h)

get_filename_component(_root "${GFLOW_LAYER_ROOT}" ABSOLUTE)
get_filename_component(_root_name "${_root}" NAME)
file(GLOB_RECURSE _files RELATIVE "${_root}" "${_root}/*.h" "${_root}/*.cc" "${_root}/*.cu")
list(SORT _files)

set(_violations "")
foreach(_file IN LISTS _files)
  string(REGEX MATCH "^[^/]+" _layer "${_file}")
  set(_where "${_root_name}/${_file}")
  if(NOT DEFINED _rank_${_layer})
    list(APPEND _violations "${_where} is in ${_root_name}/${_layer}/, which is not a layer (order: ${_order}), add it to cmake/check_layers.cmake")
    continue()
  endif()
  file(STRINGS "${_root}/${_file}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*$" "\\1" _inc "${_line}")
    string(REGEX MATCH "^[^/]+" _target "${_inc}")
    if(_inc STREQUAL "gflow/communicator.h" AND _layer IN_LIST _no_front_door)
      list(APPEND _violations "${_where} includes ${_inc}: layer ${_layer} may not include the public front door (it is for core and above, shared vocabulary lives in gflow/types.h)")
    elseif(_layer STREQUAL "cuda" AND _target STREQUAL "gflow" AND NOT _inc IN_LIST _cuda_public)
      list(APPEND _violations "${_where} includes ${_inc}: layer cuda may use only gflow/types.h and gflow/error.h of the public headers")
    elseif(DEFINED _rank_${_target} AND _rank_${_target} GREATER _rank_${_layer})
      list(APPEND _violations "${_where} includes ${_inc}: layer ${_layer} may not include layer ${_target} (order: ${_order})")
    endif()
  endforeach()
endforeach()

if(_violations)
  list(LENGTH _violations _n)
  list(JOIN _violations "\n  " _text)
  message(FATAL_ERROR "gflow layer check: ${_n} include(s) against the layer order:\n  ${_text}")
endif()
