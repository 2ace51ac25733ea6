#include "backend/event_pool.h"

namespace gflow::backend {

EventPool::~EventPool() {
  MutexLock l(mutex_);
  for (auto& events : free_) {
    for (void* ev : events) p_->eventDestroy(ev);
  }
}

int EventPool::take(const cuda::Plugin& p, int device, void** event) {
  {
    MutexLock l(mutex_);
    if (!p_) p_ = &p;
    if (static_cast<size_t>(device) < free_.size() && !free_[device].empty()) {
      *event = free_[device].back();
      free_[device].pop_back();
      return 0;
    }
  }
  return p.eventCreate(event);
}

void EventPool::give(int device, void* event) {
  MutexLock l(mutex_);
  if (static_cast<size_t>(device) >= free_.size()) free_.resize(device + 1);
  if (free_[device].size() < kKept) {
    free_[device].push_back(event);
  } else {
    p_->eventDestroy(event);
  }
}

}  // namespace gflow::backend
