// Backend: runs collectives on one contiguous buffer. Two kinds implement it:
// the host backend (our algorithms over a Transport) and, in a later issue,
// NCCL for device buffers. Layers above (core, gradient) only see this.
//
// Calls come from one thread at a time (the communicator's executing thread);
// abort() from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/deadline.h"
#include "gflow/types.h"
#include "transport/transport.h"

namespace gflow::backend {

enum class OpKind : uint8_t {
  kAllreduce = 1,
  kReduceScatter = 2,
  kAllgather = 3,
  kBroadcast = 4,
  kBarrier = 5,
};
const char* toString(OpKind kind);

enum class Algorithm : uint8_t {
  kAuto = 0,
  kRing = 1,               // pipelined reduce-scatter + allgather
  kRecursiveDoubling = 2,  // log2(N) exchanges of the whole buffer
  kChain = 3,              // pipelined chain (broadcast)
  kDissemination = 4,      // barrier
  kShm = 5,                // every rank on one host: shared-memory backend
  kHierarchical = 6,       // several hosts: local (shm) + cross-host phases
};
const char* toString(Algorithm algo);

// Everything that must agree across ranks for one collective. Encoded into
// every message's Envelope, so a disagreement is detected by the transport.
struct OpDesc {
  OpKind kind = OpKind::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algo = Algorithm::kAuto;
  int root = 0;
  uint64_t count = 0;  // allreduce/broadcast: elements; reduce-scatter/allgather: per rank
  // For the phases of a composed op (hierarchical): fingerprint() of the op
  // they belong to, so phases of ops that differ never match. 0 otherwise.
  uint64_t parent = 0;
};
transport::Envelope encode(const OpDesc& d);
// A 24-bit nonzero digest of everything in `d` that must agree across ranks.
uint64_t fingerprint(const OpDesc& d);
std::string describe(const transport::Envelope& e);

struct Op {
  uint64_t seq = 0;
  OpDesc desc;
  Deadline deadline = Deadline::never();
  // Device ops on the NCCL backend: an event (cudaEvent_t) after the work
  // that produces the op's inputs (recorded on the caller's stream).
  void* ready = nullptr;
};

// Adds `p` to `into` (composed backends sum their parts' traffic).
inline void accumulate(PeerStats& into, const PeerStats& p) {
  into.bytesSent += p.bytesSent;
  into.bytesReceived += p.bytesReceived;
  into.messagesSent += p.messagesSent;
  into.messagesReceived += p.messagesReceived;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void allreduce(const Op& op, const void* in, void* out) = 0;
  // in: desc.count * size elements; out: desc.count elements.
  virtual void reduceScatter(const Op& op, const void* in, void* out) = 0;
  // in: desc.count elements; out: desc.count * size elements.
  virtual void allgather(const Op& op, const void* in, void* out) = 0;
  virtual void broadcast(const Op& op, void* buf) = 0;
  virtual void barrier(const Op& op) = 0;

  virtual void abort(const Error& error) = 0;
  virtual void notifyPeers(const Error& error) = 0;
  virtual PeerStats peerStats(int peer) const = 0;
  // Registers user memory with every network transport context of this
  // backend (zero-copy RDMA); the regions are valid while `out` holds them.
  // Thread-safe with respect to running ops.
  virtual void registerMemory(void* data, size_t bytes,
                              std::vector<std::unique_ptr<transport::MemoryRegion>>* out) = 0;
};

// The host backend over a connected transport context.
std::unique_ptr<Backend> createHostBackend(std::unique_ptr<transport::Context> context);

// Runs each op on the backend that implements its algorithm: `shm` for
// kShm, `hierarchical` for kHierarchical, `flat` (the host backend over the
// network transport) for the rest. abort/notifyPeers reach all of them;
// peerStats adds them up.
std::unique_ptr<Backend> createRouter(std::unique_ptr<Backend> flat, std::unique_ptr<Backend> shm,
                                      std::unique_ptr<Backend> hierarchical);

}  // namespace gflow::backend
