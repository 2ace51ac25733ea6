#include "gflow/error.h"

#include <sstream>

namespace gflow {
namespace {

std::string format(ErrorCode code, const std::string& detail, const ErrorContext& ctx) {
  std::ostringstream os;
  os << "gflow " << toString(code) << ": ";
  if (!ctx.op.empty()) {
    os << ctx.op;
    if (ctx.seq != 0) os << " #" << ctx.seq;
    os << " ";
  }
  if (ctx.rank >= 0) os << "on rank " << ctx.rank << " ";
  if (ctx.peer >= 0) os << "(peer " << ctx.peer << ") ";
  if (!ctx.op.empty() || ctx.rank >= 0 || ctx.peer >= 0) os << "- ";
  os << detail;
  return os.str();
}

}  // namespace

const char* toString(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerLost: return "peer_lost";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kUnauthorized: return "unauthorized";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& detail, ErrorContext ctx)
    : std::runtime_error(format(code, detail, ctx)),
      code_(code),
      detail_(detail),
      ctx_(std::move(ctx)) {}

}  // namespace gflow
