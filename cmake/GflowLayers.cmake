# The layer order of src/ (docs/architecture.md), enforced at build time:
# gflow_add_layer_check(<target> <src dir>) adds a target that scans every
# .h/.cc/.cu under <src dir> for `#include "<layer>/..."` lines and fails the
# build, naming each file, when one includes a layer above its own. The
# library targets depend on it, so an upward include fails `ninja` before a
# single object is compiled. The rules themselves are in
# cmake/check_layers.cmake (a `cmake -P` script: no Python needed), which
# tests/CMakeLists.txt also runs on small fake trees to show that it fails.
set(GFLOW_LAYER_CHECK_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/check_layers.cmake)

function(gflow_add_layer_check target src_dir)
  # Always runs (a scan of a few hundred files takes well under a second),
  # so a new file or include is checked without re-running CMake.
  add_custom_target(${target}
    COMMAND ${CMAKE_COMMAND} -DGFLOW_LAYER_ROOT=${src_dir} -P ${GFLOW_LAYER_CHECK_SCRIPT}
    COMMENT "Checking the layer order of the includes under ${src_dir}"
    VERBATIM)
endfunction()
