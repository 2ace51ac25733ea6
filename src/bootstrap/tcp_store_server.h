// The TCP store server (private to src/bootstrap/; TcpStore owns one on rank 0).
//
// One thread runs an epoll loop over non-blocking sockets and never blocks on a
// single client. A get/wait whose keys are missing parks its connection
// (registered under each missing key) and is answered when a set/add
// completes the keys or the request's own timeout passes. New connections are
// accepted and authenticated by a net::HandshakeAcceptor (a thread per
// handshake, at most kMaxHandshakes at once, each under the handshake
// timeout), because the handshake blocks and a silent peer must not stall the
// loop; once authenticated the socket is handed to the loop and joins it. Everything a peer can
// make the server hold is capped: connections, frame sizes, stored bytes, and
// a connection is not read while its previous answer is pending. A frame that
// breaks the protocol closes only that connection, with a WARN naming the peer
// and the fault.
//
// What a key proves: that its writer holds the job token, nothing more. Any
// token holder may read and write any key, so every reader treats a value
// as a claim to check (a data address leads to a token handshake and a
// Hello check, a shm segment must prove itself, a failure report is cut and
// made printable); docs/errors.md, Security.
//
// Thread safety: construct and destroy from one thread; the destructor stops
// the acceptor (unblocking pending handshakes) and the loop, and joins every
// thread. The loop's state is the loop thread's alone (loop_); the
// handshake threads hand it sockets through arrivals_ (arrivalsMutex_).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/store_protocol.h"
#include "common/deadline.h"
#include "common/handshake_acceptor.h"
#include "common/socket.h"
#include "common/thread_annotations.h"

namespace gflow::bootstrap {

class TcpStoreServer {
 public:
  using Value = std::shared_ptr<const std::vector<uint8_t>>;

  // Listens on host:port (port 0: any free port). Throws kInvalidArgument
  // when the address cannot be bound.
  TcpStoreServer(const std::string& host, uint16_t port, std::string token,
                 std::chrono::milliseconds handshakeTimeout);
  ~TcpStoreServer();
  uint16_t port() const { return port_; }

 private:
  struct Conn {
    uint64_t id = 0;
    net::Socket sock;
    std::string peer;
    bool dead = false;
    std::vector<uint8_t> in;  // received, not yet consumed
    std::vector<uint8_t> outHead;
    Value outBody;  // shared with the stored value: a GET to many clients copies nothing
    size_t outPos = 0;
    bool parked = false;
    proto::Op parkedOp = proto::Op::kGet;
    std::vector<std::string> waitKeys;
    Deadline deadline = Deadline::never();
    uint32_t armed = 0;  // epoll events registered for the socket
    bool outPending() const { return outPos < outHead.size() + (outBody ? outBody->size() : 0); }
  };
  struct Arrival {  // authenticated by the acceptor, not yet in the loop
    net::Socket sock;
    std::string peer;
  };

  void run();  // the loop thread's body
  void loopOnce() GFLOW_REQUIRES(loop_);
  // A handshake thread.
  void onAuthenticated(net::HandshakeAcceptor::Handshake& h) GFLOW_EXCLUDES(arrivalsMutex_);
  void admitArrivals() GFLOW_REQUIRES(loop_) GFLOW_EXCLUDES(arrivalsMutex_);
  void wakeLoop();                                            // any thread
  bool arm(int fd, uint64_t tag, uint32_t events, bool add);  // false: errno set
  void onEvents(Conn& c, uint32_t events) GFLOW_REQUIRES(loop_);
  void readSome(Conn& c) GFLOW_REQUIRES(loop_);
  void processFrames(Conn& c) GFLOW_REQUIRES(loop_);
  void dispatch(Conn& c, proto::Op op, const uint8_t* body, size_t len) GFLOW_REQUIRES(loop_);
  // One handler per request op; each throws ProtocolError on a malformed body.
  void onSet(Conn& c, proto::Reader& r) GFLOW_REQUIRES(loop_);
  void onGet(Conn& c, proto::Reader& r) GFLOW_REQUIRES(loop_);
  void onWait(Conn& c, proto::Reader& r) GFLOW_REQUIRES(loop_);
  void onAdd(Conn& c, proto::Reader& r) GFLOW_REQUIRES(loop_);
  void onCheck(Conn& c, proto::Reader& r) GFLOW_REQUIRES(loop_);
  void onMultiGet(Conn& c, proto::Reader& r) GFLOW_REQUIRES(loop_);
  void onMultiSet(Conn& c, proto::Reader& r) GFLOW_REQUIRES(loop_);
  // kMultiGet's answer for `keys`, all present.
  void respondValues(Conn& c, const std::vector<std::string>& keys) GFLOW_REQUIRES(loop_);
  void park(Conn& c, proto::Op op, std::vector<std::string> keys, uint64_t timeoutMs)
      GFLOW_REQUIRES(loop_);
  void unpark(Conn& c) GFLOW_REQUIRES(loop_);
  void notifyKey(const std::string& key) GFLOW_REQUIRES(loop_);
  void expireWaiters() GFLOW_REQUIRES(loop_);
  void respond(Conn& c, proto::Status status, const std::vector<uint8_t>& body,
               Value value = nullptr) GFLOW_REQUIRES(loop_);
  void flush(Conn& c) GFLOW_REQUIRES(loop_);
  void close(Conn& c, const std::string& why, bool warn) GFLOW_REQUIRES(loop_);
  std::vector<std::string> missingOf(const std::vector<std::string>& keys) const
      GFLOW_REQUIRES(loop_);

  net::Socket wake_;  // eventfd: stop requests and authenticated arrivals
  net::Socket epoll_;
  // epoll tag of wake_; any other tag is a connection id (ids start above it).
  static constexpr uint64_t kWakeTag = 0;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::unique_ptr<net::HandshakeAcceptor> acceptor_;

  Mutex arrivalsMutex_;
  std::vector<Arrival> arrivals_ GFLOW_GUARDED_BY(arrivalsMutex_);

  // Loop-thread state.
  ThreadRole loop_;
  std::map<uint64_t, Conn> conns_ GFLOW_GUARDED_BY(loop_);
  std::unordered_map<std::string, Value> data_ GFLOW_GUARDED_BY(loop_);
  // Key -> parked conn ids.
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_ GFLOW_GUARDED_BY(loop_);
  // Conns whose buffered frames may now proceed.
  std::vector<uint64_t> runnable_ GFLOW_GUARDED_BY(loop_);
  // Conns whose epoll events may need re-arming.
  std::vector<uint64_t> touched_ GFLOW_GUARDED_BY(loop_);
  // Closed conns, erased at the end of the iteration.
  std::vector<uint64_t> dead_ GFLOW_GUARDED_BY(loop_);
  std::set<std::pair<Deadline::Clock::time_point, uint64_t>> parkedByDeadline_
      GFLOW_GUARDED_BY(loop_);
  size_t storedBytes_ GFLOW_GUARDED_BY(loop_) = 0;
  uint64_t nextId_ GFLOW_GUARDED_BY(loop_) = 1;
};

}  // namespace gflow::bootstrap
