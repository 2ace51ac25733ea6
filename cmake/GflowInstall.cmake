# cmake --install: headers, libgflow, a CMake package (find_package(gflow) ->
# gflow::gflow) and a pkg-config file.
include(CMakePackageConfigHelpers)

install(TARGETS gflow EXPORT gflowTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/gflow DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/include/gflow/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gflow)
install(EXPORT gflowTargets NAMESPACE gflow:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)

configure_package_config_file(cmake/gflowConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/gflowConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gflowConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gflowConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/gflowConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)

configure_file(cmake/gflow.pc.in ${CMAKE_CURRENT_BINARY_DIR}/gflow.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gflow.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(GFLOW_BUILD_TOOLS)
  install(TARGETS gflowrun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
