// nccl_allreduce_bw: the sweep of bench/common straight over NCCL's public
// API on device buffers, for side-by-side numbers with
// `allreduce_bw --device cuda` on gflow's NCCL backend (what gflow adds per
// op: validation, the op check, stream events, completion on its threads).
//
//   gflowrun -n 8 -- nccl_allreduce_bw -b 8 -e 256M -f 4
//
// One rank per GPU (local rank modulo the GPUs it sees), as NCCL requires.
// A gflow communicator from the launcher's environment carries the bootstrap
// (rank 0's ncclUniqueId, broadcast) and the sweep's barriers and timing
// reductions on host memory; it never touches the device buffers. Each timed
// run is the NCCL call on the buffers' stream followed by a stream
// synchronize, the same point at which gflow's blocking call returns.
// --nonblocking yes makes the communicator non-blocking (config.blocking =
// 0, as gflow's are) and polls ncclCommGetAsyncError after each call.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/device_buffers.h"
#include "common/options.h"
#include "common/over_gflow.h"
#include "common/sweep.h"
#include "gflow/gflow.h"

namespace gflow::bench {
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

// A non-blocking communicator's call may answer ncclInProgress: poll it out.
void settle(ncclComm_t comm, ncclResult_t r, const char* what) {
  while (r == ncclInProgress) {
    ncclResult_t a = ncclSuccess;
    check(ncclCommGetAsyncError(comm, &a), "ncclCommGetAsyncError");
    r = a;
  }
  check(r, what);
}

// -1: NCCL has no such type.
int ncclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt8: return ncclInt8;
    default: return -1;
  }
}

int ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
    default: return -1;
  }
}

class NcclBackend : public OverGflow {
 public:
  explicit NcclBackend(bool nonBlocking) : OverGflow(Communicator::create(Options{})) {
    buffers_ = std::make_unique<DeviceBuffers>(comm_->localRank());
    ncclUniqueId id{};
    if (comm_->rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    comm_->broadcast(Tensor(&id, sizeof id, DataType::kUInt8), 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = nonBlocking ? 0 : 1;
    const ncclResult_t r =
        ncclCommInitRankConfig(&nccl_, comm_->size(), id, comm_->rank(), &config);
    settle(nccl_, r, "ncclCommInitRankConfig");
    mode_ = nonBlocking ? "non-blocking" : "blocking";
    int v = 0;
    ncclGetVersion(&v);
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
               std::to_string(v % 100);
  }
  ~NcclBackend() override {
    if (nccl_) ncclCommDestroy(nccl_);
  }

  RunInfo info() const override {
    return RunInfo{"nccl", "nccl", comm_->size(),
                   "NCCL " + version_ + ", " + mode_ + " communicator, buffers on cuda:" +
                       std::to_string(buffers_->device()) + " (raw, no gflow on the data path)",
                   true};
  }
  bool supports(DataType dtype, ReduceOp op) const override {
    return ncclType(dtype) >= 0 && ncclOp(op) >= 0;
  }
  bool supports(Collective c) const override {
    return c == Collective::kAllreduce || c == Collective::kReduce || c == Collective::kBroadcast ||
           c == Collective::kAllgather || c == Collective::kReduceScatter;
  }

  // The host buffers only say whether the run is in place; the device
  // copies of them are what NCCL reads and writes.
  std::function<void()> prepare(Collective k, void* hostIn, void* hostOut, size_t count,
                                DataType dtype, ReduceOp op) override {
    buffers_->bind(count * dataTypeSize(dtype), hostIn == hostOut);
    const void* in = buffers_->in();
    void* out = buffers_->out();
    const auto t = static_cast<ncclDataType_t>(ncclType(dtype));
    const auto o = static_cast<ncclRedOp_t>(ncclOp(op));
    const size_t block = count / static_cast<size_t>(comm_->size());
    // Broadcast and allgather move bytes: every type, as gflow's NCCL path.
    const size_t es = dataTypeSize(dtype);
    auto s = static_cast<cudaStream_t>(buffers_->stream());
    ncclComm_t c = nccl_;
    DeviceBuffers* b = buffers_.get();
    std::function<ncclResult_t()> call;
    switch (k) {
      case Collective::kAllreduce:
        call = [=] { return ncclAllReduce(in, out, count, t, o, c, s); };
        break;
      case Collective::kReduce:
        call = [=] { return ncclReduce(in, out, count, t, o, kSweepRoot, c, s); };
        break;
      case Collective::kBroadcast:
        call = [=] { return ncclBroadcast(out, out, count * es, ncclUint8, kSweepRoot, c, s); };
        break;
      case Collective::kAllgather:
        call = [=] { return ncclAllGather(in, out, block * es, ncclUint8, c, s); };
        break;
      case Collective::kReduceScatter:
        call = [=] { return ncclReduceScatter(in, out, block, t, o, c, s); };
        break;
      default: throw std::invalid_argument("nccl_allreduce_bw: collective not supported");
    }
    return [call, b, c] {
      settle(c, call(), "NCCL collective");
      b->synchronize();
    };
  }
  void upload(const void* in, const void* out, size_t bytes) override {
    buffers_->upload(in, out, bytes);
  }
  void download(void* out, size_t bytes) override { buffers_->download(out, bytes); }

 private:
  std::unique_ptr<DeviceBuffers> buffers_;
  ncclComm_t nccl_ = nullptr;
  std::string version_;
  const char* mode_ = "";
};

}  // namespace
}  // namespace gflow::bench

int main(int argc, char** argv) {
  using namespace gflow::bench;
  DriverInfo info{"nccl_allreduce_bw",
                  "Allreduce bandwidth sweep straight over NCCL on device buffers, same flags "
                  "and columns as allreduce_bw --device cuda.",
                  "ignored (NCCL chooses its own algorithm; NCCL_ALGO sets it)",
                  {}};
  std::string nonBlocking = "no";
  info.extraFlags.push_back({"--nonblocking", "yes|no",
                             "a non-blocking NCCL communicator (config.blocking = 0), as\n"
                             "               gflow's NCCL backend makes (default no)",
                             &nonBlocking});
  SweepConfig cfg;
  if (int rc = parseSweepArgs(argc, argv, info, &cfg); rc >= 0) return rc;
  if (nonBlocking != "yes" && nonBlocking != "no") {
    std::fprintf(stderr, "nccl_allreduce_bw: --nonblocking takes yes or no\n");
    return 2;
  }
  try {
    NcclBackend backend(nonBlocking == "yes");
    return runSweep(backend, cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_allreduce_bw: %s\n", e.what());
  }
  return 1;
}
