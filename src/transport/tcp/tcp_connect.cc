// Connection setup of the TCP transport: every rank listens, publishes its
// address in the store, connects to lower ranks and accepts higher ones.
// Every connection is authenticated (job token) and then identifies itself
// with a Hello; strangers, wrong tokens and malformed hellos are logged and
// dropped without disturbing the setup.
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "common/auth.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "transport/tcp/tcp_context.h"

namespace gflow::transport::tcp {
namespace {

constexpr const char* kAuthLabel = "gflow-data/v1";
// A connection that does not finish authentication in this time is dropped
// so a silent stranger cannot stall the setup.
constexpr std::chrono::milliseconds kHandshakeTimeout{10000};

uint64_t hashPrefix(const std::string& prefix) {
  auth::Digest d = auth::sha256(prefix.data(), prefix.size());
  uint64_t id;
  std::memcpy(&id, d.data(), sizeof(id));
  return id;
}

}  // namespace

void TcpContext::connectAll(const ContextOptions& options) {
  if (size() == 1) return;
  const Deadline deadline = Deadline::after(options.timeout);
  const ErrorContext ectx{"init", 0, rank(), -1};
  commId_ = hashPrefix(options.prefix);

  const std::string ifname = !options.socketIfname.empty()
                                 ? options.socketIfname
                                 : params::getString("GFLOW_SOCKET_IFNAME");
  const std::string range =
      !options.portRange.empty() ? options.portRange : params::getString("GFLOW_PORT_RANGE");
  std::string ip = net::selectInterfaceAddress(ifname);
  uint16_t port = 0;
  net::Socket listener = net::listenOn(ip, net::parsePortRange(range), &port);
  const std::string hostPort =
      (ip.find(':') != std::string::npos ? "[" + ip + "]" : ip) + ":" + std::to_string(port);
  options.store->setString(options.prefix + "tcp/addr/" + std::to_string(rank()), hostPort);
  GFLOW_LOG(DEBUG) << "rank " << rank() << " listens on " << hostPort;

  const int bufBytes =
      static_cast<int>(std::min<uint64_t>(params::getBytes("GFLOW_SOCKET_BUFFER"), 1u << 30));
  const int expected = (size() - 1 - rank()) * socketsPerPeer_;

  // Accept the higher ranks in a thread while connecting to the lower ones,
  // so no pair waits on the other's order. Each accepted connection runs its
  // handshake in its own thread, so a silent or slow stranger cannot hold up
  // the real ranks queued behind it.
  struct Pending {
    net::Socket sock;
    std::string from;
    std::thread thread;
    std::atomic<bool> done{false};
    bool ok = false;
    Hello hello{};
  };
  constexpr size_t kMaxPendingHandshakes = 64;
  std::vector<std::pair<Hello, net::Socket>> accepted;
  std::exception_ptr acceptError;
  std::atomic<bool> stopAccepting{false};  // the connect side failed
  std::thread acceptor([&] {
    std::vector<std::unique_ptr<Pending>> pending;
    std::mutex seenMutex;
    std::vector<std::vector<bool>> seen(size(), std::vector<bool>(socketsPerPeer_, false));
    auto handshake = [&](Pending* p) {
      const int fd = p->sock.fd();
      int marked = -1, markedIndex = -1;  // marked as connected; undone if the reply fails
      try {
        Deadline hd = deadline.earlier(Deadline::after(kHandshakeTimeout));
        auth::authenticate(fd, options.token, kAuthLabel, /*initiator=*/false, hd);
        Hello h{};
        net::recvAll(fd, &h, sizeof(h), hd);
        std::string why;
        if (h.magic != kHelloMagic || h.version != kProtocolVersion) {
          why = "bad hello magic/version";
        } else if (h.commId != commId_) {
          why = "belongs to another communicator";
        } else if (h.size != size() || h.rank <= rank() || h.rank >= size()) {
          why = "claims rank " + std::to_string(h.rank) + " of " + std::to_string(h.size);
        } else if (h.socketsPerPeer != socketsPerPeer_ || h.socketIndex < 0 ||
                   h.socketIndex >= socketsPerPeer_) {
          why = "uses " + std::to_string(h.socketsPerPeer) +
                " sockets per peer (GFLOW_SOCKETS_PER_PEER differs between ranks?)";
        } else {
          std::lock_guard<std::mutex> lock(seenMutex);
          if (seen[h.rank][h.socketIndex]) {
            why = "duplicate connection for rank " + std::to_string(h.rank);
          } else {
            seen[h.rank][h.socketIndex] = true;
            marked = h.rank;
            markedIndex = h.socketIndex;
          }
        }
        uint8_t ok = why.empty() ? 1 : 0;
        net::sendAll(fd, &ok, 1, hd);
        if (!ok) {
          GFLOW_LOG(WARN) << "rank " << rank() << ": rejected connection from " << p->from << ": "
                          << why;
        } else {
          p->hello = h;
          p->ok = true;
        }
      } catch (const Error& e) {
        GFLOW_LOG(WARN) << "rank " << rank() << ": rejected connection from " << p->from << ": "
                        << e.detail();
        if (marked >= 0) {
          std::lock_guard<std::mutex> lock(seenMutex);
          seen[marked][markedIndex] = false;
        }
      }
      p->done.store(true, std::memory_order_release);
    };
    auto reap = [&](bool all) {
      for (auto it = pending.begin(); it != pending.end();) {
        Pending& p = **it;
        if (all && !p.done.load(std::memory_order_acquire)) ::shutdown(p.sock.fd(), SHUT_RDWR);
        if (all || p.done.load(std::memory_order_acquire)) {
          p.thread.join();
          if (p.ok && static_cast<int>(accepted.size()) < expected) {
            accepted.emplace_back(p.hello, std::move(p.sock));
          }
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    };
    try {
      net::setNonBlocking(listener.fd(), true);
      while (static_cast<int>(accepted.size()) < expected &&
             !stopAccepting.load(std::memory_order_acquire)) {
        reap(false);
        if (static_cast<int>(accepted.size()) >= expected) break;
        if (deadline.expired()) {
          std::string missing;
          {
            std::lock_guard<std::mutex> lock(seenMutex);
            for (int r = rank() + 1; r < size(); ++r) {
              if (std::find(seen[r].begin(), seen[r].end(), false) != seen[r].end()) {
                missing += (missing.empty() ? "" : ", ") + std::to_string(r);
              }
            }
          }
          GFLOW_THROW(kTimeout, ectx)
              << "ranks " << missing << " did not connect within the deadline (GFLOW_TIMEOUT)";
        }
        int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            continue;
          }
          GFLOW_SYSCHECK(fd, "accept");
        }
        auto p = std::make_unique<Pending>();
        p->sock = net::Socket(fd);
        net::setNonBlocking(fd, false);
        p->from = net::peerAddress(fd);
        if (pending.size() >= kMaxPendingHandshakes) {
          GFLOW_LOG(WARN) << "rank " << rank() << ": dropped connection from " << p->from
                          << ": too many handshakes in progress";
          continue;
        }
        Pending* raw = p.get();
        p->thread = std::thread([&handshake, raw] { handshake(raw); });
        pending.push_back(std::move(p));
      }
    } catch (...) {
      acceptError = std::current_exception();
    }
    reap(true);
  });

  std::exception_ptr connectError;
  try {
    for (int peer = 0; peer < rank(); ++peer) {
      std::string addr =
          options.store->getString(options.prefix + "tcp/addr/" + std::to_string(peer),
                                   std::chrono::milliseconds(std::max(deadline.remainingMs(), 1)));
      auto hp = net::parseHostPort(addr, "address of rank " + std::to_string(peer));
      for (int i = 0; i < socketsPerPeer_; ++i) {
        net::Socket s = net::connectTo(hp.first, hp.second, deadline,
                                       "rank " + std::to_string(peer) + "'s data port");
        net::setBufferSizes(s.fd(), bufBytes);
        try {
          auth::authenticate(s.fd(), options.token, kAuthLabel, /*initiator=*/true, deadline);
        } catch (const Error& e) {
          throw Error(e.code(), "connecting to rank " + std::to_string(peer) + ": " + e.detail(),
                      ErrorContext{"init", 0, rank(), peer});
        }
        Hello h{kHelloMagic, kProtocolVersion, rank(), size(), i, socketsPerPeer_, commId_};
        net::sendAll(s.fd(), &h, sizeof(h), deadline);
        uint8_t ok = 0;
        net::recvAll(s.fd(), &ok, 1, deadline);
        if (ok != 1) {
          GFLOW_THROW(kMismatch, (ErrorContext{"init", 0, rank(), peer}))
              << "rank " << peer
              << " rejected this rank's connection (different world size, communicator or "
                 "GFLOW_SOCKETS_PER_PEER; see its log)";
        }
        addConnection(peer, i, std::move(s));
      }
    }
  } catch (...) {
    connectError = std::current_exception();
    stopAccepting.store(true, std::memory_order_release);
  }
  acceptor.join();
  if (connectError) std::rethrow_exception(connectError);
  if (acceptError) std::rethrow_exception(acceptError);
  for (auto& [hello, sock] : accepted) {
    net::setBufferSizes(sock.fd(), bufBytes);
    addConnection(hello.rank, hello.socketIndex, std::move(sock));
  }
  GFLOW_LOG(INFO) << "rank " << rank() << " connected to " << size() - 1 << " peers ("
                  << socketsPerPeer_ << " sockets each)";
}

}  // namespace gflow::transport::tcp
