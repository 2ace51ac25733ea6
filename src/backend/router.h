// The router: the one Backend core calls. For every op it is given, on the
// executing thread, it asks RoutePolicy::choose (backend/route_policy.h)
// for the op's route, stamps it on the op, and runs the op on the backend of
// the route's path: a table of the network, shared-memory and hierarchical
// backends and NCCL (flat or split by host). Device buffers on a host path
// go through the staged backend (a copy through host memory) to that path.
// The capabilities that choose() reads are the host grouping's (attach())
// and NCCL's for the op's buffers: whether NCCL runs this communicator (the
// first op on device buffers makes NCCL decide, on every rank at once;
// backend/nccl/nccl_backend.h) and the op's buffers are on its GPU and one
// stream. A rooted op runs on NCCL when the buffer every rank passes is on
// the GPU; the root's own buffer may be in host memory (NCCL works on a
// device copy of it). With `verifyNccl` (Options::device.verifyOps,
// GFLOW_NCCL_VERIFY) and several ranks, NCCL checks each op beside it over
// the host paths (backend/nccl/op_check.h).
//
// abort/notifyPeers reach every backend; peerStats adds them up; paths()
// and routes() count the ops each path and route ran, and the INFO log
// names an op kind's route whenever it changes. Calls come from the
// executing thread, except abort() and the counters.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/route_policy.h"
#include "gflow/store.h"

namespace gflow::backend {

class HostPaths;
class NcclBackend;

// The ops each path ran, and of those the ones staged through host memory
// (Communicator::stats).
struct PathCounts {
  std::array<uint64_t, kNumPaths> ops{};
  uint64_t staged = 0;
  uint64_t of(Path p) const { return ops[static_cast<size_t>(p)]; }
};
// How many ops of one kind ran on one route.
struct RouteCount {
  OpKind kind;
  Route route;
  uint64_t ops;
};

// What the device backend (NCCL) of a communicator starts from when its
// first op on device buffers arrives.
struct DeviceSetup {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  std::string prefix;  // the communicator's store keys
  std::chrono::milliseconds timeout{300000};
  std::vector<uint64_t> hostOf;  // host identity of every rank
  // "auto", "nccl" or "staged" (Options::device.backend); empty: from
  // GFLOW_DEVICE_BACKEND.
  std::string mode;
};

struct RouterParts {
  int rank = 0;
  int size = 1;
  std::unique_ptr<Backend> flat;              // required: the network path
  std::shared_ptr<const RoutePolicy> policy;  // required
  bool verifyNccl = true;
  bool ncclP2P = false;  // point-to-point on device buffers through NCCL
};

class Router final : public Backend {
 public:
  explicit Router(RouterParts parts);
  ~Router() override;

  // Once the host grouping is known (before any op but the communicator's
  // own setup): the shared-memory or hierarchical backend with what they
  // can run, and the device backend for `device`.
  struct HostParts {
    std::unique_ptr<Backend> shm, hierarchical;
    Capabilities caps;
  };
  void attach(HostParts host, const DeviceSetup& device);

  void allreduce(const Op& op, const void* in, void* out) override;
  void reduceScatter(const Op& op, const void* in, void* out) override;
  void allgather(const Op& op, const void* in, void* out) override;
  void broadcast(const Op& op, void* buf) override;
  void barrier(const Op& op) override;
  void reduce(const Op& op, const void* in, void* out) override;
  void gather(const Op& op, const void* in, void* out) override;
  void scatter(const Op& op, const void* in, void* out) override;
  void alltoall(const Op& op, const void* in, void* out) override;
  void alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                 const Blocks& outBlocks) override;
  void gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) override;
  void scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) override;
  std::unique_ptr<P2PInFlight> startPointToPoint(const Op& op,
                                                 std::vector<P2PMessage> msgs) override;
  const char* name() const override { return "router"; }

  void abort(const Error& error) override;
  void notifyPeers(const Error& error) override;
  std::vector<Error> awaitReports(Deadline until, int exclude) override;
  bool reject(uint64_t seq, const std::string& why) override;
  PeerStats peerStats(int peer) const override;
  void registerMemory(void* data, size_t bytes,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>* out) override;
  // NCCL's part of a split; `child` is the new communicator's Router.
  void splitInto(const Op& op, int color, int key, Backend* child) override;
  bool canShrink() const override;
  void shrinkInto(const Op& op, const std::vector<int>& excluded, bool failed,
                  Backend* child) override;

  // The policy that routes this router's ops (and the hierarchical phases).
  const RoutePolicy& policy() const { return *policy_; }
  PathCounts paths() const;
  std::vector<RouteCount> routes() const;  // those that ran at least once
  void resetPaths();                       // after the communicator's own setup ops

 private:
  class Device;  // the DeviceQuery of one op
  // `op` with its route (RoutePolicy::choose), counted and logged.
  Op route(const Op& op);
  // The backend of a routed op's path (staged for device buffers on a host path).
  Backend& at(const Op& routed);
  void record(const Op& routed);
  // Whether this rank can run `op` (device buffers) on NCCL; the first such
  // op decides, on every rank, whether NCCL runs this communicator. Rooted
  // ops look at the buffer every rank passes (the root's own may be
  // anywhere).
  bool usable(const Op& op);
  // Whether NCCL carries this point-to-point call (GFLOW_NCCL_P2P, device
  // buffers, NCCL running); throws kInvalidArgument for a call it cannot.
  bool p2pOnNccl(const Op& op);

  int rank_;
  int size_;
  bool verify_;
  bool ncclP2P_;
  std::shared_ptr<const RoutePolicy> policy_;
  Capabilities caps_;
  std::unique_ptr<HostPaths> host_;  // network, shm, hierarchical by Route::path
  std::unique_ptr<Backend> staged_;  // over host_
  std::unique_ptr<NcclBackend> nccl_;
  std::array<std::atomic<uint64_t>, kNumPaths> paths_{};
  std::atomic<uint64_t> stagedOps_{0};
  std::array<std::atomic<uint64_t>, kNumOpKinds * kNumPaths * kNumAlgorithms> routes_{};
  std::array<Route, kNumOpKinds> lastRoute_{};  // for the INFO log; executing thread
};

}  // namespace gflow::backend
