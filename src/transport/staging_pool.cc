#include "transport/staging_pool.h"

namespace gflow::transport {

size_t StagingPool::sizeClass(size_t len) {
  size_t c = 12;  // 4 KiB
  while ((size_t(1) << c) < len) ++c;
  return c;
}

StagingPool::Buffer StagingPool::take(size_t len) {
  const size_t c = sizeClass(len);
  Buffer b;
  b.capacity = size_t(1) << c;
  if (c < free_.size() && !free_[c].empty()) {
    b.data = std::move(free_[c].back());
    free_[c].pop_back();
    kept_ -= b.capacity;
  } else {
    b.data.reset(new char[b.capacity]);
  }
  return b;
}

void StagingPool::give(Buffer b) {
  if (!b.data || b.capacity == 0 || kept_ + b.capacity > keep_) return;  // freed here
  const size_t c = sizeClass(b.capacity);
  if (c >= free_.size()) free_.resize(c + 1);
  free_[c].push_back(std::move(b.data));
  kept_ += b.capacity;
}

}  // namespace gflow::transport
