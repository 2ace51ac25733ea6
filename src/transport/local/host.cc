#include "transport/local/host.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <random>
#include <string>
#include <utility>

#include "common/hash.h"
#include "common/logging.h"
#include "common/peer_memory.h"
#include "common/socket.h"
#include "transport/local/ring.h"

namespace gflow::transport::local {

namespace {

constexpr size_t kMaxRing = size_t{1} << 30;

bool validCapacity(uint64_t c) {
  return c >= 4096 && c <= kMaxRing && (c & (c - 1)) == 0;
}

// The dialer speaks first.
template <typename T>
void exchange(int fd, const T& mine, T* theirs, bool dialer, const Deadline& d) {
  if (dialer) net::sendAll(fd, &mine, sizeof(mine), d);
  net::recvAll(fd, theirs, sizeof(*theirs), d);
  if (!dialer) net::sendAll(fd, &mine, sizeof(mine), d);
}

// The flags of the peer's claim that it proved: none unless it echoes the
// secret this rank left in its slot for it (`secret`; 0 when this rank
// left none: it offered no identity, or the peer never challenged it). Only
// a process that reads this rank's memory can know the secret, and such a
// process may ptrace this rank anyway: its word on the rest (its READ
// notices, its ring) is then taken.
uint8_t provenFlags(const ReadsClaim& theirs, uint64_t secret) {
  return secret != 0 && theirs.echo == secret ? theirs.flags : 0;
}

// The pair's rings, for a pair whose ranks read each other (the peer is
// process `pid`): offers this rank's ring of `capacity` bytes (0: none) and
// maps the peer's. Null unless both sides mapped.
std::unique_ptr<Ring> agreeRing(int fd, pid_t pid, size_t capacity, bool dialer,
                                const Deadline& deadline) {
  Mapping mine;
  RingOffer offer{0, 0};
  if (capacity > 0) {
    try {
      mine = Ring::create(capacity);
      offer = RingOffer{static_cast<uint32_t>(mine.fd()), static_cast<uint32_t>(capacity)};
    } catch (const Error& e) {
      GFLOW_LOG(DEBUG) << "no local ring: " << e.what();
    }
  }
  RingOffer theirs{};
  exchange(fd, offer, &theirs, dialer, deadline);
  Mapping peer;
  if (offer.capacity != 0 && validCapacity(theirs.capacity)) {
    std::string why;
    peer = Mapping::open(pid, static_cast<int>(theirs.fd), Ring::segmentBytes(theirs.capacity),
                         &why, /*readOnly=*/true);
    if (!peer.data()) {
      GFLOW_LOG(DEBUG) << "no local ring: " << why;
    }
  }
  const uint8_t mapped = peer.data() ? 1 : 0;
  uint8_t theyMapped = 0;
  exchange(fd, mapped, &theyMapped, dialer, deadline);
  mine.closeFd();  // the peer has opened it, or never will
  if (!mapped || theyMapped != 1) return nullptr;
  return std::make_unique<Ring>(std::move(mine), offer.capacity, std::move(peer), theirs.capacity);
}

}  // namespace

uint64_t proofOf(uint64_t challenge, int verifier, int claimant, uint64_t commId) {
  const uint64_t words[4] = {challenge, static_cast<uint64_t>(verifier),
                             static_cast<uint64_t>(claimant), commId};
  return hash::sha256Id(words, sizeof(words)) | 1;
}

Host::Host(const Options& options) : options_(options) {
  offers_ = (options.singleCopy || options.ringBytes > 0) && options.hostHash != 0;
  if (!offers_) return;
  proofs_.reset(new ProofSlot[static_cast<size_t>(options.size)]());
  tickets_.reset(new uint64_t[kTickets]());
  for (uint16_t i = kTickets; i-- > 0;) freeTickets_.push_back(i);
}

Host::~Host() {
  withdrawAll();
}

Identity Host::identityFor(int peer) const {
  if (!offers_) return Identity{};
  return Identity{options_.hostHash, static_cast<uint64_t>(::getpid()),
                  reinterpret_cast<uintptr_t>(&proofs_[static_cast<size_t>(peer)]),
                  reinterpret_cast<uintptr_t>(tickets_.get())};
}

bool Host::canConnect(const Identity& theirs) const {
  return offers_ && theirs.pid != 0 && theirs.hostHash == options_.hostHash;
}

uint64_t Host::newChallenge() {
  std::random_device rd;
  return (uint64_t(rd()) << 32 | rd()) | 1;
}

Host::PeerRead Host::verify(const Identity& theirs, uint64_t challenge, int peer) const {
  if (challenge == 0 || !canConnect(theirs) || theirs.ticketBase == 0) return {};
  if (theirs.pid > static_cast<uint64_t>(INT_MAX)) return {};
  const pid_t pid = static_cast<pid_t>(theirs.pid);
  std::string why;
  if (!probePeerMemory(pid, theirs.proofAddr,
                       proofOf(challenge, options_.rank, peer, options_.commId), &why)) {
    GFLOW_LOG(DEBUG) << "rank " << options_.rank << ": no single copy from local rank " << peer
                     << " (" << why << ")";
    return {};
  }
  uint64_t secret = 0;
  if (readPeerMemory(pid, theirs.proofAddr + offsetof(ProofSlot, secret), &secret,
                     sizeof(secret)) != 0 ||
      secret == 0) {
    return {};
  }
  return PeerRead{pid, secret};
}

// Answers `peer`'s challenge (0: none) in this rank's slot for it, beside a
// fresh secret; returns the secret (0: nothing written).
uint64_t Host::writeProof(int peer, uint64_t challenge) {
  if (!offers_ || challenge == 0) return 0;
  ProofSlot& slot = proofs_[static_cast<size_t>(peer)];
  slot.proof = proofOf(challenge, peer, options_.rank, options_.commId);
  slot.secret = newChallenge();
  return slot.secret;
}

// The peer's claim is in: whatever it read of the slot, it has read.
void Host::clearProof(int peer, uint64_t secret) {
  if (secret != 0) proofs_[static_cast<size_t>(peer)] = ProofSlot{};
}

// This rank's claim on a peer whose ProofSlot it read: it reads the peer,
// takes its messages by single copy where configured, and proves the first
// with the secret it found there.
ReadsClaim Host::claimOf(const PeerRead& read) const {
  ReadsClaim c{};
  if (read.pid == 0) return c;
  c.flags = kReads | (options_.singleCopy ? kTakesSingleCopy : 0);
  c.echo = read.secret;
  return c;
}

// After the claims: the peer takes this rank's messages by single copy
// when it proved both flags, and the pair's rings follow once both read
// each other.
std::unique_ptr<Link> Host::finish(int fd, bool dialer, const PeerRead& read, uint8_t proven,
                                   const Identity& theirs, const Deadline& deadline) {
  const bool peerReads =
      proven == (kReads | kTakesSingleCopy) && options_.singleCopy && tickets_ != nullptr;
  std::unique_ptr<Ring> ring;
  if (read.pid != 0 && (proven & kReads) != 0) {
    ring = agreeRing(fd, read.pid, options_.ringBytes, dialer, deadline);
  }
  if (read.pid == 0 && !peerReads) return nullptr;
  return std::make_unique<Link>(read.pid, theirs.ticketBase, peerReads, options_.commId,
                                std::move(ring));
}

// The dialer's proof is checked and its challenge answered; each side then
// claims whether it reads the other, with the secret that proves it.
std::unique_ptr<Link> Host::agreeAsAcceptor(int fd, int peer, const Identity& theirs,
                                            uint64_t challenge, const Deadline& deadline) {
  uint64_t theirChallenge = 0;
  net::recvAll(fd, &theirChallenge, sizeof(theirChallenge), deadline);
  const PeerRead read = verify(theirs, challenge, peer);
  const uint64_t secret = challenge != 0 ? writeProof(peer, theirChallenge) : 0;
  const ReadsClaim mine = claimOf(read);
  net::sendAll(fd, &mine, sizeof(mine), deadline);
  ReadsClaim claim{};
  net::recvAll(fd, &claim, sizeof(claim), deadline);
  clearProof(peer, secret);
  return finish(fd, /*dialer=*/false, read, provenFlags(claim, secret), theirs, deadline);
}

std::unique_ptr<Link> Host::agreeAsDialer(int fd, int peer, const Identity& theirs,
                                          uint64_t challenge, const Deadline& deadline) {
  const uint64_t secret = writeProof(peer, challenge);
  const uint64_t mine = canConnect(theirs) ? newChallenge() : 0;
  net::sendAll(fd, &mine, sizeof(mine), deadline);
  ReadsClaim claim{};
  net::recvAll(fd, &claim, sizeof(claim), deadline);
  clearProof(peer, secret);
  const PeerRead read = verify(theirs, mine, peer);
  const ReadsClaim myClaim = claimOf(read);
  net::sendAll(fd, &myClaim, sizeof(myClaim), deadline);
  return finish(fd, /*dialer=*/true, read, provenFlags(claim, secret), theirs, deadline);
}

std::optional<uint16_t> Host::lend(const void* data, uint64_t bytes, Tag tag) {
  if (!tickets_ || freeTickets_.empty() || !ownBuffersReadable(data, bytes, data, bytes)) {
    return std::nullopt;
  }
  const uint16_t t = freeTickets_.back();
  freeTickets_.pop_back();
  tickets_[t] = ticketOf(tag, options_.commId);
  return t;
}

void Host::returned(uint16_t ticket) {
  tickets_[ticket] = 0;
  freeTickets_.push_back(ticket);
}

void Host::withdrawAll() {
  if (tickets_) std::fill(tickets_.get(), tickets_.get() + kTickets, uint64_t{0});
}

}  // namespace gflow::transport::local
