// Connections of the TCP transport. Every rank listens and publishes its
// address in the store; then either it connects to every peer at init (it
// dials the lower ranks and accepts the higher ones), or, with connections
// on demand, a pair connects when one of its ranks first needs the other,
// under the op's deadline (GFLOW_CONNECT; inbound.h has the rule that
// settles a pair whose ranks dial each other at once). Every connection is
// authenticated (job token) and then identifies itself with a Hello;
// strangers, wrong tokens and malformed hellos are logged and dropped
// without disturbing anything (net::HandshakeAcceptor runs each inbound
// handshake on its own thread under a deadline).
//
// What proves each claim a peer makes here (docs/errors.md, Security):
//   - the token: the HMAC challenge (auth.h), on every connection;
//   - the Hello's rank, size, communicator and socket index: the token
//     only; they must fit this rank's view, and each (rank, socket) slot is
//     taken once, so a token holder that takes a free slot gets the real
//     rank refused and the setup fails naming it;
//   - everything about a local link (its identity, that it reads this
//     rank, its ring): the link's agreement on socket 0 (local/host.h),
//     which decides per peer whether there is a link at all.
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/check.h"
#include "common/fd_limit.h"
#include "common/handshake_acceptor.h"
#include "common/logging.h"
#include "common/params.h"
#include "transport/contract.h"
#include "transport/tcp/congestion.h"
#include "transport/tcp/tcp_context.h"

namespace gflow::transport::tcp {
namespace {

constexpr const char* kAuthLabel = "gflow-data/v1";
// A connection that does not finish authentication in this time is dropped
// so a silent stranger cannot stall the setup.
constexpr std::chrono::milliseconds kHandshakeTimeout{10000};
constexpr size_t kMaxPendingHandshakes = 64;
// A rank dials only addresses that every rank has published, which each
// does once it listens: a refused connection is a peer that has gone,
// retried this long (a slow one, behind a full listen backlog, waits for
// the deadline).
constexpr std::chrono::milliseconds kRefusedRetry{2000};
// A rank whose dial was crossed waits this long for the peer's, then dials
// again.
constexpr std::chrono::milliseconds kRedial{1000};

// Listens on the chosen interface and publishes "host:port" in the store.
// The congestion control is set on the listener, before any peer can
// connect: accepted sockets inherit it from the start (congestion.h).
net::Socket listenAndPublish(const ContextOptions& options, int rank,
                             CongestionChoice& congestion) {
  const std::string ifname =
      !options.tcp.socketIfname.empty() ? options.tcp.socketIfname : params::socketIfname();
  const std::string range =
      !options.tcp.portRange.empty() ? options.tcp.portRange : params::portRange();
  std::string ip = net::selectInterfaceAddress(ifname);
  uint16_t port = 0;
  net::Socket listener = net::listenOn(ip, net::parsePortRange(range), &port);
  congestion.apply(listener.fd(), rank);
  const std::string hostPort = net::joinHostPort(ip, port);
  options.store->setString(options.prefix + "tcp/addr/" + std::to_string(rank), hostPort);
  GFLOW_LOG(DEBUG) << "rank " << rank << " listens on " << hostPort;
  return listener;
}

// Connection `index` to a peer: its socket (invalid when crossed: the peer
// dials this rank instead, inbound.h), and its local link (null: none;
// socket 0 only).
struct Dialed {
  net::Socket sock;
  std::unique_ptr<local::Link> link;
};

// What every connection this rank dials shares.
struct Dialer {
  Identity me;
  const std::string& token;
  int bufBytes;
  CongestionChoice& congestion;
  Deadline deadline;
  Deadline refusedBy;  // a refusal after it is final
  ErrorContext ctx;    // the op it connects for
};

// Connection `index` to `peer` at host:port, authenticated and accepted by
// the peer's Hello check (or crossed).
Dialed dial(const Dialer& dialer, const std::pair<std::string, uint16_t>& hp, int peer, int index) {
  const Identity& me = dialer.me;
  const Deadline deadline = dialer.deadline;
  const ErrorContext pctx = ErrorContext(dialer.ctx).withPeer(peer);
  net::Socket s;
  try {
    s = net::connectTo(
        hp.first, hp.second, deadline, "rank " + std::to_string(peer) + "'s data port",
        [&](int fd) { dialer.congestion.apply(fd, me.rank); }, dialer.refusedBy);
  } catch (const Error& e) {
    throw Error(e.code(), e.detail(), pctx);
  }
  net::setBufferSizes(s.fd(), dialer.bufBytes);
  try {
    auth::authenticate(s.fd(), dialer.token, kAuthLabel, /*initiator=*/true, deadline);
  } catch (const Error& e) {
    throw Error(e.code(), "connecting to rank " + std::to_string(peer) + ": " + e.detail(), pctx);
  }
  Hello h{kHelloMagic,
          kProtocolVersion,
          me.rank,
          me.size,
          index,
          static_cast<int16_t>(me.socketsPerPeer),
          static_cast<int16_t>(me.lazy ? 1 : 0),
          me.commId,
          index == 0 ? me.host.identityFor(peer) : local::Identity{}};
  net::sendAll(s.fd(), &h, sizeof(h), deadline);
  HelloReply reply{};
  net::recvAll(s.fd(), &reply, sizeof(reply), deadline);
  if (reply.ok == kCrossed && index == 0 && me.lazy && peer > me.rank) return Dialed{};
  if (reply.ok != kAccepted) {
    GFLOW_THROW(kMismatch, pctx) << "rank " << peer
                                 << " rejected this rank's connection (different world size, "
                                    "communicator, GFLOW_SOCKETS_PER_PEER or GFLOW_CONNECT; see "
                                    "its log)";
  }
  std::unique_ptr<local::Link> link;
  if (index == 0)
    link = me.host.agreeAsDialer(s.fd(), peer, reply.local, reply.challenge, deadline);
  return Dialed{std::move(s), std::move(link)};
}

// A rank that fails during setup says so in the store, so the ranks that
// wait for it fail at once with its reason instead of at the deadline. The
// waiters poll counters (`add` of 0, which never blocks) and read a text
// only once its counter says it is there: a store wait that times out can
// leave a c10d store's client out of step with its server.
void reportSetupFailure(const ContextOptions& o, int rank, const Error& e) noexcept {
  try {
    // The rank it blames first, so the ranks that read it name that rank.
    o.store->setString(o.prefix + "tcp/failure/" + std::to_string(rank),
                       std::to_string(e.peer()) + "\n" + e.what());
    o.store->add(o.prefix + "tcp/failed/" + std::to_string(rank), 1);
    o.store->add(o.prefix + "tcp/failed", 1);
    // Wakes the ranks waiting for every address (addresses()).
    o.store->setString(o.prefix + "tcp/addr/" + std::to_string(rank), "failed");
  } catch (const Error&) {
    // Best effort: the others then wait for their deadline.
  }
}

bool counterSet(const ContextOptions& o, const std::string& key) {
  return o.store->add(o.prefix + key, 0) > 0;
}

// Raises the report of a rank of `ranks` that failed during setup, if any.
void raiseSetupFailure(const ContextOptions& o, int rank, const std::vector<int>& ranks,
                       const Deadline& deadline) {
  if (!counterSet(o, "tcp/failed")) return;
  for (int r : ranks) {
    if (!counterSet(o, "tcp/failed/" + std::to_string(r))) continue;
    const std::string report =
        o.store->getString(o.prefix + "tcp/failure/" + std::to_string(r),
                           std::chrono::milliseconds(std::max(deadline.remainingMs(), 1)));
    // "CULPRIT\nTEXT": the rank r's failure blames, if one of this job's.
    const size_t nl = report.find('\n');
    const int blamed = nl == std::string::npos ? -1 : std::atoi(report.substr(0, nl).c_str());
    const std::string why = nl == std::string::npos ? report : report.substr(nl + 1);
    throw Error(ErrorCode::kPeerLost,
                "rank " + std::to_string(r) + " failed while connecting: " +
                    printable(why.data(), std::min<size_t>(why.size(), 1024)),
                ErrorContext::forOp("init").withRank(rank).withPeer(
                    blamed >= 0 && blamed < o.size && blamed != rank ? blamed : r));
  }
}

// Every rank's address, in rank order, in one multi-get that waits until
// each has published or failed (a rank that fails writes "failed" as its
// address). One store request, whatever the job's size, and none that
// times out unless the setup fails anyway.
std::vector<std::string> addresses(const ContextOptions& o, int rank, const Deadline& deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < o.size; ++r) keys.push_back(o.prefix + "tcp/addr/" + std::to_string(r));
  std::vector<std::vector<uint8_t>> values;
  try {
    values =
        o.store->multiGet(keys, std::chrono::milliseconds(std::max(deadline.remainingMs(), 1)));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
    GFLOW_THROW(kTimeout, ErrorContext::forOp("init").withRank(rank))
        << "Timed out waiting for every rank to publish its address (GFLOW_TIMEOUT): some have "
           "not started or are stuck ("
        << e.detail() << ")";
  }
  const auto failed = [](const std::vector<uint8_t>& v) {
    return std::string(v.begin(), v.end()) == "failed";
  };
  if (std::any_of(values.begin(), values.end(), failed)) {
    std::vector<int> all;
    for (int r = 0; r < o.size; ++r) all.push_back(r);
    raiseSetupFailure(o, rank, all, deadline);
  }
  std::vector<std::string> out;
  for (const auto& v : values) out.emplace_back(v.begin(), v.end());
  return out;
}

}  // namespace

void TcpContext::connectAll(const ContextOptions& options) {
  try {
    connectAllOrThrow(options);
  } catch (const Error& e) {
    if (acceptor_) acceptor_->stop();  // before the members its callbacks use go
    reportSetupFailure(options, rank(), e);
    throw;
  } catch (...) {
    if (acceptor_) acceptor_->stop();
    throw;
  }
}

void TcpContext::connectAllOrThrow(const ContextOptions& options) {
  if (size() == 1) return;
  const ErrorContext ectx = ErrorContext::forOp("init").withRank(rank());
  if (!lazy_) {
    // Its sockets, the listener and the acceptor's, epoll and its eventfd.
    fdlimit::require(static_cast<size_t>(socketsPerPeer_) * static_cast<size_t>(size() - 1) + 4,
                     "rank " + std::to_string(rank()) + "'s TCP connections to " +
                         std::to_string(size() - 1) +
                         " peers (GFLOW_SOCKETS_PER_PEER=" + std::to_string(socketsPerPeer_) +
                         "; GFLOW_CONNECT=lazy connects only the peers in use)",
                     ectx);
  }
  const Deadline deadline = Deadline::after(options.timeout);
  token_ = options.token;
  bufBytes_ = static_cast<int>(std::min<uint64_t>(
      (options.tcp.socketBufferBytes ? *options.tcp.socketBufferBytes : params::socketBuffer()),
      1u << 30));
  congestion_ = std::make_unique<CongestionChoice>(
      !options.tcp.congestion.empty() ? options.tcp.congestion : params::tcpCongestion());

  // Accept the higher ranks while connecting to the lower ones, so no pair
  // waits on the other's order; on demand, for the context's life.
  inbound_ = std::make_unique<Inbound>(identity(), [this] { poller_.wake(); });
  net::HandshakeAcceptor::Options ao;
  ao.name = "rank " + std::to_string(rank());
  ao.token = options.token;
  ao.label = kAuthLabel;
  ao.timeout = kHandshakeTimeout;
  ao.maxPending = kMaxPendingHandshakes;
  acceptor_ = std::make_unique<net::HandshakeAcceptor>(
      listenAndPublish(options, rank(), *congestion_), std::move(ao),
      [in = inbound_.get()](net::HandshakeAcceptor::Handshake& h) { in->handshake(h); });
  addrs_ = addresses(options, rank(), deadline);
  if (lazy_) {
    GFLOW_LOG(INFO) << "rank " << rank() << " connects to its " << size() - 1
                    << " peers on demand (GFLOW_CONNECT)";
    return;
  }
  // Nearest first: ranks that start together dial distinct ranks at each
  // step, instead of all dialing rank 0 first.
  for (int peer = rank() - 1; peer >= 0; --peer) {
    try {
      dialPeer(peer, deadline, ectx);
    } catch (const Error& e) {
      // A peer that failed and left refuses: its report names the culprit.
      if (e.code() == ErrorCode::kPeerLost) raiseSetupFailure(options, rank(), {peer}, deadline);
      throw;
    }
  }
  auto accepted = inbound_->wait(deadline, ectx, [&](const std::vector<int>& missing) {
    raiseSetupFailure(options, rank(), missing, deadline);
  });
  acceptor_->stop();
  acceptor_.reset();
  for (Accepted& a : accepted) adopt(a);
  for (int peer = 0; peer < size(); ++peer) installStream(peer);
  GFLOW_LOG(INFO) << "rank " << rank() << " connected to " << size() - 1 << " peers ("
                  << socketsPerPeer_ << " sockets each)";
}

Identity TcpContext::identity() const {
  return Identity{rank(), size(), socketsPerPeer_, commId_, lazy_, *host_};
}

bool TcpContext::dialPeer(int peer, const Deadline& deadline, const ErrorContext& ectx) {
  const auto hp = net::parseHostPort(addrs_[static_cast<size_t>(peer)],
                                     "address of rank " + std::to_string(peer));
  if (lazy_) {
    fdlimit::require(static_cast<size_t>(socketsPerPeer_),
                     "rank " + std::to_string(rank()) + "'s connection to rank " +
                         std::to_string(peer) +
                         " (GFLOW_SOCKETS_PER_PEER=" + std::to_string(socketsPerPeer_) + ")",
                     ectx);
  }
  const Dialer dialer{
      identity(), token_, bufBytes_, *congestion_, deadline, Deadline::after(kRefusedRetry), ectx};
  for (int i = 0; i < socketsPerPeer_; ++i) {
    Dialed d = dial(dialer, hp, peer, i);
    if (!d.sock.valid()) return false;  // crossed (socket 0)
    if (i == 0) peers_[peer]->link = std::move(d.link);
    addConnection(peer, i, std::move(d.sock));
  }
  return true;
}

void TcpContext::adopt(Accepted& a) {
  net::setBufferSizes(a.sock.fd(), bufBytes_);
  congestion_->apply(a.sock.fd(), rank());  // inherited from the listener: a no-op
  if (a.hello.socketIndex == 0) peers_[a.hello.rank]->link = std::move(a.link);
  addConnection(a.hello.rank, a.hello.socketIndex, std::move(a.sock));
}

void TcpContext::adoptInbound() {
  if (!inbound_ || !inbound_->hasReady()) return;
  int dropped = -1;  // a peer whose set is dropped (takeReady sorts by rank, socket)
  for (Accepted& a : inbound_->takeReady()) {
    const int peer = a.hello.rank;
    if (a.hello.socketIndex == 0 && connected(peer)) {  // never two sets (inbound.h)
      GFLOW_LOG(WARN) << "rank " << rank() << ": dropped a second connection claiming rank "
                      << peer;
      dropped = peer;
    }
    if (peer == dropped) continue;
    try {
      adopt(a);
    } catch (const Error& e) {
      if (failed()) throw;
      fail(Error(e.code(), "adopting rank " + std::to_string(peer) + "'s connection: " + e.detail(),
                 ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
    }
    if (a.hello.socketIndex + 1 < socketsPerPeer_) continue;
    installStream(peer);
    // A peer that connects after this rank failed hears the report at once.
    if (!report_.empty()) sendReport(*peers_[peer], report_);
  }
}

void TcpContext::connectPeer(int peer) {
  adoptInbound();
  const Deadline deadline = Deadline::after(timeout());
  const ErrorContext ectx = ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer);
  try {
    while (!connected(peer)) {
      if (deadline.expired()) {
        fail(Error(
            ErrorCode::kTimeout,
            "rank " + std::to_string(peer) + " did not connect within the deadline (GFLOW_TIMEOUT)",
            ectx));
      }
      // Dial unless the peer's connection has come in. A crossed dial is
      // tried again now and then: the peer that won may have failed since.
      if (inbound_->startDial(peer)) {
        bool ok = false;
        try {
          ok = dialPeer(peer, deadline, ectx);
        } catch (const Error&) {
          inbound_->endDial(peer, false);
          throw;
        }
        inbound_->endDial(peer, ok);
        if (ok) return installStream(peer);
      }
      inbound_->waitReady(deadline.earlier(Deadline::after(kRedial)));
      adoptInbound();
      checkFailed();
    }
  } catch (const Error& e) {
    if (failed()) throw;
    // The code says whose fault it is: peer_lost for a port that refuses or
    // resets, mismatch for a refused hello; a local failure (descriptors)
    // names no peer's.
    fail(Error(e.code(), "rank " + std::to_string(peer) + " could not be connected: " + e.detail(),
               ectx));
  }
}

}  // namespace gflow::transport::tcp
