# The verbs transport (src/transport/verbs) is compiled against rdma-core's
# <infiniband/verbs.h> for its types; libibverbs itself is dlopened at run
# time (verbs_api.cc), so only the header is a build dependency. Checked here
# so that a machine without it fails at configure time with the package to
# install, instead of in the middle of the build.
include(CheckIncludeFileCXX)
check_include_file_cxx(infiniband/verbs.h GFLOW_HAVE_VERBS_H)
if(NOT GFLOW_HAVE_VERBS_H)
  message(FATAL_ERROR "gflow needs rdma-core's <infiniband/verbs.h> to build its verbs "
                      "transport (the library itself is loaded at run time only): install "
                      "libibverbs-dev (Debian/Ubuntu) or rdma-core-devel (Fedora/RHEL)")
endif()
