// DeviceBuffers: the buffers of one op as the caller passed them, when any
// of them is CUDA memory. Built on the caller's thread when the op is
// called (DeviceBuffers::bind): it records an event on each stream its
// device tensors name (one per device and stream, taken from the
// communicator's EventPool), so the op waits for exactly the work the
// caller had enqueued there by then. The backends that run device buffers read it from
// Op::buffers: NCCL waits on the event of its single device and stream, the
// staged backend copies through pinned host memory after the events.
//
// Thread safety: built on the caller's thread, then used by the
// communicator's executing thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/event_pool.h"
#include "gflow/types.h"
#include "kernels/cuda/plugin.h"

namespace gflow::backend {

class StagingPool;

class DeviceBuffers {
 public:
  enum Role { kIn, kOut, kInOut };
  struct Item {
    Tensor t;
    Role role;
  };

  // The op, for errors, and where its events come from.
  struct Binding {
    const char* op;
    int rank;
    std::shared_ptr<EventPool> events;  // the communicator's; never null
  };

  // nullptr when no tensor of `items` is on a device. Throws gflow::Error
  // (kInternal, naming the op and rank) when CUDA fails.
  static std::shared_ptr<DeviceBuffers> bind(const Binding& at, std::vector<Item> items);
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  const cuda::Plugin& plugin() const { return *p_; }

  // Whether every item is a cuda tensor, all on one device and stream
  // (what NCCL can run in place); sets `device` (of the first cuda item,
  // whatever the answer) and `ready`, the event recorded after the work
  // that produces its inputs.
  bool single(int* device, void** ready) const;
  // The same for the first item alone: the buffer every rank of a rooted op
  // passes (the root's root-only buffer comes after it).
  bool leading(int* device, void** ready) const;
  // The event after the work producing the item that holds `p` (null: host
  // memory, or not one of the op's buffers).
  void* eventOf(const void* p) const;

  // Executing thread: moves each event to the work enqueued on its stream
  // so far (the packing kernels a fused op ran just before its collective).
  void recordAgain();

  // Staging (executing thread, around a host collective): toHost copies
  // the device inputs into `pool`'s pinned memory; host(p) is where the
  // byte at `p` (inside an item) lives during the collective (p itself for
  // host items; nullptr for nullptr, a rooted op's root-only buffer off the
  // root); toDevice copies the outputs back.
  void toHost(StagingPool& pool);
  void* host(const void* p) const;
  void toDevice(StagingPool& pool);

 private:
  DeviceBuffers() = default;
  void check(int err, const char* what) const;

  // The event of item i: the one an earlier item on the same device and
  // stream took, or one from the pool, recorded on its stream.
  void mark(size_t i);
  // Each distinct event once, with its item's device.
  template <typename F>
  void forEachEvent(F&& fn) const;

  const cuda::Plugin* p_ = nullptr;
  const char* op_ = "";
  int rank_ = -1;
  std::shared_ptr<EventPool> pool_;
  std::vector<Item> items_;
  std::vector<void*> events_;  // per item (nullptr: host tensor); items may share one
  std::vector<bool> owns_;     // per item: its event is not an earlier item's
  std::vector<char*> ptr_;     // per item: where it lives during a collective
};

// Per communicator: the pinned buffer and the copy streams of staging, used
// by one op at a time on the executing thread.
class StagingPool {
 public:
  explicit StagingPool(const cuda::Plugin& p) : p_(p) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  char* host(size_t bytes);  // pinned; valid until the next call
  void* stream(int device);  // created on first use

 private:
  void releaseHost();  // the pinned host buffer goes
  const cuda::Plugin& p_;
  void* host_ = nullptr;
  size_t hostBytes_ = 0;
  std::vector<void*> streams_;  // by device index
};

// Checks where a tensor passed to a collective lives (host memory, or a
// GPU this process can use, with its stream): empty when the op can use
// it, otherwise why not, as words that follow the argument's name
// (" is on cuda:3, but this process sees 2 GPU(s)").
std::string checkPlacement(const Tensor& t);

struct Op;
// Executing thread: the op's inputs were produced again just now (a fused
// op's packing kernels, enqueued on the tensors' streams right before its
// collective); the op waits for that work. Nothing for host buffers.
void inputsProduced(const Op& op);

}  // namespace gflow::backend
