#include "common/resource_counts.h"

#include <atomic>

namespace gflow::resources {

namespace {

std::atomic<uint64_t> threads{0};
std::atomic<int64_t> shared{0};
std::atomic<int64_t> pinnedNow{0};
std::atomic<uint64_t> storeMade{0};
std::atomic<uint64_t> storeAnswered{0};

uint64_t nonNegative(int64_t v) {
  return v > 0 ? static_cast<uint64_t>(v) : 0;
}

}  // namespace

void threadStarted() {
  threads.fetch_add(1, std::memory_order_relaxed);
}

void sharedMapped(int64_t deltaBytes) {
  shared.fetch_add(deltaBytes, std::memory_order_relaxed);
}

void pinned(int64_t deltaBytes) {
  pinnedNow.fetch_add(deltaBytes, std::memory_order_relaxed);
}

void storeRequestMade() {
  storeMade.fetch_add(1, std::memory_order_relaxed);
}

void storeRequestServed() {
  storeAnswered.fetch_add(1, std::memory_order_relaxed);
}

Counts now() {
  Counts c;
  c.threadsStarted = threads.load(std::memory_order_relaxed);
  c.sharedBytes = nonNegative(shared.load(std::memory_order_relaxed));
  c.pinnedBytes = nonNegative(pinnedNow.load(std::memory_order_relaxed));
  c.storeRequests = storeMade.load(std::memory_order_relaxed);
  c.storeServed = storeAnswered.load(std::memory_order_relaxed);
  return c;
}

}  // namespace gflow::resources
