// Wire format of the TCP transport. Every frame starts with a fixed 96-byte
// header; DATA frames carry one fragment of a message, ERROR frames tell a peer
// that this rank failed. Everything received is validated before it is used:
// a peer can make an op fail, never make a rank crash or allocate unbounded
// memory.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/local/wire.h"
#include "transport/transport.h"

namespace gflow::transport::tcp {

constexpr uint32_t kFrameMagic = 0x46444647;  // "GFDF"
constexpr uint16_t kFrameData = 1;
constexpr uint16_t kFrameError = 2;
// Liveness probe sent when a deadline passes: a rank that is inside gflow
// answers PING with PONG even while it waits on someone else, so a timeout
// blames the rank that is really stuck, not a live one waiting in turn.
constexpr uint16_t kFramePing = 3;
constexpr uint16_t kFramePong = 4;
// A rank will not run op `group` (its call's arguments were rejected); the
// payload says why. Not a failure of the sender (transport.h, reject).
constexpr uint16_t kFrameReject = 5;
// Rendezvous (tcp_rendezvous.cc):
//   RENDEZVOUS: a message (group, index, msgLen, env as DATA) whose payload
//     stays with the sender for now; no payload follows. With `offset` 0
//     it crosses the wire once the receiver has answered CLEAR; otherwise
//     `offset` is its address in the sender's memory and `reserved` its
//     ticket (single copy, for a pair with a local link that agreed on it:
//     local/link.h); the receiver reads it through the link once a receive
//     is posted and answers READ, which completes the send.
//   CLEAR (group, index, msgLen): a receive of that size is posted; sent on
//     a RENDEZVOUS for it, or ahead of one when the receive is large.
//   READ (group, index, msgLen): a single-copy message has been read.
constexpr uint16_t kFrameRendezvous = 6;
constexpr uint16_t kFrameRead = 7;
constexpr uint16_t kFrameClear = 8;
// Over the socket of a pair whose frames go over a polled stream
// (tcp_polled.cc): the stream has something for a receiver that sleeps in
// epoll. No payload; nothing else.
constexpr uint16_t kFrameDoorbell = 9;
// FrameHeader::reserved of a DATA frame sent on a CLEAR after its
// RENDEZVOUS (which may arrive after it, on another connection).
constexpr uint16_t kReleased = 1;
// A message larger than this is refused outright (64 TiB).
constexpr uint64_t kMaxMessageBytes = 1ull << 46;
// ERROR and REJECT frame payload bound.
constexpr uint64_t kMaxErrorPayload = 4096;

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t reserved;
  uint64_t group;
  uint64_t index;
  uint64_t msgLen;   // whole message
  uint64_t offset;   // this fragment's offset in the message
  uint64_t fragLen;  // this fragment's payload bytes
  uint64_t env[3];
  uint64_t stamp[3];  // DATA, RENDEZVOUS, CLEAR, READ: the sender's ArrivalStamp (arrivals.h)
};
static_assert(sizeof(FrameHeader) == 96, "frame header layout");

// Connection hello sent by the connecting side after authentication.
constexpr uint32_t kHelloMagic = 0x4c454847;  // "GHEL"
struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  int32_t socketIndex;
  int16_t socketsPerPeer;
  int16_t lazy;  // 1: connections on demand (GFLOW_CONNECT, inbound.h)
  uint64_t commId;
  local::Identity local;  // the connecting rank's (socket 0; local/host.h)
};
static_assert(sizeof(Hello) == 64, "hello layout");
// The accepting side's answer: whether it accepts the connection, its own
// identity (zero unless both offer a local link on one host) and a
// challenge for the connecting rank (0: none). The local link's agreement
// follows on socket 0 (local::Host::agreeAsAcceptor, agreeAsDialer).
struct HelloReply {
  uint8_t ok;
  uint8_t reserved[7];
  local::Identity local;
  uint64_t challenge;
};
static_assert(sizeof(HelloReply) == 48, "hello reply layout");
// 3: single copy between local ranks; 4: local rings; 5: arrival stamps;
// 6: a reader proves that it reads (ProofSlot, ReadsClaim); 7: an op's
// envelope carries its route (path and algorithm, backend/route.h); 8:
// connections on demand (Hello::lazy; HelloReply::ok 2, crossed: inbound.h)
constexpr uint32_t kProtocolVersion = 8;

}  // namespace gflow::transport::tcp
