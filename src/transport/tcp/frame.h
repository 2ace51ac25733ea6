// Wire format of the TCP transport. Every frame starts with a fixed 96-byte
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
// Rendezvous (tcp_rendezvous.cc):
//   RENDEZVOUS: a message (group, index, msgLen, env as DATA) whose payload
//     stays with the sender for now; no payload follows. With `offset` 0
//     it crosses the wire once the receiver has answered CLEAR; otherwise
//     `offset` is its address in the sender's memory (single copy, for a
//     pair of one host that agreed on it while connecting: Hello,
//     HelloReply), the receiver reads it (process_vm_readv) once a receive
//     is posted and answers READ, which completes the send.
//   CLEAR (group, index, msgLen): a receive of that size is posted; sent on
//     a RENDEZVOUS for it, or ahead of one when the receive is large.
//   READ (group, index, msgLen): a single-copy message has been read.
constexpr uint16_t kFrameRendezvous = 6;
constexpr uint16_t kFrameRead = 7;
constexpr uint16_t kFrameClear = 8;
// Over the socket of a pair that talks through its local ring
// (local_ring.h): the ring has something for a receiver that sleeps in
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

// Where a peer finds this process, for single copy (all zero when this
// rank does not offer it). The peer proves that `pid` is this rank's by a
// challenge (tcp_connect.cc): it sends a random value over the
// authenticated connection, this rank writes a proof of it (singleCopyProof)
// at `proofAddr`, and the peer reads that back from process `pid`.
// `ticketBase`: the array of live-send tickets a reader checks after
// reading a message (tcp_rendezvous.cc).
struct LocalIdentity {
  uint64_t hostHash;  // ContextOptions::hostHash: a peer of another host ignores it
  uint64_t pid;
  uint64_t proofAddr;
  uint64_t ticketBase;
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
// The accepting side's answer: whether it accepts the connection, its own
// identity (zero unless both offer single copy on one host) and a challenge
// for the connecting rank (0: none). The single-copy agreement follows on
// socket 0 (tcp_connect.cc): the connecting rank writes its proof and sends
// its own challenge (8 bytes), each side then says whether it could read
// the other's proof (ReadsClaim).
struct HelloReply {
  uint8_t ok;
  uint8_t reserved[7];
  LocalIdentity local;
  uint64_t challenge;
};
static_assert(sizeof(HelloReply) == 48, "hello reply layout");
// What each rank leaves in its memory for one peer while they agree on
// single copy: the proof of the peer's challenge (singleCopyProof), which
// ties its pid to this rank, and a random secret that never crosses the
// wire: only a process that reads this rank's memory learns it.
struct ProofSlot {
  uint64_t proof;
  uint64_t secret;
};
static_assert(sizeof(ProofSlot) == 16, "proof slot layout");
// Each side's word on single copy: `flags` (kReads: it reads the other's
// memory; kTakesSingleCopy: it takes the other's messages that way) and,
// as the proof of kReads, the secret it read from the other's ProofSlot
// (0 when it reads nothing). A claim without the right echo counts as none.
struct ReadsClaim {
  uint8_t flags;
  uint8_t reserved[7];
  uint64_t echo;
};
static_assert(sizeof(ReadsClaim) == 16, "reads claim layout");
constexpr uint8_t kReads = 1, kTakesSingleCopy = 2;
// After the single-copy agreement, a pair whose ranks read each other's
// memory offers its local rings (tcp_local.cc): each side's segment (a
// memfd the peer opens through /proc/<pid>/fd) and its ring's capacity; 0
// and 0 when it offers none. Then each says in one byte whether it mapped
// the other's.
struct RingOffer {
  uint32_t fd;
  uint32_t capacity;
};
static_assert(sizeof(RingOffer) == 8, "ring offer layout");
// 3: single copy between local ranks; 4: local rings; 5: arrival stamps;
// 6: a reader proves that it reads (ProofSlot, ReadsClaim); 7: an op's
// envelope carries its route (path and algorithm, backend/route.h)
constexpr uint32_t kProtocolVersion = 7;

}  // namespace gflow::transport::tcp
