// gflow/process.h: the public face of the process-wide log level and CUDA
// component path, which live in the common and cuda layers.
#include "gflow/process.h"

#include "common/logging.h"
#include "cuda/loader.h"
#include "gflow/error.h"

namespace gflow {

// LogLevel and log::Level list the same levels in the same order.
static_assert(static_cast<int>(LogLevel::kError) == static_cast<int>(log::Level::ERROR) &&
                  static_cast<int>(LogLevel::kTrace) == static_cast<int>(log::Level::TRACE),
              "LogLevel mirrors log::Level");

void setLogLevel(LogLevel level) {
  if (static_cast<int>(level) < 0 || level > LogLevel::kTrace) {
    throw Error(ErrorCode::kInvalidArgument,
                "setLogLevel: invalid level " + std::to_string(static_cast<int>(level)),
                ErrorContext::forOp("setLogLevel"));
  }
  log::setThreshold(static_cast<log::Level>(level));
}

LogLevel logLevel() {
  return static_cast<LogLevel>(log::threshold());
}

void setCudaComponent(const std::string& path) {
  std::string why;
  if (!cuda::setComponentPath(path, &why)) {
    throw Error(ErrorCode::kInvalidArgument, "setCudaComponent('" + path + "'): " + why,
                ErrorContext::forOp("setCudaComponent"));
  }
}

}  // namespace gflow
