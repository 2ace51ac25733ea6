# Warnings (-Werror by default) and sanitizers for every gflow target.
function(gflow_set_warnings target)
  # Clang checks the thread annotations (src/common/thread_annotations.h).
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wnon-virtual-dtor
    $<$<CXX_COMPILER_ID:GNU>:-Wshadow=local> $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety>)
  # GCC 12 with sanitizers at -O1 and above warns "may be used
  # uninitialized" inside libstdc++'s <regex> (the sanitizers' instrumentation
  # defeats its flow analysis); the unsanitized builds keep the warning.
  if(GFLOW_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
  endif()
  if(GFLOW_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

if(GFLOW_SANITIZE)
  string(REPLACE "," ";" _gflow_sans "${GFLOW_SANITIZE}")
  foreach(s ${_gflow_sans})
    add_compile_options(-fsanitize=${s})
    add_link_options(-fsanitize=${s})
  endforeach()
  add_compile_options(-fno-omit-frame-pointer -fno-sanitize-recover=undefined)
endif()
