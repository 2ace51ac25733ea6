// CUDA device tensors on gflow's host backends (TCP, verbs, shared memory):
// each op copies its device inputs into pinned host memory, runs the host
// collective there, and copies the outputs back, so a GPU user without NCCL
// still works. The copies run on a stream of the communicator that first
// waits for the work the caller had enqueued on the tensor's stream when it
// called the op; the op (and its Work) completes once the results are back
// in device memory.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "gflow/types.h"
#include "kernels/cuda/plugin.h"

namespace gflow {

// Per communicator: the pinned buffer and the copy streams, used by one op
// at a time on the executing thread.
class DeviceStagingPool {
 public:
  explicit DeviceStagingPool(const cuda::Plugin& p) : p_(p) {}
  ~DeviceStagingPool();
  char* host(size_t bytes);  // pinned; valid until the next call
  void* stream(int device);  // created on first use
  const cuda::Plugin& plugin() const { return p_; }

 private:
  const cuda::Plugin& p_;
  void* host_ = nullptr;
  size_t hostBytes_ = 0;
  std::vector<void*> streams_;  // by device index
};

class DeviceStaging {
 public:
  enum Role { kIn, kOut, kInOut };
  struct Item {
    Tensor t;
    Role role;
  };

  // On the caller's thread: nullptr when no tensor is on a device. Records
  // an event on each device tensor's stream. Throws gflow::Error (kInternal,
  // naming `op` and `rank`) when CUDA fails.
  static std::shared_ptr<DeviceStaging> prepare(const cuda::Plugin* plugin, const char* op,
                                                int rank, std::initializer_list<Item> items);
  ~DeviceStaging();

  // Whether every item is a cuda tensor, all on one device and stream
  // (what NCCL can run in place); sets `device` (of the first cuda item,
  // whatever the answer) and `ready`, the event recorded after the work
  // that produces its inputs.
  bool single(int* device, void** ready) const;

  // Executing thread: moves each device tensor's event to the work enqueued
  // on its stream so far (the fused ops' packing kernels).
  void recordAgain();

  // On the executing thread, around the host collective.
  void toHost(DeviceStagingPool& pool);
  // Where item i lives during the collective (staging for device tensors).
  void* data(size_t i) const { return ptr_[i]; }
  void toDevice(DeviceStagingPool& pool);

 private:
  void check(int err, const char* what) const;

  const cuda::Plugin* p_ = nullptr;
  const char* op_ = "";
  int rank_ = -1;
  std::vector<Item> items_;
  std::vector<void*> events_;  // per item (nullptr: host tensor)
  std::vector<void*> ptr_;
};

}  // namespace gflow
