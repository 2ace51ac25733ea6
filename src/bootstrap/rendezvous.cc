#include "bootstrap/rendezvous.h"

#include <atomic>
#include <cstring>

#include "bootstrap/pmix.h"
#include "common/auth.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
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

// Rank 0 serves the store unless it is served outside the job
// (GFLOW_ROOT_EXTERNAL: gflowrun --elastic, so the store outlives rank 0).
bool servesStore(const Identity& id) {
  return id.rank == 0 && params::rootExternal() == 0;
}

std::shared_ptr<TcpStore> makeStore(const Identity& id, const std::string& host,
                                    std::chrono::milliseconds timeout) {
  TcpStoreOptions so;
  so.host = host;
  so.port = id.rootPort;
  so.isServer = servesStore(id);
  so.token = id.token;
  so.timeout = timeout;
  return std::make_shared<TcpStore>(so);
}

// What rank 0 publishes when it cannot start its store: the others fail at
// once with its reason instead of waiting for their deadline.
constexpr const char* kFailed = "!failed: ";

// Every rank's half of the exchange: takes the store address and the token
// rank 0 offered ("<host:port>\n<token>"), each only where it has none.
// The PMIx server is the launcher's own and is trusted as the launcher is:
// it authenticates its clients itself; the value is still bounded.
void accept(const std::string& offered, Identity* id) {
  if (offered.rfind(kFailed, 0) == 0) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "rank 0 could not start its store: " << offered.substr(std::strlen(kFailed));
  }
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

// Rank 0's half: its store (at the given address, else on the data
// interface at a port the kernel picks) and what it offers the others.
std::shared_ptr<TcpStore> startRoot(Identity* id, const std::string& ifname,
                                    std::chrono::milliseconds timeout, std::string* offered) {
  if (id->token.empty()) id->token = auth::randomToken();
  std::shared_ptr<TcpStore> store;
  if (id->rootHost.empty()) {
    const std::string ip = net::selectInterfaceAddress(ifname);
    store = makeStore(*id, ip, timeout);
    id->rootHost = ip;
    id->rootPort = store->port();
  } else {
    store = makeStore(*id, givenListenHost(*id), timeout);
  }
  *offered = net::joinHostPort(id->rootHost, id->rootPort) + "\n" + id->token;
  return store;
}

}  // namespace

std::shared_ptr<Store> openStore(Identity* id, const std::string& ifname,
                                 std::chrono::milliseconds timeout) {
  if (!id->pmix || params::rootExternal() != 0) {
    if (id->rootHost.empty()) {
      GFLOW_THROW(kInvalidArgument, kCtx.withRank(id->rank))
          << "GFLOW_ROOT_EXTERNAL=1 needs the address of the store served outside the job: set "
             "GFLOW_ROOT=host:port";
    }
    return makeStore(*id, servesStore(*id) ? givenListenHost(*id) : id->rootHost, timeout);
  }
  // Every rank of a PMIx job takes part, whatever it was given itself: the
  // fence is collective, and ranks given different things must not split.
  // Communicators are created in the same order on every rank, so the n-th
  // exchange of each process is the same one.
  static std::atomic<uint64_t> exchanges{0};
  const std::string key = "gflow.rendezvous." + std::to_string(exchanges.fetch_add(1));
  std::shared_ptr<TcpStore> store;
  std::string offered;
  if (id->rank == 0) {
    try {
      store = startRoot(id, ifname, timeout, &offered);
    } catch (const Error& e) {
      try {
        pmix::shareFromRankZero(key, kFailed + std::string(e.what()), timeout);
      } catch (const Error&) {
        // The others time out at the fence; this rank's error is the cause.
      }
      throw;
    }
  }
  accept(pmix::shareFromRankZero(key, offered, timeout), id);
  GFLOW_LOG(DEBUG) << "rank " << id->rank << ": rank 0's store is "
                   << net::joinHostPort(id->rootHost, id->rootPort) << " (shared through PMIx)";
  if (store) return store;
  return makeStore(*id, id->rootHost, timeout);
}

}  // namespace gflow::bootstrap
