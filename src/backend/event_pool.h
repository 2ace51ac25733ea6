// EventPool: the CUDA events a communicator's ops mark their device inputs
// with (DeviceBuffers), reused from op to op. Creating and destroying an
// event per op were two driver calls on every device op's path
// (docs/performance.md, "What gflow calls around a device op"); a pooled
// event is recorded again instead. Reuse is safe once the op that held it
// is gone: a stream that waits on an event waits for the record it saw when
// the wait was enqueued, not for later records.
//
// Shared (std::shared_ptr) by the communicator and every op's buffers, so
// it outlives the last op that holds one of its events. Events are kept per
// device index: they belong to the context current when they were made,
// the device's primary context, which the CUDA runtime (and PyTorch) uses;
// a caller that makes its own driver-API context current on that device
// would be handed events of another context.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <vector>

#include "common/thread_annotations.h"
#include "kernels/cuda/plugin.h"

namespace gflow::backend {

class EventPool {
 public:
  EventPool() = default;
  ~EventPool();  // destroys the pooled events
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event of the current device, `device` (the caller made it current):
  // a pooled one, or a new one. Returns 0 or the CUDA error of its creation.
  int take(const cuda::Plugin& p, int device, void** event);
  // Back to the pool once nothing records it or waits on it any more (up to
  // kKept per device; beyond that it is destroyed).
  void give(int device, void* event);

  static constexpr size_t kKept = 64;

 private:
  Mutex mutex_;
  const cuda::Plugin* p_ GFLOW_GUARDED_BY(mutex_) = nullptr;       // the first take's
  std::vector<std::vector<void*>> free_ GFLOW_GUARDED_BY(mutex_);  // by device
};

}  // namespace gflow::backend
