# The PMIx bootstrap (src/bootstrap/pmix.cc) is compiled against <pmix.h>
# for its types; libpmix itself is dlopened at run time, so only the header
# is a build dependency. Debian installs it under a versioned directory that
# pkg-config names; other distributions put it in the default include path.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(GFLOW_PMIX_PC QUIET pmix)
endif()
find_path(GFLOW_PMIX_INCLUDE_DIR pmix.h
  HINTS ${GFLOW_PMIX_PC_INCLUDE_DIRS}
  PATHS /usr/lib/x86_64-linux-gnu/pmix2/include /usr/lib/aarch64-linux-gnu/pmix2/include
        /usr/include/pmix /opt/pmix/include)
if(NOT GFLOW_PMIX_INCLUDE_DIR)
  message(FATAL_ERROR "gflow needs PMIx's <pmix.h> to build its PMIx bootstrap (the library "
                      "itself is loaded at run time only): install libpmix-dev (Debian/Ubuntu) "
                      "or pmix-devel (Fedora/RHEL)")
endif()
