// This rank's side of its local links (link.h): the identity it offers to
// peers of its host, the agreement that proves each claim a peer makes,
// and the tickets of the sends it lends to peers by single copy.
//
// Which peer gets a link is decided here, per peer, while the wire
// connects (NCCL's canConnect): a peer that offers an identity of the same
// host and proves it (below) gets one; any other gets none and the wire's
// own path, so the choice never changes what a message delivers.
//
// What proves each claim (docs/errors.md, Security):
//   - the peer's Identity (same host, pid, proof slot): the challenge; this
//     rank reads the proof of its random challenge at the given address of
//     the given process, so the pid is the process at the other end and
//     this rank can read it;
//   - that the peer reads this rank (ReadsClaim): the echo of the secret
//     this rank left in its ProofSlot, which crosses no wire; without it
//     the peer gets no buffer address and no ring;
//   - its ring: both of the above, both ways; then its fd opens only through
//     /proc/<the verified pid>/fd, as a sealed memfd of at least the offered
//     size, its capacity must be a power of two in [4 KiB, 1 GiB], the
//     mapping is read-only, and the ring's words are checked on every use.
// The wire's own authentication (the job token) comes first: a stranger
// never reaches the agreement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/deadline.h"
#include "transport/local/link.h"
#include "transport/local/wire.h"
#include "transport/transport.h"

namespace gflow::transport::local {

class Host {
 public:
  struct Options {
    uint64_t hostHash = 0;  // 0: no local links
    int rank = 0;
    int size = 1;
    uint64_t commId = 0;
    bool singleCopy = false;  // this rank takes its peers' messages by single copy
    size_t ringBytes = 0;     // the ring it offers (a power of two; 0: none)
  };
  explicit Host(const Options& options);
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // This rank's identity as `peer` sees it (all zero when it offers none).
  Identity identityFor(int peer) const;
  // Whether a peer that offers `theirs` may get a link: both offer one and
  // they are of one host.
  bool canConnect(const Identity& theirs) const;
  // A random nonzero challenge.
  static uint64_t newChallenge();

  // The agreement on the wire's authenticated socket `fd`, right after its
  // hello: the accepting side, which sent `challenge` (0: none) with its
  // reply to the hello that carried `theirs`, and the dialing side, whose
  // peer answered with `theirs` and `challenge`. Null when the pair agreed
  // on nothing. Throws Error when the socket fails or the deadline passes.
  std::unique_ptr<Link> agreeAsAcceptor(int fd, int peer, const Identity& theirs,
                                        uint64_t challenge, const Deadline& deadline);
  std::unique_ptr<Link> agreeAsDialer(int fd, int peer, const Identity& theirs, uint64_t challenge,
                                      const Deadline& deadline);

  // Lending a send to a peer that reads it: its ticket (the ticket index
  // the peer checks after reading), or none when no ticket is free or the
  // kernel cannot read the buffer.
  std::optional<uint16_t> lend(const void* data, uint64_t bytes, Tag tag);
  // The peer read it.
  void returned(uint16_t ticket);
  // Every lent send's ticket goes (a peer that reads one finds it gone),
  // before the sends fail back to their callers or at teardown.
  void withdrawAll();
  static constexpr uint16_t kTickets = 4096;

 private:
  struct PeerRead {
    pid_t pid = 0;        // the peer's process (0: this rank does not read it)
    uint64_t secret = 0;  // found in its slot: this rank's proof that it reads it
  };
  PeerRead verify(const Identity& theirs, uint64_t challenge, int peer) const;
  uint64_t writeProof(int peer, uint64_t challenge);
  void clearProof(int peer, uint64_t secret);
  ReadsClaim claimOf(const PeerRead& read) const;
  std::unique_ptr<Link> finish(int fd, bool dialer, const PeerRead& read, uint8_t proven,
                               const Identity& theirs, const Deadline& deadline);

  Options options_;
  bool offers_ = false;
  // One proof slot per peer (written while connecting, cleared once the
  // peer's claim is in), and the tickets of its lent sends: a reader
  // checks the ticket after reading, so a send withdrawn meanwhile (this
  // rank failed and the buffer went back to the caller) is never delivered.
  std::unique_ptr<ProofSlot[]> proofs_;
  std::unique_ptr<uint64_t[]> tickets_;
  std::vector<uint16_t> freeTickets_;
};

// The proof that rank `claimant` writes at its proofAddr for rank
// `verifier`'s `challenge` (a one-way function, so a peer cannot make
// another process's proof stand for its own).
uint64_t proofOf(uint64_t challenge, int verifier, int claimant, uint64_t commId);

}  // namespace gflow::transport::local
