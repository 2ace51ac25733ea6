// TCP transport: one or more non-blocking sockets per peer, an epoll set
// driven by the waiting thread, eager sends and tag-matched receives.
//
// Receives posted before their data arrives are filled in place (zero copy).
// Data that arrives first is staged (bounded by GFLOW_UNEXPECTED_LIMIT per
// peer; past that the socket is not read until a receive is posted, which
// gives back-pressure instead of unbounded memory).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/socket.h"
#include "transport/common.h"
#include "transport/tcp/frame.h"
#include "transport/transport.h"

namespace gflow::transport::tcp {

class TcpContext final : public Context {
 public:
  explicit TcpContext(const ContextOptions& options);
  ~TcpContext() override;

  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t size) override;
  RequestPtr isend(int peer, const void* data, size_t bytes, Tag tag, const Envelope& env) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) override;
  void beginGroup(uint64_t group, const Envelope& env) override;
  void wait(const RequestPtr& req, Deadline deadline) override;
  bool test(const RequestPtr& req) override;
  void abort(const Error& error) override;
  void notifyPeers(const Error& error) override;
  std::shared_ptr<const Error> error() const override;
  PeerStats peerStats(int peer) const override;

 private:
  // One message being received: posted by irecv, or announced by the first
  // fragment header to arrive, or both.
  struct RecvMsg {
    Tag tag;
    Envelope env;
    uint64_t len = 0;
    uint64_t claimed = 0;             // payload bytes announced by fragment headers
    uint64_t received = 0;            // payload bytes read
    char* buf = nullptr;              // where fragments land (user buffer or staging)
    std::unique_ptr<char[]> staging;  // set while unexpected
    char* user = nullptr;             // the posted buffer
    RequestPtr req;                   // null until posted
  };

  struct SendMsg {
    RequestPtr req;
    int fragmentsLeft = 0;
  };

  struct SendItem {
    std::shared_ptr<SendMsg> msg;
    FrameHeader hdr;
    const char* payload = nullptr;
    size_t payloadLen = 0;
    size_t written = 0;  // bytes of header + payload written so far
  };

  struct Conn {
    net::Socket sock;
    int peer = -1;
    int index = 0;
    std::deque<SendItem> sendq;
    bool wantOut = false;
    bool paused = false;
    bool closed = false;  // the peer closed this connection (EOF)
    int lowat = 1;        // current SO_RCVLOWAT
    bool pongQueued = false;
    bool watched = true;  // registered with epoll (a paused, hung-up socket is not)
    // Receive state machine: header bytes, then the fragment payload.
    bool inPayload = false;
    FrameHeader hdr{};
    size_t hdrGot = 0;
    RecvMsg* cur = nullptr;
    char* dst = nullptr;
    uint64_t left = 0;
    std::vector<char> ctrl;  // ERROR frame payload
  };

  struct PeerState {
    std::vector<std::unique_ptr<Conn>> conns;
    size_t nextConn = 0;
    std::unordered_map<Tag, std::unique_ptr<RecvMsg>, TagHash> msgs;
    uint64_t unexpectedBytes = 0;
    bool closed = false;  // every connection of this peer saw EOF
    uint64_t pongs = 0;   // PONG frames received (liveness probes answered)
    std::atomic<uint64_t> bytesSent{0}, bytesReceived{0}, messagesSent{0}, messagesReceived{0};
  };

  // Connection setup (tcp_connect.cc).
  void connectAll(const ContextOptions& options);
  void addConnection(int peer, int index, net::Socket sock);

  // Progress.
  void progress(int timeoutMs);
  void handleReadable(Conn& c);
  bool readHeader(Conn& c);  // false: would block
  void startFragment(Conn& c);
  void finishFragment(Conn& c);
  void handleErrorFrame(Conn& c);
  void handleClosed(Conn& c);
  void tuneLowat(Conn& c);
  void sendControl(Conn& c, uint16_t type);
  [[noreturn]] void failTimeout(const RequestPtr& req, bool peerAlive);
  bool hasPendingWith(int peer) const;
  [[noreturn]] void failLost(int peer, const std::string& what);
  void flush(Conn& c);
  void updateInterest(Conn& c);
  void completeRecv(PeerState& p, RecvMsg* m);
  void resumePaused(PeerState& p);
  [[noreturn]] void fail(const Error& e);
  void checkFailed();
  void enqueue(Conn& c, SendItem item);

  uint64_t unexpectedLimit_;
  uint64_t stripeMin_;
  int spinUs_;
  int socketsPerPeer_ = 1;
  uint64_t commId_ = 0;
  std::chrono::milliseconds timeout_;

  net::Socket epoll_;
  net::Socket wakeFd_;  // eventfd: abort() wakes the waiter
  std::vector<std::unique_ptr<PeerState>> peers_;

  // An error report for an op this rank has not reached yet: raised when it
  // gets there, so an op that succeeded everywhere does not fail here.
  std::optional<Error> deferredError_;
  uint64_t deferredGroup_ = 0;

  uint64_t group_ = 0;
  Envelope groupEnv_{};
  bool groupActive_ = false;

  std::atomic<bool> failedFlag_{false};
  mutable std::mutex errorMutex_;
  std::shared_ptr<const Error> error_;
};

}  // namespace gflow::transport::tcp
