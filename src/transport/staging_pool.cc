#include "transport/staging_pool.h"

namespace gflow::transport {

size_t StagingPool::capacityFor(size_t len) {
  if (len <= kSmall) return 0;
  size_t top = kSmall;  // the power of two below len
  while (top * 2 < len) top *= 2;
  const size_t step = top / kSteps;
  return (len + step - 1) / step * step;
}

StagingPool::Buffer StagingPool::take(size_t len) {
  Buffer b;
  b.capacity = capacityFor(len);
  if (b.capacity == 0 || b.capacity > keep_) {  // not pooled: exactly its size
    b.capacity = 0;
    b.data.reset(new char[len > 0 ? len : 1]);
    return b;
  }
  auto it = free_.find(b.capacity);
  if (it != free_.end() && !it->second.empty()) {
    b.data = std::move(it->second.back());
    it->second.pop_back();
    kept_ -= b.capacity;
  } else {
    b.data.reset(new char[b.capacity]);
  }
  return b;
}

void StagingPool::give(Buffer b) {
  if (!b.data || b.capacity == 0 || kept_ + b.capacity > keep_) return;  // freed here
  free_[b.capacity].push_back(std::move(b.data));
  kept_ += b.capacity;
}

}  // namespace gflow::transport
