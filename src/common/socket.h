// TCP socket helpers shared by the bootstrap store and the TCP transport.
// Every blocking helper takes a Deadline and throws gflow::Error:
// kTimeout when it passes, kPeerLost on EOF/reset, kInternal for other errno.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "common/deadline.h"

namespace gflow::net {

// Owns a file descriptor; closes it on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void close();

 private:
  int fd_ = -1;
};

struct PortRange {
  uint16_t lo = 0;  // 0/0: any (ephemeral) port
  uint16_t hi = 0;
  bool any() const { return lo == 0 && hi == 0; }
};
// "lo-hi" or a single port; "" -> any. Throws kInvalidArgument naming
// GFLOW_PORT_RANGE on a malformed value.
PortRange parsePortRange(const std::string& spec);

// "host:port", with an IPv6 host in brackets ("[::1]:80"): parseHostPort's input.
std::string joinHostPort(const std::string& host, uint16_t port);

// "host:port" (host may be "[v6]"). Throws kInvalidArgument naming `what`.
std::pair<std::string, uint16_t> parseHostPort(const std::string& s, const std::string& what);

// The IPv4/IPv6 address of the interface chosen by `spec` (GFLOW_SOCKET_IFNAME
// syntax: comma-separated prefixes, '=' prefix for exact names, '^' to
// exclude). Empty spec: the first interface that is up and not loopback,
// falling back to loopback. Throws kInvalidArgument when nothing matches,
// listing the interfaces that exist.
std::string selectInterfaceAddress(const std::string& spec);

// The numeric address `host` resolves to here (its first), "" if it does
// not resolve.
std::string resolveAddress(const std::string& host);

// A listening socket bound to `ip` on a port in `range` (tries each port in
// turn; any port when range.any()). *port receives the bound port. Throws
// kInvalidArgument naming GFLOW_PORT_RANGE when every port is taken.
Socket listenOn(const std::string& ip, const PortRange& range, uint16_t* port, int backlog = 512);

// Connects to host:port, retrying refused/unreachable attempts with backoff
// until the deadline; throws kTimeout naming `what` and the address.
// `beforeConnect`, if given, runs on each new socket before its connect()
// (options that must be in force at the handshake). `refusedBy`, if given:
// a refused or reset attempt after it throws kPeerLost (nobody listens
// there any more), while a slow one (a full backlog) still waits for the
// deadline. Returns a blocking socket with TCP_NODELAY set.
Socket connectTo(const std::string& host, uint16_t port, Deadline deadline, const std::string& what,
                 const std::function<void(int fd)>& beforeConnect = nullptr,
                 std::optional<Deadline> refusedBy = std::nullopt);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
void setBufferSizes(int fd, int bytes);  // SO_SNDBUF and SO_RCVBUF, best effort

// Full-buffer I/O that honours the deadline (poll-based, works on blocking and
// non-blocking sockets alike).
void sendAll(int fd, const void* data, size_t len, Deadline deadline);
void recvAll(int fd, void* data, size_t len, Deadline deadline);

// "ip:port" of the peer of a connected socket (for log messages).
std::string peerAddress(int fd);

}  // namespace gflow::net
