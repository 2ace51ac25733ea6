#include "transport/local/link.h"

#include <cerrno>
#include <utility>

#include "common/peer_memory.h"

namespace gflow::transport::local {

uint64_t ticketOf(const Tag& tag, uint64_t commId) {
  return (tag.group * 0x9E3779B97F4A7C15ull ^ (tag.index + 0x632BE59BD9B4E019ull) ^ commId) | 1;
}

Link::Link(pid_t pid, uint64_t ticketBase, bool peerReads, uint64_t commId,
           std::unique_ptr<PolledStream> stream)
    : pid_(pid),
      ticketBase_(ticketBase),
      peerReads_(peerReads),
      commId_(commId),
      stream_(std::move(stream)) {}

// The data first, then its ticket: a send the sender withdrew meanwhile is
// not delivered, whatever was read.
Link::Read Link::readMessage(uint64_t remote, uint16_t ticket, Tag tag, void* dst, uint64_t bytes,
                             int* err) {
  if (exited_) return Read::kExited;
  *err = readPeerMemory(pid_, remote, dst, bytes);
  uint64_t value = 0;
  if (*err != ESRCH) {
    const int terr = readPeerMemory(pid_, ticketBase_ + 8 * uint64_t{ticket}, &value, 8);
    if (terr == ESRCH) *err = ESRCH;
  }
  if (*err == ESRCH) {
    exited_ = true;
    return Read::kExited;
  }
  if (value != ticketOf(tag, commId_)) return Read::kWithdrawn;
  return *err == 0 ? Read::kDone : Read::kFailed;
}

}  // namespace gflow::transport::local
