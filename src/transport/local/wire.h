// What two ranks of one host send each other while agreeing on a local
// link (host.h), over the authenticated socket of the wire that connects
// them, right after its hello. Fixed layouts; everything received is
// checked before it is used.
#pragma once

#include <cstdint>

namespace gflow::transport::local {

// Where a peer finds this process (all zero when this rank offers no local
// link). The peer proves that `pid` is this rank's by a challenge: it sends
// a random value over the authenticated connection, this rank writes a
// proof of it (Host::proofOf) at `proofAddr`, and the peer reads that back
// from process `pid`. `ticketBase`: the array of live-send tickets a reader
// checks after reading a message (Link::readMessage).
struct Identity {
  uint64_t hostHash;  // a peer of another host ignores the rest
  uint64_t pid;
  uint64_t proofAddr;
  uint64_t ticketBase;
};
static_assert(sizeof(Identity) == 32, "local identity layout");

// What each rank leaves in its memory for one peer while they agree: the
// proof of the peer's challenge, which ties its pid to this rank, and a
// random secret that never crosses the wire: only a process that reads
// this rank's memory learns it.
struct ProofSlot {
  uint64_t proof;
  uint64_t secret;
};
static_assert(sizeof(ProofSlot) == 16, "proof slot layout");

// Each side's word: `flags` (kReads: it reads the other's memory;
// kTakesSingleCopy: it takes the other's messages that way) and, as the
// proof of kReads, the secret it read from the other's ProofSlot (0 when
// it reads nothing). A claim without the right echo counts as none.
struct ReadsClaim {
  uint8_t flags;
  uint8_t reserved[7];
  uint64_t echo;
};
static_assert(sizeof(ReadsClaim) == 16, "reads claim layout");
constexpr uint8_t kReads = 1, kTakesSingleCopy = 2;

// A pair whose ranks read each other then offers its rings (ring.h): each
// side's segment (a memfd the peer opens through /proc/<pid>/fd) and its
// ring's capacity; 0 and 0 when it offers none. Then each says in one byte
// whether it mapped the other's.
struct RingOffer {
  uint32_t fd;
  uint32_t capacity;
};
static_assert(sizeof(RingOffer) == 8, "ring offer layout");

}  // namespace gflow::transport::local
