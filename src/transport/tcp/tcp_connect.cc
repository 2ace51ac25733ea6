// Connection setup of the TCP transport: every rank listens, publishes its
// address in the store, connects to lower ranks and accepts higher ones.
// Every connection is authenticated (job token) and then identifies itself
// with a Hello; strangers, wrong tokens and malformed hellos are logged and
// dropped without disturbing the setup (net::HandshakeAcceptor runs each
// inbound handshake on its own thread under a deadline).
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
#include <cstring>
#include <functional>
#include <mutex>
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
// How often a rank waiting for others to connect looks for their failure
// reports in the store: after kSetupPoll, then at twice the interval each
// time up to kMaxSetupPoll (a few requests per rank however long the
// setup; a failure is seen within kMaxSetupPoll).
constexpr std::chrono::milliseconds kSetupPoll{100};
constexpr std::chrono::milliseconds kMaxSetupPoll{2000};

// What a Hello must match: this rank's view of the communicator, and its
// side of the local links.
struct Identity {
  int rank;
  int size;
  int socketsPerPeer;
  uint64_t commId;
  local::Host& host;
};

// A connection from a higher rank: its Hello and its local link (null:
// none).
struct Accepted {
  Hello hello;
  net::Socket sock;
  std::unique_ptr<local::Link> link;
};

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
  if (options.store->add(options.prefix + "tcp/published", 1) == options.size) {
    options.store->setString(options.prefix + "tcp/ready", "all");
  }
  GFLOW_LOG(DEBUG) << "rank " << rank << " listens on " << hostPort;
  return listener;
}

// The accepting side: checks the Hello of each authenticated connection from
// a higher rank (on the acceptor's handshake threads) and keeps the good
// ones until connectAll collects them. Thread safe.
class Inbound {
 public:
  // Higher ranks not fully connected yet (mutex_ held).
  std::vector<int> missingRanks() const {
    std::vector<int> out;
    for (int r = me_.rank + 1; r < me_.size; ++r) {
      if (std::find(seen_[r].begin(), seen_[r].end(), false) != seen_[r].end()) out.push_back(r);
    }
    return out;
  }

  Inbound(const Identity& me, Deadline deadline)
      : me_(me),
        deadline_(deadline),
        expected_(static_cast<size_t>((me.size - 1 - me.rank) * me.socketsPerPeer)),
        seen_(me.size, std::vector<bool>(me.socketsPerPeer, false)) {}

  // The acceptor's callback. Throws Error (the acceptor logs it) when the
  // Hello does not fit; the peer is told so first.
  void handshake(net::HandshakeAcceptor::Handshake& h) {
    const Deadline hd = deadline_.earlier(h.deadline());
    Hello hello{};
    // Magic and version first: another version's hello may be shorter.
    constexpr size_t kHead = offsetof(Hello, rank);
    net::recvAll(h.fd(), &hello, kHead, hd);
    if (hello.magic == kHelloMagic && hello.version == kProtocolVersion) {
      net::recvAll(h.fd(), reinterpret_cast<char*>(&hello) + kHead, sizeof(hello) - kHead, hd);
    }
    const std::string why = claim(hello);
    HelloReply reply{};
    reply.ok = why.empty() ? 1 : 0;
    const bool agree = reply.ok && hello.socketIndex == 0;
    if (agree && me_.host.canConnect(hello.local)) {
      reply.local = me_.host.identityFor(hello.rank);
      reply.challenge = local::Host::newChallenge();
    }
    std::unique_ptr<local::Link> link;
    try {
      net::sendAll(h.fd(), &reply, sizeof(reply), hd);
      if (agree) {
        link = me_.host.agreeAsAcceptor(h.fd(), hello.rank, hello.local, reply.challenge, hd);
      }
    } catch (const Error&) {
      if (reply.ok) release(hello);
      throw;
    }
    if (!reply.ok) throw Error(ErrorCode::kMismatch, why);
    net::Socket sock = h.take();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!sock.valid()) {  // setup is over
      seen_[hello.rank][hello.socketIndex] = false;
      return;
    }
    accepted_.push_back(Accepted{hello, std::move(sock), std::move(link)});
    if (accepted_.size() >= expected_) done_.notify_all();
  }

  // Blocks until every higher rank has connected; kTimeout naming the ranks
  // still missing at the deadline. Every poll (kSetupPoll, doubling), `check` may raise the
  // setup failure of a missing rank (outside the lock).
  std::vector<Accepted> wait(const ErrorContext& ectx,
                             const std::function<void(const std::vector<int>&)>& check) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto complete = [&] { return accepted_.size() >= expected_; };
    std::chrono::milliseconds pause = kSetupPoll;
    while (!complete() && !deadline_.expired()) {
      done_.wait_until(lock, std::min(deadline_.at(), Deadline::Clock::now() + pause), complete);
      if (complete()) break;
      pause = std::min(pause * 2, kMaxSetupPoll);
      const std::vector<int> missing = missingRanks();
      lock.unlock();
      check(missing);
      lock.lock();
    }
    if (!complete()) {
      std::string missing;
      for (int r : missingRanks()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      GFLOW_THROW(kTimeout, ectx) << "ranks " << missing
                                  << " did not connect within the deadline (GFLOW_TIMEOUT)";
    }
    return std::move(accepted_);
  }

 private:
  // "" and marks the (rank, socket) slot taken when the Hello fits; else why
  // not. Nothing but the token proves these fields (see the top of the file).
  std::string claim(const Hello& h) {
    if (h.magic != kHelloMagic || h.version != kProtocolVersion) return "bad hello magic/version";
    if (h.commId != me_.commId) return "belongs to another communicator";
    if (h.size != me_.size || h.rank <= me_.rank || h.rank >= me_.size) {
      return "claims rank " + std::to_string(h.rank) + " of " + std::to_string(h.size);
    }
    if (h.socketsPerPeer != me_.socketsPerPeer || h.socketIndex < 0 ||
        h.socketIndex >= me_.socketsPerPeer) {
      return "uses " + std::to_string(h.socketsPerPeer) +
             " sockets per peer (GFLOW_SOCKETS_PER_PEER differs between ranks?)";
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (seen_[h.rank][h.socketIndex])
      return "duplicate connection for rank " + std::to_string(h.rank);
    seen_[h.rank][h.socketIndex] = true;
    return "";
  }

  void release(const Hello& h) {
    std::lock_guard<std::mutex> lock(mutex_);
    seen_[h.rank][h.socketIndex] = false;
  }

  const Identity me_;
  const Deadline deadline_;
  const size_t expected_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::vector<bool>> seen_;  // [rank][socket]: claimed by a Hello
  std::vector<Accepted> accepted_;
};

// Connection `index` to lower rank `peer`: its socket, and its local link
// (null: none; socket 0 only).
struct Dialed {
  net::Socket sock;
  std::unique_ptr<local::Link> link;
};

// What every connection this rank dials shares.
struct Dialer {
  const Identity& me;
  const std::string& token;
  int bufBytes;
  CongestionChoice& congestion;
  Deadline deadline;
};

// Connection `index` to lower rank `peer` at host:port, authenticated and
// accepted by the peer's Hello check.
Dialed dial(const Dialer& dialer, const std::pair<std::string, uint16_t>& hp, int peer, int index) {
  const Identity& me = dialer.me;
  const Deadline deadline = dialer.deadline;
  const ErrorContext pctx = ErrorContext::forOp("init").withRank(me.rank).withPeer(peer);
  net::Socket s =
      net::connectTo(hp.first, hp.second, deadline, "rank " + std::to_string(peer) + "'s data port",
                     [&](int fd) { dialer.congestion.apply(fd, me.rank); });
  net::setBufferSizes(s.fd(), dialer.bufBytes);
  try {
    auth::authenticate(s.fd(), dialer.token, kAuthLabel, /*initiator=*/true, deadline);
  } catch (const Error& e) {
    throw Error(e.code(), "connecting to rank " + std::to_string(peer) + ": " + e.detail(), pctx);
  }
  Hello h{kHelloMagic, kProtocolVersion,
          me.rank,     me.size,
          index,       me.socketsPerPeer,
          me.commId,   index == 0 ? me.host.identityFor(peer) : local::Identity{}};
  net::sendAll(s.fd(), &h, sizeof(h), deadline);
  HelloReply reply{};
  net::recvAll(s.fd(), &reply, sizeof(reply), deadline);
  if (reply.ok != 1) {
    GFLOW_THROW(kMismatch, pctx) << "rank " << peer
                                 << " rejected this rank's connection (different world size, "
                                    "communicator or GFLOW_SOCKETS_PER_PEER; see its log)";
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
    o.store->setString(o.prefix + "tcp/failure/" + std::to_string(rank), e.what());
    o.store->add(o.prefix + "tcp/failed/" + std::to_string(rank), 1);
    o.store->add(o.prefix + "tcp/failed", 1);
    // Wakes the ranks waiting for every address (lowerAddresses).
    o.store->setString(o.prefix + "tcp/addr/" + std::to_string(rank), "failed");
    o.store->setString(o.prefix + "tcp/ready", "failed");
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
    const std::string why =
        o.store->getString(o.prefix + "tcp/failure/" + std::to_string(r),
                           std::chrono::milliseconds(std::max(deadline.remainingMs(), 1)));
    throw Error(ErrorCode::kPeerLost,
                "rank " + std::to_string(r) + " failed while connecting: " +
                    printable(why.data(), std::min<size_t>(why.size(), 1024)),
                ErrorContext::forOp("init").withRank(rank).withPeer(r));
  }
}

// The addresses of the ranks below `rank`, in rank order, in one multi-get
// that waits until every rank has published (tcp/ready, set by the last
// one) or one has failed (it sets tcp/ready and its address to "failed").
// One store request, whatever the job's size, and none that times out
// unless the setup fails anyway.
std::vector<std::string> lowerAddresses(const ContextOptions& o, int rank,
                                        const Deadline& deadline) {
  if (rank == 0) return {};
  std::vector<std::string> keys;
  for (int r = 0; r < rank; ++r) keys.push_back(o.prefix + "tcp/addr/" + std::to_string(r));
  keys.push_back(o.prefix + "tcp/ready");
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
  // A rank that failed writes "failed" as its address, then as tcp/ready; a
  // read between the two sees either.
  const auto failed = [](const std::vector<uint8_t>& v) {
    return std::string(v.begin(), v.end()) == "failed";
  };
  if (std::string(values.back().begin(), values.back().end()) != "all" ||
      std::any_of(values.begin(), values.end() - 1, failed)) {
    std::vector<int> all;
    for (int r = 0; r < o.size; ++r) all.push_back(r);
    raiseSetupFailure(o, rank, all, deadline);
  }
  values.pop_back();
  std::vector<std::string> out;
  for (const auto& v : values) out.emplace_back(v.begin(), v.end());
  return out;
}

}  // namespace

void TcpContext::connectAll(const ContextOptions& options) {
  try {
    connectAllOrThrow(options);
  } catch (const Error& e) {
    reportSetupFailure(options, rank(), e);
    throw;
  }
}

void TcpContext::connectAllOrThrow(const ContextOptions& options) {
  if (size() == 1) return;
  // Its sockets, the listener and the acceptor's, epoll and its eventfd.
  fdlimit::require(static_cast<size_t>(socketsPerPeer_) * static_cast<size_t>(size() - 1) + 4,
                   "rank " + std::to_string(rank()) + "'s TCP connections to " +
                       std::to_string(size() - 1) +
                       " peers (GFLOW_SOCKETS_PER_PEER=" + std::to_string(socketsPerPeer_) + ")",
                   ErrorContext::forOp("init").withRank(rank()));
  const Deadline deadline = Deadline::after(options.timeout);
  const Identity me{rank(), size(), socketsPerPeer_, commId_, *host_};
  const int bufBytes = static_cast<int>(std::min<uint64_t>(
      (options.tcp.socketBufferBytes ? *options.tcp.socketBufferBytes : params::socketBuffer()),
      1u << 30));
  CongestionChoice congestion(!options.tcp.congestion.empty() ? options.tcp.congestion
                                                              : params::tcpCongestion());

  // Accept the higher ranks while connecting to the lower ones, so no pair
  // waits on the other's order.
  Inbound inbound(me, deadline);
  net::HandshakeAcceptor::Options ao;
  ao.name = "rank " + std::to_string(rank());
  ao.token = options.token;
  ao.label = kAuthLabel;
  ao.timeout = kHandshakeTimeout;
  ao.maxPending = kMaxPendingHandshakes;
  net::HandshakeAcceptor acceptor(
      listenAndPublish(options, rank(), congestion), std::move(ao),
      [&](net::HandshakeAcceptor::Handshake& h) { inbound.handshake(h); });

  const Dialer dialer{me, options.token, bufBytes, congestion, deadline};
  const std::vector<std::string> addrs = lowerAddresses(options, rank(), deadline);
  // Nearest first: ranks that start together dial distinct ranks at each
  // step, instead of all dialing rank 0 first.
  for (int peer = rank() - 1; peer >= 0; --peer) {
    auto hp = net::parseHostPort(addrs[static_cast<size_t>(peer)],
                                 "address of rank " + std::to_string(peer));
    for (int i = 0; i < socketsPerPeer_; ++i) {
      Dialed d = dial(dialer, hp, peer, i);
      if (i == 0) peers_[peer]->link = std::move(d.link);
      addConnection(peer, i, std::move(d.sock));
    }
  }
  auto accepted = inbound.wait(ErrorContext::forOp("init").withRank(rank()),
                               [&](const std::vector<int>& missing) {
                                 raiseSetupFailure(options, rank(), missing, deadline);
                               });
  acceptor.stop();
  for (Accepted& a : accepted) {
    net::setBufferSizes(a.sock.fd(), bufBytes);
    congestion.apply(a.sock.fd(), rank());  // inherited from the listener: a no-op
    if (a.hello.socketIndex == 0) peers_[a.hello.rank]->link = std::move(a.link);
    addConnection(a.hello.rank, a.hello.socketIndex, std::move(a.sock));
  }
  installStreams();
  GFLOW_LOG(INFO) << "rank " << rank() << " connected to " << size() - 1 << " peers ("
                  << socketsPerPeer_ << " sockets each)";
}

}  // namespace gflow::transport::tcp
