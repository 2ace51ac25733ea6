// HandshakeAcceptor: the one place that accepts authenticated connections.
// The bootstrap store server and the TCP transport's data port both use it.
//
// It owns a listening socket and one accept thread. Every accepted
// connection runs its handshake on a thread of its own, so a peer that
// connects and then stays silent (a port scanner, a health check, a hung
// process) holds up only itself. A handshake is auth::authenticate with the
// job token followed by the owner's callback (for example the transport's
// Hello). Both run under one deadline, `Options::timeout` after the accept;
// a peer that is silent or sends garbage fails the handshake, is logged at
// WARN ("<name>: rejected connection from <peer>: <why>") and its socket is
// closed.
//
// At most `Options::maxPending` handshakes run at once, so a stranger
// opening many connections costs a bounded number of threads and
// descriptors. At the bound, a new connection waiting in the listen backlog
// makes room by evicting the oldest handshake that has not authenticated yet
// (a stranger: a legitimate peer authenticates within milliseconds of its
// connect), so idle strangers cannot crowd out a real peer however many
// they hold; handshakes past authentication are never evicted, and when all
// are, new connections wait in the backlog until one finishes or times out.
// Running out of descriptors pauses accepting for a moment (WARN) rather
// than failing.
//
// Thread safety: construct, stop() and destroy from one owner thread;
// pending() from any thread. The callback runs on handshake threads,
// concurrently with itself; it must not call stop(), and it should block only
// in I/O on the handshake's socket, which stop() can interrupt.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/deadline.h"
#include "common/socket.h"

namespace gflow::net {

class HandshakeAcceptor {
 public:
  // One accepted connection while its handshake runs. The acceptor owns the
  // socket until take(), so stop() can interrupt any I/O on fd() (a blocked
  // send/recv fails with kPeerLost).
  class Handshake {
   public:
    int fd() const { return sock_.fd(); }
    const std::string& peer() const { return peer_; }  // "ip:port", for messages
    // Authentication and the callback together must finish by this time.
    Deadline deadline() const { return deadline_; }
    // Hands the socket to the caller, after which stop() no longer touches
    // it (so take() is the callback's last blocking step). Returns an invalid
    // Socket when stop() has begun (the caller drops the connection).
    Socket take();

   private:
    friend class HandshakeAcceptor;
    Handshake(HandshakeAcceptor* owner, Socket sock, std::string peer, Deadline deadline)
        : owner_(owner), sock_(std::move(sock)), peer_(std::move(peer)), deadline_(deadline) {}

    HandshakeAcceptor* owner_;
    Socket sock_;
    std::string peer_;
    Deadline deadline_;
    std::thread thread_;
    std::atomic<bool> done_{false};
    std::atomic<bool> authenticated_{false};  // past the token check
    bool evicted_ = false;                    // shut down to make room (mutex_)
  };

  // Runs on the handshake's thread after the token check passed. It may
  // exchange more messages on h.fd() (honouring h.deadline()) and calls
  // h.take() to keep the connection. Throwing gflow::Error rejects the peer
  // (logged with e.detail()); returning without take() closes the socket.
  using Callback = std::function<void(Handshake& h)>;

  struct Options {
    std::string name;   // log prefix: "store", "rank 3"
    std::string token;  // job token and label for auth::authenticate
    std::string label;
    std::chrono::milliseconds timeout{10000};  // per handshake, from its accept
    size_t maxPending = 64;
  };

  // Starts accepting on `listener` (bound and listening; made non-blocking).
  HandshakeAcceptor(Socket listener, Options options, Callback callback);
  // stop().
  ~HandshakeAcceptor();
  HandshakeAcceptor(const HandshakeAcceptor&) = delete;
  HandshakeAcceptor& operator=(const HandshakeAcceptor&) = delete;

  // Stops accepting, interrupts the handshakes in flight (shutting their
  // sockets down) and joins every thread. Prompt: it waits for no peer.
  // Idempotent; callbacks have all returned when it returns.
  void stop();

  // Handshakes started and not yet reaped (for tests and diagnostics).
  size_t pending() const;

 private:
  void acceptLoop();
  // Waits for a wake-up or (`listening`) a connection in the backlog; false:
  // stop requested. *pending: a connection is waiting to be accepted.
  bool waitForWork(bool listening, int timeoutMs, bool* pending);
  // The oldest handshake that has not authenticated and is still running
  // (mutex_ held), and its age in ms (-1: none).
  Handshake* oldestStranger();
  int64_t oldestStrangerAgeMs();
  // At the bound: shuts the oldest stranger's socket down (its thread ends
  // at once and wakes the accept loop).
  void evictOldestStranger();
  bool acceptOne();  // false: nothing to accept now
  void start(Socket sock, std::string peer);
  void runHandshake(Handshake* h);
  void reap(bool all);
  void wake();

  const Options options_;
  const Callback callback_;
  Socket listen_;
  Socket wake_;  // eventfd: stop() and finished handshakes wake the accept thread
  std::thread thread_;
  Deadline acceptPausedUntil_ = Deadline::after(std::chrono::milliseconds(0));

  mutable std::mutex mutex_;  // guards stopping_, handshakes_ and Handshake::sock_ moves
  bool stopping_ = false;
  std::list<std::unique_ptr<Handshake>> handshakes_;
};

}  // namespace gflow::net
