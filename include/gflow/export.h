// Symbol visibility for libgflow. The library is built with hidden visibility;
// only declarations marked GFLOW_EXPORT form the ABI.
#pragma once

#if defined(_WIN32)
#define GFLOW_EXPORT
#else
#define GFLOW_EXPORT __attribute__((visibility("default")))
#endif
