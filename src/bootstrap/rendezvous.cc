#include "bootstrap/rendezvous.h"

#include <atomic>

#include "bootstrap/pmix.h"
#include "common/auth.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/socket.h"

namespace gflow::bootstrap {
namespace {

const ErrorContext kCtx = ErrorContext::forOp("bootstrap");
constexpr size_t kMaxTokenChars = 1024;

// Where rank 0's store listens when its address was given. With a token,
// every interface (a hostname may resolve to a loopback alias such as
// Debian's 127.0.1.1 on rank 0 and to its network address elsewhere); the
// token keeps strangers out. Without one, only the address the root name
// resolves to here, unless that is such an alias (then every interface; the
// job warns that it has no token).
std::string givenListenHost(const Identity& id) {
  const bool v6 = id.rootHost.find(':') != std::string::npos;
  const std::string any = v6 ? "::" : "0.0.0.0";
  if (!id.token.empty()) return any;
  const std::string ip = net::resolveAddress(id.rootHost);
  return ip.empty() || (ip.rfind("127.", 0) == 0 && ip != "127.0.0.1") ? any : ip;
}

std::shared_ptr<TcpStore> makeStore(const Identity& id, const std::string& host,
                                    std::chrono::milliseconds timeout) {
  TcpStoreOptions so;
  so.host = host;
  so.port = id.rootPort;
  so.isServer = id.rank == 0;
  so.token = id.token;
  so.timeout = timeout;
  return std::make_shared<TcpStore>(so);
}

// Rank 0's half of the PMIx exchange: what is missing from `id`, as
// "<host:port>\n<token>" (an empty line for what was given).
std::string offer(Identity* id, const std::string& storeAddress) {
  return (id->rootHost.empty() ? storeAddress : std::string()) + "\n" + id->token;
}

// Every rank's half: takes the root address and token rank 0 offered.
void accept(const std::string& offered, Identity* id) {
  const size_t nl = offered.find('\n');
  const std::string root = nl == std::string::npos ? offered : offered.substr(0, nl);
  const std::string token = nl == std::string::npos ? "" : offered.substr(nl + 1);
  if (id->rootHost.empty()) {
    auto hp = net::parseHostPort(root, "rank 0's store address from the PMIx server");
    id->rootHost = hp.first;
    id->rootPort = hp.second;
  }
  if (id->token.empty()) {
    if (token.empty() || token.size() > kMaxTokenChars) {
      GFLOW_THROW(kInvalidArgument, kCtx)
          << "the job token from the PMIx server is empty or longer than " << kMaxTokenChars
          << " characters";
    }
    id->token = token;
  }
}

}  // namespace

std::shared_ptr<Store> openStore(Identity* id, const std::string& ifname,
                                 std::chrono::milliseconds timeout) {
  const bool exchange = id->pmix && (id->rootHost.empty() || id->token.empty());
  if (!exchange) {
    return makeStore(*id, id->rank == 0 ? givenListenHost(*id) : id->rootHost, timeout);
  }
  // Communicators are created in the same order on every rank, so the n-th
  // exchange of each process is the same one.
  static std::atomic<uint64_t> exchanges{0};
  const std::string key = "gflow.rendezvous." + std::to_string(exchanges.fetch_add(1));
  std::shared_ptr<TcpStore> store;
  std::string offered;
  if (id->rank == 0) {
    if (id->token.empty()) id->token = auth::randomToken();
    std::string ip;
    if (id->rootHost.empty()) {
      ip = net::selectInterfaceAddress(ifname);
      store = makeStore(*id, ip, timeout);
    }
    offered = offer(id, net::joinHostPort(ip, store ? store->port() : 0));
  }
  accept(pmix::shareFromRankZero(key, offered, timeout), id);
  GFLOW_LOG(DEBUG) << "rank " << id->rank << ": rank 0's store is " << id->rootHost << ":"
                   << id->rootPort << " (shared through PMIx)";
  if (store) return store;
  return makeStore(*id, id->rank == 0 ? givenListenHost(*id) : id->rootHost, timeout);
}

}  // namespace gflow::bootstrap
