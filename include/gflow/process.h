// Process-wide settings: the two that cannot be per communicator, because
// every communicator of the process shares them. Each replaces its GFLOW_*
// variable (docs/configuration.md). Thread-safe.
#pragma once

#include <string>

#include "gflow/export.h"

namespace gflow {

enum class LogLevel { kError, kWarn, kInfo, kDebug, kTrace };

// The level of gflow's log lines on stderr, replacing GFLOW_DEBUG (default
// WARN). Takes effect at once, for every communicator of the process.
GFLOW_EXPORT void setLogLevel(LogLevel level);
GFLOW_EXPORT LogLevel logLevel();

// The path of gflow's CUDA component (libgflow_cuda.so.0), replacing
// GFLOW_CUDA_PLUGIN. The component is loaded once per process, when an op
// first meets a device tensor; call this before that. Throws
// Error(kInvalidArgument) once the load has happened (or was tried), since
// the new path could no longer take effect.
GFLOW_EXPORT void setCudaComponent(const std::string& path);

}  // namespace gflow
