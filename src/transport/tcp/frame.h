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
};
static_assert(sizeof(Hello) == 32, "hello layout");
constexpr uint32_t kProtocolVersion = 2;  // 2: error reports name the culprit

}  // namespace gflow::transport::tcp
