// See handshake_acceptor.h for the contract.
#include "common/handshake_acceptor.h"

#include "common/resource_counts.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <system_error>
#include <vector>

#include "common/auth.h"
#include "common/check.h"
#include "common/logging.h"

namespace gflow::net {
namespace {

// How long accepting pauses when the process is out of descriptors or
// memory: the connection stays in the backlog, so retrying at once would spin.
constexpr std::chrono::milliseconds kAcceptPause{100};
// A handshake younger than this is never evicted: a legitimate peer may be
// between its connect and its first authentication message.
constexpr int64_t kMinEvictAgeMs = 50;

}  // namespace

Socket HandshakeAcceptor::Handshake::take() {
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  if (owner_->stopping_) return Socket();
  return std::move(sock_);
}

HandshakeAcceptor::HandshakeAcceptor(Socket listener, Options options, Callback callback)
    : options_(std::move(options)), callback_(std::move(callback)), listen_(std::move(listener)) {
  setNonBlocking(listen_.fd(), true);
  wake_ = Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  GFLOW_SYSCHECK(wake_.fd(), "eventfd");
  resources::threadStarted();
  thread_ = std::thread([this] { acceptLoop(); });
}

HandshakeAcceptor::~HandshakeAcceptor() {
  stop();
}

void HandshakeAcceptor::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // A handshake blocked on a silent peer returns at once with kPeerLost.
    for (auto& h : handshakes_) {
      if (h->sock_.valid()) ::shutdown(h->sock_.fd(), SHUT_RDWR);
    }
  }
  wake();
  if (thread_.joinable()) thread_.join();
}

size_t HandshakeAcceptor::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return handshakes_.size();
}

void HandshakeAcceptor::wake() {
  uint64_t one = 1;
  ssize_t r = ::write(wake_.fd(), &one, sizeof(one));
  (void)r;  // the counter cannot overflow in practice; a lost wake-up only delays a reap
}

void HandshakeAcceptor::acceptLoop() {
  for (;;) {
    reap(false);
    const bool room = pending() < options_.maxPending;
    // At the bound, listen only while a stranger can make room (one that is
    // too young to evict yet can in a moment).
    const int64_t strangerAge = room ? 0 : oldestStrangerAgeMs();
    const bool listening = acceptPausedUntil_.expired() && (room || strangerAge >= kMinEvictAgeMs);
    int timeoutMs = acceptPausedUntil_.expired() ? -1 : acceptPausedUntil_.remainingMs() + 1;
    if (!room && strangerAge >= 0 && strangerAge < kMinEvictAgeMs) {
      timeoutMs = static_cast<int>(kMinEvictAgeMs - strangerAge) + 1;
    }
    bool waiting = false;
    if (!waitForWork(listening, timeoutMs, &waiting)) break;
    if (!waiting) continue;
    if (!room) {
      evictOldestStranger();  // its end wakes this loop, which then accepts
      continue;
    }
    while (pending() < options_.maxPending && acceptOne()) {
    }
  }
  reap(true);
}

HandshakeAcceptor::Handshake* HandshakeAcceptor::oldestStranger() {
  for (auto& h : handshakes_) {  // oldest first
    if (!h->evicted_ && !h->done_.load(std::memory_order_acquire) &&
        !h->authenticated_.load(std::memory_order_acquire) && h->sock_.valid()) {
      return h.get();
    }
  }
  return nullptr;
}

int64_t HandshakeAcceptor::oldestStrangerAgeMs() {
  std::lock_guard<std::mutex> lock(mutex_);
  const Handshake* h = oldestStranger();
  return h ? options_.timeout.count() - h->deadline_.remainingMs() : -1;
}

void HandshakeAcceptor::evictOldestStranger() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Handshake* h = oldestStranger()) {
    h->evicted_ = true;
    ::shutdown(h->sock_.fd(), SHUT_RDWR);
  }
}

bool HandshakeAcceptor::waitForWork(bool listening, int timeoutMs, bool* pending) {
  pollfd fds[2] = {{wake_.fd(), POLLIN, 0}, {listen_.fd(), POLLIN, 0}};
  int n = ::poll(fds, listening ? 2 : 1, timeoutMs);
  *pending = listening && n > 0 && (fds[1].revents & POLLIN);
  if (n < 0 && errno != EINTR) {
    GFLOW_LOG(ERROR) << options_.name
                     << ": poll on the listening socket failed: " << detail::errnoString(errno);
    acceptPausedUntil_ = Deadline::after(kAcceptPause);
  }
  if (fds[0].revents & POLLIN) {
    uint64_t count;
    while (::read(wake_.fd(), &count, sizeof(count)) > 0) {
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return !stopping_;
}

bool HandshakeAcceptor::acceptOne() {
  for (;;) {
    int fd = ::accept4(listen_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      Socket s(fd);
      setNonBlocking(fd, false);
      std::string peer = peerAddress(fd);
      start(std::move(s), std::move(peer));
      return true;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return false;
    // Out of descriptors or memory: the pending connection stays in the
    // backlog, so pause accepting instead of spinning on it.
    GFLOW_LOG(WARN) << options_.name << ": cannot accept connections: " << detail::errnoString(err)
                    << (err == EMFILE || err == ENFILE ? " (raise 'ulimit -n')" : "");
    acceptPausedUntil_ = Deadline::after(kAcceptPause);
    return false;
  }
}

void HandshakeAcceptor::start(Socket sock, std::string peer) {
  auto owned = std::unique_ptr<Handshake>(
      new Handshake(this, std::move(sock), std::move(peer), Deadline::after(options_.timeout)));
  Handshake* h = owned.get();
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return;
  try {
    resources::threadStarted();
    h->thread_ = std::thread([this, h] { runHandshake(h); });
  } catch (const std::system_error& e) {
    GFLOW_LOG(WARN) << options_.name << ": dropping connection from " << h->peer_
                    << ": cannot start its handshake: " << e.what();
    return;
  }
  handshakes_.push_back(std::move(owned));
}

void HandshakeAcceptor::runHandshake(Handshake* h) {
  try {
    auth::authenticate(h->fd(), options_.token, options_.label, /*initiator=*/false, h->deadline());
    h->authenticated_.store(true, std::memory_order_release);
    callback_(*h);
  } catch (const std::exception& e) {
    const Error* ge = dynamic_cast<const Error*>(&e);
    const std::string why = ge ? ge->detail() : std::string(e.what());
    bool stopping, evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping = stopping_;
      evicted = h->evicted_;
    }
    if (evicted) {
      GFLOW_LOG(WARN) << options_.name << ": dropped connection from " << h->peer_
                      << ": it had not authenticated when " << options_.maxPending
                      << " handshakes were pending and another connection came in";
    } else if (stopping) {
      GFLOW_LOG(DEBUG) << options_.name << ": handshake with " << h->peer_
                       << " interrupted by shutdown: " << why;
    } else {
      GFLOW_LOG(WARN) << options_.name << ": rejected connection from " << h->peer_ << ": " << why;
    }
  }
  {
    // Close a connection the callback did not keep now, not at the reap.
    std::lock_guard<std::mutex> lock(mutex_);
    h->sock_.close();
  }
  h->done_.store(true, std::memory_order_release);
  wake();
}

void HandshakeAcceptor::reap(bool all) {
  std::vector<std::unique_ptr<Handshake>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = handshakes_.begin(); it != handshakes_.end();) {
      if (all || (*it)->done_.load(std::memory_order_acquire)) {
        finished.push_back(std::move(*it));
        it = handshakes_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // reap(true) runs after stop() shut every socket down, so these joins are prompt.
  for (auto& h : finished) h->thread_.join();
}

}  // namespace gflow::net
