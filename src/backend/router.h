// The router: the one Backend core calls, and the one place that picks the
// backend that runs an op (with core's algorithm selection, which has
// already stamped OpDesc::algo):
//   - host buffers: `shm` for kShm, `hierarchical` for kHierarchical, `flat`
//     (gflow's algorithms over the network transport) for the rest;
//   - device buffers (Op::buffers): NCCL when it runs this communicator and
//     the op's buffers are on one GPU and stream, and the op is not
//     reproducible (isFixedOrder); otherwise the staged backend over the host
//     choice above.
// The first op on device buffers makes NCCL decide, on every rank at once,
// whether it runs this communicator (backend/nccl/nccl_backend.h). With
// `verifyNccl` (Options::device.verifyOps, GFLOW_NCCL_VERIFY), each NCCL op is preceded by an
// 8-byte allgather over the host backend whose envelope and values carry the op's description
// (all-to-all-v: and every rank's counts), so ranks that call different ops (or stage this one)
// fail with kMismatch instead of hanging inside NCCL. A rooted op runs on NCCL when the buffer
// every rank passes is on the GPU; the root's own buffer may be in host memory (NCCL works on a
// device copy of it).
//
// abort/notifyPeers reach every backend; peerStats adds them up; paths()
// counts the ops each path ran. Calls come from the executing thread,
// except abort() and the counters.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gflow/store.h"

namespace gflow::backend {

class ByAlgorithm;
class NcclBackend;

// The ops each path ran (Communicator::stats).
enum class Path : uint8_t { kShm, kHierarchical, kNetwork, kNccl, kStaged };
constexpr size_t kNumPaths = 5;
using PathCounts = std::array<uint64_t, kNumPaths>;

// The algorithm of an op that the router runs on its own (the NCCL check).
using Selector = std::function<Algorithm(OpKind, uint64_t bytes, int ranks)>;

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
  std::unique_ptr<Backend> flat;  // required
  bool verifyNccl = true;
  bool ncclP2P = false;  // point-to-point on device buffers through NCCL
  Selector select;
};

class Router final : public Backend {
 public:
  explicit Router(RouterParts parts);
  ~Router() override;

  // Once the host grouping is known (before any op but the communicator's
  // own setup): the shared-memory or hierarchical backend, and the device
  // backend for `device`.
  void attach(std::unique_ptr<Backend> shm, std::unique_ptr<Backend> hierarchical,
              const DeviceSetup& device);

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

  PathCounts paths() const;
  void resetPaths();  // after the communicator's own setup ops

 private:
  // `in`/`out`: an all-to-all-v's blocks, which the NCCL check compares.
  Backend& route(const Op& op, const Blocks* in = nullptr, const Blocks* out = nullptr);
  // Whether this rank can run `op` (device buffers) on NCCL; the first such
  // op decides, on every rank, whether NCCL runs this communicator. Rooted
  // ops look at the buffer every rank passes (the root's own may be
  // anywhere).
  bool usable(const Op& op);
  // The op check over the host backend: the same op on every rank (else
  // kMismatch), and alltoallv's counts. Returns true.
  bool checkNccl(const Op& op, const Blocks* in, const Blocks* out);
  // Whether NCCL carries this point-to-point call (GFLOW_NCCL_P2P, device
  // buffers, NCCL running); throws kInvalidArgument for a call it cannot.
  bool p2pOnNccl(const Op& op);
  void count(Path p) { paths_[static_cast<size_t>(p)].fetch_add(1, std::memory_order_relaxed); }

  int rank_;
  int size_;
  bool verify_;
  bool ncclP2P_;
  Selector select_;
  std::unique_ptr<ByAlgorithm> host_;  // flat, shm, hierarchical by OpDesc::algo
  std::unique_ptr<Backend> staged_;    // over host_
  std::unique_ptr<NcclBackend> nccl_;
  std::array<std::atomic<uint64_t>, kNumPaths> paths_{};
};

}  // namespace gflow::backend
