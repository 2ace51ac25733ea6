#include "transport/connect_mode.h"

#include "common/params.h"
#include "gflow/error.h"

namespace gflow::transport {

bool connectsOnDemand(const ContextOptions& options) {
  const std::string spec = !options.connect.empty() ? options.connect : params::connect();
  if (spec == "all") return false;
  if (spec == "lazy") return true;
  if (spec == "auto") return options.size > kLazyAbove;
  throw Error(ErrorCode::kInvalidArgument,
              "GFLOW_CONNECT='" + spec + "' is not one of all, lazy, auto",
              ErrorContext::forOp("init").withRank(options.rank));
}

}  // namespace gflow::transport
