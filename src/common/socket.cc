#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "common/text.h"

namespace gflow::net {
namespace {

const ErrorContext kNetCtx = ErrorContext::forOp("socket");

using text::trim;

// Parses a decimal port in [minPort, 65535]; false on anything else.
bool parsePort(const std::string& s, uint16_t minPort, uint16_t* out) {
  if (s.empty() || s.size() > 5) return false;
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (v < minPort || v > 65535) return false;
  *out = static_cast<uint16_t>(v);
  return true;
}

std::string formatAddress(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "unknown address";
}

// Addresses an interface offers, in getifaddrs order.
struct Interface {
  std::string name;
  bool up = false;
  bool loopback = false;
  std::string ipv4;
  std::string ipv6;  // global or site scope only: link-local needs a scope id
  const std::string& address() const { return ipv4.empty() ? ipv6 : ipv4; }
};

std::vector<Interface> listInterfaces() {
  ifaddrs* list = nullptr;
  GFLOW_SYSCHECK(::getifaddrs(&list), "getifaddrs");
  std::vector<Interface> out;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    Interface* it = nullptr;
    for (auto& e : out) {
      if (e.name == ifa->ifa_name) it = &e;
    }
    if (it == nullptr) {
      out.emplace_back();
      out.back().name = ifa->ifa_name;
      it = &out.back();
    }
    it->up = it->up || ((ifa->ifa_flags & IFF_UP) && (ifa->ifa_flags & IFF_RUNNING));
    it->loopback = it->loopback || (ifa->ifa_flags & IFF_LOOPBACK);
    if (ifa->ifa_addr == nullptr) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (ifa->ifa_addr->sa_family == AF_INET && it->ipv4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ifa->ifa_addr)->sin_addr, buf,
                sizeof(buf));
      it->ipv4 = buf;
    } else if (ifa->ifa_addr->sa_family == AF_INET6 && it->ipv6.empty()) {
      const in6_addr& a = reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a)) continue;
      inet_ntop(AF_INET6, &a, buf, sizeof(buf));
      it->ipv6 = buf;
    }
  }
  ::freeifaddrs(list);
  return out;
}

std::string describeInterfaces(const std::vector<Interface>& ifs) {
  std::ostringstream os;
  for (size_t i = 0; i < ifs.size(); ++i) {
    if (i) os << ", ";
    os << ifs[i].name << " (";
    if (!ifs[i].up)
      os << "down";
    else if (ifs[i].address().empty())
      os << "no usable address";
    else
      os << ifs[i].address();
    os << ")";
  }
  return ifs.empty() ? std::string("none") : os.str();
}

bool retryableConnectError(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH ||
         err == ECONNRESET || err == EAGAIN || err == EADDRNOTAVAIL || err == ECONNABORTED;
}

bool peerLostError(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ETIMEDOUT ||
         err == ECONNABORTED || err == EHOSTUNREACH || err == ENETUNREACH;
}

// Waits for `events` on fd; false when the deadline passed first.
bool waitFor(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = deadline.remainingMs();
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) {
      if (deadline.remainingMs() == 0) return false;
      continue;
    }
    if (errno == EINTR) continue;
    GFLOW_SYSCHECK(r, "poll");
  }
}

// A connect to a local port with no listener can succeed on Linux by
// connecting the socket to itself (TCP simultaneous open), when the kernel
// picks the target port as the socket's own ephemeral port. That socket then
// holds the port the real listener is about to bind, and reads back its own
// bytes; it is a refusal in disguise.
bool connectedToItself(int fd) {
  sockaddr_storage self{}, peer{};
  socklen_t selfLen = sizeof(self), peerLen = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &selfLen) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLen) != 0) {
    return false;
  }
  return selfLen == peerLen && std::memcmp(&self, &peer, selfLen) == 0;
}

// Result of one non-blocking connect attempt: a socket, or the errno.
Socket tryConnect(const addrinfo* ai, const Deadline& deadline,
                  const std::function<void(int)>& beforeConnect, int* err) {
  Socket s(
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  GFLOW_SYSCHECK(s.fd(), "socket");
  if (beforeConnect) beforeConnect(s.fd());
  int r;
  do {
    r = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && errno != EINPROGRESS) {
    *err = errno;
    return Socket();
  }
  if (r < 0) {
    if (!waitFor(s.fd(), POLLOUT, deadline)) {
      *err = ETIMEDOUT;
      return Socket();
    }
    int soErr = 0;
    socklen_t len = sizeof(soErr);
    GFLOW_SYSCHECK(::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &soErr, &len), "getsockopt");
    if (soErr != 0) {
      *err = soErr;
      return Socket();
    }
  }
  if (connectedToItself(s.fd())) {
    *err = ECONNREFUSED;
    return Socket();
  }
  *err = 0;
  return s;
}

}  // namespace

Socket::~Socket() {
  close();
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

PortRange parsePortRange(const std::string& spec) {
  std::string s = trim(spec);
  if (s.empty() || s == "0") return PortRange{};
  PortRange r;
  size_t dash = s.find('-');
  bool ok;
  if (dash == std::string::npos) {
    ok = parsePort(s, 1, &r.lo);
    r.hi = r.lo;
  } else {
    ok = parsePort(trim(s.substr(0, dash)), 1, &r.lo) &&
         parsePort(trim(s.substr(dash + 1)), 1, &r.hi) && r.lo <= r.hi;
  }
  if (!ok) {
    GFLOW_THROW(kInvalidArgument, kNetCtx)
        << "GFLOW_PORT_RANGE='" << spec
        << "' is not valid: expected a port or 'lo-hi' with 1 <= lo <= hi <= 65535 "
           "(e.g. 50000-50100)";
  }
  return r;
}

std::string joinHostPort(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::pair<std::string, uint16_t> parseHostPort(const std::string& s, const std::string& what) {
  std::string t = trim(s);
  std::string host, port;
  if (!t.empty() && t[0] == '[') {
    size_t close = t.find(']');
    if (close != std::string::npos && close + 1 < t.size() && t[close + 1] == ':') {
      host = t.substr(1, close - 1);
      port = t.substr(close + 2);
    }
  } else {
    size_t colon = t.rfind(':');
    // More than one colon without brackets is a bare IPv6 address: ambiguous.
    if (colon != std::string::npos && t.find(':') == colon) {
      host = t.substr(0, colon);
      port = t.substr(colon + 1);
    }
  }
  uint16_t p = 0;
  if (host.empty() || !parsePort(port, 1, &p)) {
    GFLOW_THROW(kInvalidArgument, kNetCtx)
        << what << "='" << s
        << "' is not valid: expected host:port with a port in 1-65535 (IPv6 as [addr]:port)";
  }
  return {host, p};
}

std::string selectInterfaceAddress(const std::string& spec) {
  std::string s = trim(spec);
  bool exclude = false, exact = false;
  if (!s.empty() && s[0] == '^') {
    exclude = true;
    s = s.substr(1);
  }
  if (!s.empty() && s[0] == '=') {
    exact = true;
    s = s.substr(1);
  }
  const std::vector<std::string> items = text::splitList(s);
  auto matches = [&](const std::string& name) {
    for (const auto& item : items) {
      if (exact ? name == item : name.compare(0, item.size(), item) == 0) return true;
    }
    return false;
  };

  const std::vector<Interface> ifs = listInterfaces();
  const Interface* loopback = nullptr;
  for (const auto& itf : ifs) {
    if (!itf.up || itf.address().empty()) continue;
    bool wanted = items.empty() || (exclude ? !matches(itf.name) : matches(itf.name));
    if (!wanted) continue;
    // Loopback only if nothing else qualifies: it reaches no other host.
    if (itf.loopback) {
      if (loopback == nullptr) loopback = &itf;
      continue;
    }
    return itf.address();
  }
  if (loopback != nullptr) return loopback->address();
  GFLOW_THROW(kInvalidArgument, kNetCtx)
      << "GFLOW_SOCKET_IFNAME='" << spec
      << "' matches no interface that is up and has an address; interfaces: "
      << describeInterfaces(ifs);
}

std::string resolveAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  char buf[NI_MAXHOST] = {};
  const int rc =
      ::getnameinfo(res->ai_addr, res->ai_addrlen, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST);
  ::freeaddrinfo(res);
  return rc == 0 ? std::string(buf) : std::string();
}

Socket listenOn(const std::string& ip, const PortRange& range, uint16_t* port, int backlog) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(ip.empty() ? nullptr : ip.c_str(), "0", &hints, &res);
  if (gai != 0 || res == nullptr) {
    GFLOW_THROW(kInvalidArgument, kNetCtx)
        << "cannot listen on '" << ip << "': " << gai_strerror(gai);
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  socklen_t addrLen = res->ai_addrlen;
  int family = res->ai_family;
  ::freeaddrinfo(res);

  uint32_t lo = range.any() ? 0 : range.lo;
  uint32_t hi = range.any() ? 0 : range.hi;
  for (uint32_t p = lo; p <= hi; ++p) {
    Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    GFLOW_SYSCHECK(s.fd(), "socket");
    int one = 1;
    GFLOW_SYSCHECK(::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)),
                   "setsockopt(SO_REUSEADDR)");
    if (family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(p));
    } else {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(p));
    }
    if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), addrLen) < 0) {
      int err = errno;
      if (err == EADDRINUSE && !range.any()) continue;
      GFLOW_THROW(kInvalidArgument, kNetCtx)
          << "cannot bind " << formatAddress(reinterpret_cast<sockaddr*>(&addr)) << ": "
          << detail::errnoString(err);
    }
    if (::listen(s.fd(), backlog) < 0) {
      int err = errno;
      if (err == EADDRINUSE && !range.any()) continue;  // lost a race for the port
      GFLOW_SYSCHECK(-1, "listen");
    }
    sockaddr_storage bound{};
    socklen_t boundLen = sizeof(bound);
    GFLOW_SYSCHECK(::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound), &boundLen),
                   "getsockname");
    if (port != nullptr) {
      *port =
          ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    }
    return s;
  }
  GFLOW_THROW(kInvalidArgument, kNetCtx)
      << "no free port on " << ip << " in GFLOW_PORT_RANGE=" << range.lo << "-" << range.hi
      << " (all " << (hi - lo + 1) << " in use); widen the range";
}

Socket connectTo(const std::string& host, uint16_t port, Deadline deadline, const std::string& what,
                 const std::function<void(int fd)>& beforeConnect,
                 std::optional<Deadline> refusedBy) {
  const auto start = std::chrono::steady_clock::now();
  const std::string target = host + ":" + std::to_string(port);
  // Jitter spreads out the retries of many ranks waiting for the same root.
  std::minstd_rand rng(
      static_cast<uint32_t>(start.time_since_epoch().count()) ^ static_cast<uint32_t>(::getpid()) ^
      static_cast<uint32_t>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  int backoffMs = 10;
  std::string lastWhy;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai == 0) {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int err = 0;
        Socket s = tryConnect(ai, deadline, beforeConnect, &err);
        if (s.valid()) {
          ::freeaddrinfo(res);
          setNonBlocking(s.fd(), false);
          setNoDelay(s.fd());
          return s;
        }
        lastWhy = detail::errnoString(err);
        const bool refused = err == ECONNREFUSED || err == ECONNRESET;
        if (refused && refusedBy && refusedBy->expired()) {
          ::freeaddrinfo(res);
          GFLOW_THROW(kPeerLost, kNetCtx)
              << "connect to " << what << " at " << target << " refused: " << lastWhy;
        }
        if (!retryableConnectError(err)) {
          ::freeaddrinfo(res);
          GFLOW_THROW(kInternal, kNetCtx)
              << "connect to " << what << " at " << target << " failed: " << lastWhy;
        }
      }
      ::freeaddrinfo(res);
    } else if (gai == EAI_AGAIN) {
      lastWhy = gai_strerror(gai);  // DNS not ready yet: worth retrying
    } else {
      GFLOW_THROW(kInvalidArgument, kNetCtx)
          << "cannot resolve " << what << " host '" << host << "': " << gai_strerror(gai);
    }
    int left = deadline.remainingMs();
    if (left == 0) break;
    int sleepMs = std::min(left, backoffMs / 2 + static_cast<int>(rng() % (backoffMs / 2 + 1)));
    std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
    backoffMs = std::min(backoffMs * 2, 1000);
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  GFLOW_THROW(kTimeout, kNetCtx) << "could not connect to " << what << " at " << target
                                 << " within " << waited << " ms (last error: " << lastWhy
                                 << "); is it running and reachable?";
}

void setNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  GFLOW_SYSCHECK(flags, "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  GFLOW_SYSCHECK(::fcntl(fd, F_SETFL, flags), "fcntl(F_SETFL)");
}

void setNoDelay(int fd) {
  int one = 1;
  GFLOW_SYSCHECK(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)),
                 "setsockopt(TCP_NODELAY)");
}

void setBufferSizes(int fd, int bytes) {
  // Best effort: the kernel clamps to net.core.[rw]mem_max, which is fine.
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)) < 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes)) < 0) {
    GFLOW_LOG(DEBUG) << "setting socket buffers to " << bytes
                     << " bytes failed: " << detail::errnoString(errno);
  }
}

void sendAll(int fd, const void* data, size_t len, Deadline deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    int err = errno;
    if (n < 0 && err == EINTR) continue;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
      if (!waitFor(fd, POLLOUT, deadline)) {
        GFLOW_THROW(kTimeout, kNetCtx) << "send to " << peerAddress(fd) << " timed out after "
                                       << done << " of " << len << " bytes";
      }
      continue;
    }
    if (n < 0 && peerLostError(err)) {
      GFLOW_THROW(kPeerLost, kNetCtx) << "connection to " << peerAddress(fd)
                                      << " lost while sending: " << detail::errnoString(err);
    }
    GFLOW_THROW(kInternal, kNetCtx)
        << "send to " << peerAddress(fd) << " failed: " << detail::errnoString(err);
  }
}

void recvAll(int fd, void* data, size_t len, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      GFLOW_THROW(kPeerLost, kNetCtx) << "connection closed by " << peerAddress(fd) << " after "
                                      << done << " of " << len << " bytes";
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (!waitFor(fd, POLLIN, deadline)) {
        GFLOW_THROW(kTimeout, kNetCtx) << "receive from " << peerAddress(fd) << " timed out after "
                                       << done << " of " << len << " bytes";
      }
      continue;
    }
    if (peerLostError(err)) {
      GFLOW_THROW(kPeerLost, kNetCtx) << "connection to " << peerAddress(fd)
                                      << " lost while receiving: " << detail::errnoString(err);
    }
    GFLOW_THROW(kInternal, kNetCtx)
        << "receive from " << peerAddress(fd) << " failed: " << detail::errnoString(err);
  }
}

std::string peerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0) return "unknown peer";
  return formatAddress(reinterpret_cast<sockaddr*>(&ss));
}

}  // namespace gflow::net
