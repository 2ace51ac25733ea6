// Wire format of the TCP transport. Every frame starts with a fixed 72-byte
// header; DATA frames carry one fragment of a message, ERROR frames tell a peer
// that this rank failed. Everything received is validated before it is used:
// a peer can make an op fail, never make a rank crash or allocate unbounded
// memory.
#pragma once

#include <cstdint>
#include <cstring>

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
// Single copy between the ranks of one host (tcp_single_copy.cc), for a
// pair that agreed on it while connecting (Hello, HelloReply):
//   RENDEZVOUS: a message (group, index, msgLen, env as DATA) whose payload
//     stays in the sender's memory at address `offset`; no payload follows.
//     The receiver reads it (process_vm_readv) once a receive is posted and
//     answers READ (group, index, msgLen), which completes the send.
constexpr uint16_t kFrameRendezvous = 6;
constexpr uint16_t kFrameRead = 7;
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
};
static_assert(sizeof(FrameHeader) == 72, "frame header layout");

// Where a peer finds this process, for single copy: the peer reads `nonce`
// at `nonceAddr` in process `pid`, which ties the pid to this rank. All zero
// when this rank does not offer single copy.
struct LocalIdentity {
  uint64_t hostHash;  // ContextOptions::hostHash: a peer of another host ignores it
  uint64_t pid;
  uint64_t nonceAddr;
  uint64_t nonce;
};
static_assert(sizeof(LocalIdentity) == 32, "local identity layout");

// Connection hello sent by the connecting side after authentication.
constexpr uint32_t kHelloMagic = 0x4c454847;  // "GHEL"
struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  int32_t socketIndex;
  int32_t socketsPerPeer;
  uint64_t commId;
  LocalIdentity local;  // the connecting rank's
};
static_assert(sizeof(Hello) == 64, "hello layout");
// The accepting side's answer: whether it accepts the connection, whether
// it reads the connecting rank's memory, and its own identity. The
// connecting rank then sends one byte: whether it reads the acceptor's.
struct HelloReply {
  uint8_t ok;
  uint8_t readsYou;
  uint8_t reserved[6];
  LocalIdentity local;
};
static_assert(sizeof(HelloReply) == 40, "hello reply layout");
constexpr uint32_t kProtocolVersion = 3;  // 3: single copy between local ranks

}  // namespace gflow::transport::tcp
