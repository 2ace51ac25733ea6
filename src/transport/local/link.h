// A local link: what two ranks of one host agreed while connecting
// (Host::agree), and what it lets them do besides sending over the wire
// that connects them.
//
//   - Single copy: this rank reads the peer's messages straight from the
//     peer's buffers (process_vm_readv, common/peer_memory.h), and/or the
//     peer reads this rank's. Each direction is agreed on its own.
//   - A polled stream (ring.h) that carries the wire's frames instead of
//     its socket, when both read each other and both mapped the other's
//     ring.
//
// Nothing on the wire above the byte stream changes with a link: the
// frames, their matching and their checks are the wire's. A link only
// replaces how bytes move.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "transport/polled_stream.h"
#include "transport/transport.h"

namespace gflow::transport::local {

class Link {
 public:
  // pid: the peer's process when this rank reads it (0: it does not);
  // ticketBase: the peer's tickets; peerReads: the peer takes this rank's
  // messages by single copy; stream: the pair's rings (may be null).
  Link(pid_t pid, uint64_t ticketBase, bool peerReads, uint64_t commId,
       std::unique_ptr<PolledStream> stream);

  bool readsPeer() const { return pid_ != 0; }
  bool peerReads() const { return peerReads_; }
  // The pair's polled stream, taken once by the wire that installs it
  // (null when the pair has none).
  std::unique_ptr<PolledStream> takeStream() { return std::move(stream_); }

  // Reads the peer's message `tag` of `bytes` at its address `remote` into
  // `dst`, then its ticket `ticket` (readsPeer() only). kWithdrawn: the
  // sender's op failed and the buffer went back to its caller, so what was
  // read is not its message; kExited: the sender's process is gone (then
  // exited() stays true); kFailed: the kernel refused the read (*err says
  // why).
  enum class Read { kDone, kWithdrawn, kExited, kFailed };
  Read readMessage(uint64_t remote, uint16_t ticket, Tag tag, void* dst, uint64_t bytes, int* err);
  bool exited() const { return exited_; }

 private:
  pid_t pid_;
  uint64_t ticketBase_;
  bool peerReads_;
  uint64_t commId_;
  bool exited_ = false;
  std::unique_ptr<PolledStream> stream_;
};

// A message's ticket while its sender lends it: nonzero, and another for
// every tag and communicator.
uint64_t ticketOf(const Tag& tag, uint64_t commId);

}  // namespace gflow::transport::local
