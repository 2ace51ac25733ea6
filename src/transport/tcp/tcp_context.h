// TCP transport: one or more non-blocking sockets per peer, an epoll set
// driven by the waiting thread, eager sends and tag-matched receives.
//
// Reads go through a small per-connection read-ahead buffer, so a small
// message costs one recv, and a recv that comes back short is not followed
// by one that would block: level-triggered epoll reports the socket again.
//
// Matching, staging accounting and failure live in the Engine
// (transport/engine.h); this file is the wire. Receives posted before their
// data arrives are filled in place (zero copy). Data that arrives first is
// staged (bounded by GFLOW_UNEXPECTED_LIMIT per peer; past that the socket is
// not read until a receive is posted, which gives back-pressure instead of
// unbounded memory).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/socket.h"
#include "transport/engine.h"
#include "transport/tcp/frame.h"
#include "transport/wait_policy.h"

namespace gflow::transport::tcp {

class TcpContext final : public Engine {
 public:
  explicit TcpContext(const ContextOptions& options);
  ~TcpContext() override;

  RequestPtr isend(int peer, const void* data, size_t bytes, Tag tag, const Envelope& env) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) override;
  void notifyPeers(const Error& error) override;

 private:
  // One message being received: posted by irecv, or announced by the first
  // fragment header to arrive, or both.
  struct RecvMsg : Message {
    uint64_t claimed = 0;   // payload bytes announced by fragment headers
    uint64_t received = 0;  // payload bytes read
    char* buf = nullptr;    // where fragments land (user buffer or staging)
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
    // Read-ahead: headers and small payloads come out of the socket with
    // one recv; large payloads are read straight into their destination.
    std::unique_ptr<char[]> ahead;
    size_t aheadPos = 0, aheadLen = 0;
    bool drained = false;      // the last recv came back short: wait for epoll
    bool aheadQueued = false;  // in aheadPending_
  };

  struct PeerState {
    std::vector<std::unique_ptr<Conn>> conns;
    size_t nextConn = 0;
    bool closed = false;  // every connection of this peer saw EOF
  };

  // Connection setup (tcp_connect.cc).
  void connectAll(const ContextOptions& options);
  void addConnection(int peer, int index, net::Socket sock);

  // Progress.
  void progress(int timeoutMs);
  void handleReadable(Conn& c);
  bool readHeader(Conn& c);   // false: would block
  bool readPayload(Conn& c);  // false: would block
  enum class Fill { kData, kWouldBlock, kClosed };
  Fill fill(Conn& c, char* dst, size_t cap, size_t* got);
  size_t takeAhead(Conn& c, char* dst, size_t n);
  void startFragment(Conn& c);
  void finishFragment(Conn& c);
  void handleErrorFrame(Conn& c);
  void handleClosed(Conn& c);
  void tuneLowat(Conn& c);
  void sendControl(Conn& c, uint16_t type);
  bool hasPendingWith(int peer) const;
  [[noreturn]] void failLost(int peer, const std::string& what);
  void flush(Conn& c);
  void updateInterest(Conn& c);
  void completeRecv(int peer, RecvMsg* m);
  void resumePaused(PeerState& p);
  void enqueue(Conn& c, SendItem item);

  // Engine hooks.
  std::unique_ptr<Message> newMessage() override { return std::make_unique<RecvMsg>(); }
  void failWire(const Error& first) override;
  void wake() override;
  void pollOnce() override { progress(0); }
  void waitUntilDone(const RequestPtr& req, Deadline deadline) override;

  uint64_t stripeMin_;
  WaitPolicy waitPolicy_;
  int socketsPerPeer_ = 1;
  uint64_t commId_ = 0;

  net::Socket epoll_;
  net::Socket wakeFd_;  // eventfd: abort() wakes the waiter
  std::vector<std::unique_ptr<PeerState>> peers_;
  // Connections left with frames in their read-ahead (handleReadable's
  // bound on rounds): epoll would not report them again, progress() does.
  std::vector<Conn*> aheadPending_;
};

}  // namespace gflow::transport::tcp
