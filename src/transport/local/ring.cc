#include "transport/local/ring.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace gflow::transport::local {

// One side's words, at the start of its segment; its ring follows them.
// Lock-free 64-bit atomics are address-free, so they work across processes.
struct Ring::Words {
  alignas(64) std::atomic<uint64_t> tail;    // bytes written into this side's ring
  alignas(64) std::atomic<uint64_t> head;    // bytes read from the peer's ring
  alignas(64) std::atomic<uint64_t> asleep;  // a sleep generation; 0: awake
  std::atomic<uint32_t> wantsData;           // ... waiting for data from the peer
  std::atomic<uint32_t> wantsRoom;           // ... waiting for room in its ring
};

namespace {
constexpr size_t kWordsBytes = 256;
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "shared words must be plain lock-free atomics");
}  // namespace

size_t Ring::segmentBytes(size_t capacity) {
  static_assert(sizeof(Words) <= kWordsBytes, "ring words layout");
  return kWordsBytes + capacity;
}

Mapping Ring::create(size_t capacity) {
  return Mapping::create(segmentBytes(capacity));
}

Ring::Ring(Mapping mine, size_t myCapacity, Mapping theirs, size_t theirCapacity)
    : mine_(std::move(mine)),
      theirs_(std::move(theirs)),
      myCap_(myCapacity),
      theirCap_(theirCapacity),
      myData_(static_cast<char*>(mine_.data()) + kWordsBytes),
      theirData_(static_cast<const char*>(theirs_.data()) + kWordsBytes) {}

Ring::Words* Ring::mine() const {
  return static_cast<Words*>(mine_.data());
}

const Ring::Words* Ring::theirs() const {
  return static_cast<const Words*>(theirs_.data());
}

size_t Ring::write(const iovec* iov, int count) {
  const uint64_t used = tail_ - theirs()->head.load(std::memory_order_acquire);
  if (used > myCap_) {  // the peer read past what was written
    broken_ = true;
    return 0;
  }
  size_t room = myCap_ - used, taken = 0;
  for (int i = 0; i < count && room > 0; ++i) {
    const char* src = static_cast<const char*>(iov[i].iov_base);
    size_t n = std::min(iov[i].iov_len, room);
    room -= n;
    taken += n;
    while (n > 0) {
      const size_t at = (tail_ & (myCap_ - 1));
      const size_t k = std::min(n, myCap_ - at);
      std::memcpy(myData_ + at, src, k);
      src += k;
      n -= k;
      tail_ += k;
    }
  }
  if (taken > 0) mine()->tail.store(tail_, std::memory_order_seq_cst);
  return taken;
}

size_t Ring::read(char* dst, size_t cap) {
  const uint64_t avail = theirs()->tail.load(std::memory_order_acquire) - head_;
  if (avail > theirCap_) {  // the peer's tail ran ahead of its ring
    broken_ = true;
    return 0;
  }
  size_t n = std::min<uint64_t>(avail, cap);
  const size_t taken = n;
  while (n > 0) {
    const size_t at = (head_ & (theirCap_ - 1));
    const size_t k = std::min(n, theirCap_ - at);
    std::memcpy(dst, theirData_ + at, k);
    dst += k;
    n -= k;
    head_ += k;
  }
  if (taken > 0) mine()->head.store(head_, std::memory_order_seq_cst);
  return taken;
}

bool Ring::readable() const {
  const uint64_t avail = theirs()->tail.load(std::memory_order_seq_cst) - head_;
  if (avail > theirCap_) broken_ = true;
  return avail != 0;
}

bool Ring::writable() const {
  const uint64_t used = tail_ - theirs()->head.load(std::memory_order_seq_cst);
  if (used > myCap_) broken_ = true;
  return used < myCap_;
}

bool Ring::arm(uint64_t gen, bool wantsRoom, bool wantsData) {
  mine()->wantsData.store(wantsData ? 1 : 0, std::memory_order_relaxed);
  mine()->wantsRoom.store(wantsRoom ? 1 : 0, std::memory_order_relaxed);
  mine()->asleep.store(gen, std::memory_order_seq_cst);
  return !((wantsData && readable()) || (wantsRoom && writable()) || broken_);
}

void Ring::disarm() {
  mine()->asleep.store(0, std::memory_order_relaxed);
}

bool Ring::peerNeedsWake(bool forRoom) {
  const uint64_t gen = theirs()->asleep.load(std::memory_order_seq_cst);
  if (gen == 0 || gen == woken_) return false;
  if (forRoom) {
    // Once half its ring is free: a writer woken for every frame read would
    // write one frame per wake-up.
    if (theirs()->wantsRoom.load(std::memory_order_relaxed) == 0) return false;
    if (theirs()->tail.load(std::memory_order_relaxed) - head_ > theirCap_ / 2) return false;
  } else if (theirs()->wantsData.load(std::memory_order_relaxed) == 0) {
    return false;
  }
  woken_ = gen;
  return true;
}

}  // namespace gflow::transport::local
