// Communicator::Impl: the front door behind the public Communicator. It
// checks arguments, stamps each op with its sequence number and chosen
// algorithm, runs it through the engine on the backend, and turns the first
// failure into the communicator's sticky error.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/nccl/nccl_backend.h"
#include "core/algorithm_select.h"
#include "core/device_staging.h"
#include "core/engine.h"
#include "gflow/communicator.h"
#include "transport/transport.h"

namespace gflow {

struct Communicator::Impl {
  int rank = 0;
  int size = 1;
  int localRank = 0;
  int localSize = 1;
  int hostIndex = 0;
  int numHosts = 1;
  std::chrono::milliseconds timeout{300000};
  std::vector<uint64_t> hostOf;  // host hash per rank
  std::string transportName;
  transport::ContextOptions contextOptions;  // template for split()
  std::unique_ptr<AlgorithmSelector> selector;
  std::unique_ptr<backend::Backend> backend;
  // Device tensors: the CUDA component (set when an op first validates
  // one) and the staging memory and streams (executing thread only).
  std::atomic<const cuda::Plugin*> cudaPlugin{nullptr};
  std::unique_ptr<DeviceStagingPool> staging;
  DeviceStagingPool& stagingPool() {
    if (!staging) staging = std::make_unique<DeviceStagingPool>(*cudaPlugin.load());
    return *staging;
  }
  // CommunicatorAccess::cached (destroyed after the engine's last op).
  std::mutex cacheMutex;
  std::map<std::string, std::shared_ptr<void>> cache;
  // Device ops on NCCL (idle until the first op on device tensors).
  std::unique_ptr<backend::NcclBackend> nccl;
  bool ncclVerify = true;  // GFLOW_NCCL_VERIFY
  Engine engine;

  uint64_t seq = 0;  // touched only by the executing thread
  std::atomic<uint64_t> splitCount{0};
  std::string algoSpec;  // inherited by split()
  std::string algoSource;
  backend::Algorithm lastAlgo[8] = {};

  std::mutex errorMutex;
  std::shared_ptr<const Error> failed;
  std::atomic<bool> notified{false};

  std::atomic<uint64_t> opCount[6] = {};
  std::atomic<uint64_t> pathCount[3] = {};  // shm, hierarchical, network

  // Runs one collective (blocking or async) with the common bookkeeping.
  std::shared_ptr<WorkState> submit(backend::OpDesc desc, bool blocking,
                                    std::function<void(const backend::Op&)> body);
  // Raises kInvalidArgument for `op` and fails the communicator with it.
  [[noreturn]] void invalid(const char* op, const std::string& what);
  // Records the first error (returns it); fail() also aborts the backend and
  // tells the peers, once.
  std::shared_ptr<const Error> setFailed(const Error& e);
  void notifyOnce(const std::shared_ptr<const Error>& e);
  void fail(const Error& e);
  std::shared_ptr<const Error> error();
  void checkUsable(const char* op);
  void validateTensor(const char* op, const char* name, const Tensor& t);
  void validateOp(const char* op, ReduceOp rop);
  // The cuda part of validateTensor (device_ops.cc): the component, the
  // GPU index, the pointer's GPU, the stream.
  void validateCudaTensor(const char* op, const char* name, const Tensor& t);
  // abort() of every backend (host and NCCL); any thread.
  void abortBackends(const Error& e);
  // Executing thread, for an op with device tensors `st`: true when NCCL
  // runs it. Then op.ready is the event after the inputs' producers, and the ranks have
  // checked over the host backend that they all run this op on NCCL
  // (GFLOW_NCCL_VERIFY). False: stage it.
  bool onNccl(backend::Op& op, const DeviceStaging& st);
  // Communicator::split's part on the NCCL backend (src/core/device_ops.cc).
  void splitNccl(int color, int key, Impl* child);

  // Builds the backends for (store, prefix): the flat host backend over the
  // network transport, then, from the host grouping, the shared-memory
  // backend (one host) or the hierarchical one (several hosts).
  static std::unique_ptr<Impl> connect(int rank, int size, transport::ContextOptions ctxOpts,
                                       const std::string& transportName,
                                       const std::string& algoSpec, const std::string& algoSource,
                                       uint64_t hostHash, int localRank, int localSize);
  // Connects the shm or hierarchical backends once hostOf is known.
  void buildHierarchy(const transport::ContextOptions& ctxOpts, int launcherLocalRank,
                      int launcherLocalSize);
};

}  // namespace gflow
