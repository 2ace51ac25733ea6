#include "common/check.h"
#include "transport/tcp/tcp_context.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_context.h"

namespace gflow::transport {

std::unique_ptr<Context> createContext(const std::string& transport,
                                       const ContextOptions& options) {
  if (transport.empty() || transport == "tcp") return std::make_unique<tcp::TcpContext>(options);
  if (transport == "verbs") return std::make_unique<verbs::VerbsContext>(options);
  GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init").withRank(options.rank))
      << "unknown transport '" << transport << "' (GFLOW_TRANSPORT); available: tcp, verbs";
}

}  // namespace gflow::transport
