// StagingPool: the buffers of messages that arrive before their receive
// (Engine::stage), kept for the next ones.
//
// A collective whose messages run ahead of their receives (the fixed order's
// rounds, the ring's pieces) stages some of them on every op. Allocating one
// buffer per staged message and freeing it when its receive copied it out
// made glibc grow its heap with brk and trim it again on every op: every
// staged message landed on fresh pages (a page fault per 4 KiB) and every
// trim cost a TLB shootdown to every core. With four ranks on two cores the
// fixed order ran 5-8x slower with 64 KiB pieces, most of it in the kernel
// (docs/performance.md, "Staging buffers").
//
// Messages above 4 KiB get a buffer rounded up to an eighth of the power of
// two below their size (at most 12.5% more than they need, so the memory
// behind the staged bytes that GFLOW_UNEXPECTED_LIMIT counts stays within
// 1.125x); a freed one is kept while the pool holds at most `keepBytes`,
// else freed. Smaller messages, and larger ones than the pool may keep,
// get exactly their size and are not kept. What the pool keeps stays
// allocated for the context's life. Owning thread only (as the Engine).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

namespace gflow::transport {

class StagingPool {
 public:
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t capacity = 0;  // 0: exactly the message's size, not kept
  };

  explicit StagingPool(size_t keepBytes) : keep_(keepBytes) {}

  // A buffer of at least `len` bytes (a kept one when there is one).
  Buffer take(size_t len);
  // `b` is free again.
  void give(Buffer b);
  // Bytes held for reuse.
  size_t keptBytes() const { return kept_; }

 private:
  static constexpr size_t kSmall = 4096;
  static constexpr size_t kSteps = 8;  // size classes per power of two
  // The pooled size for `len` (0: not pooled).
  static size_t capacityFor(size_t len);

  const size_t keep_;
  size_t kept_ = 0;
  std::map<size_t, std::vector<std::unique_ptr<char[]>>> free_;  // by capacity
};

}  // namespace gflow::transport
