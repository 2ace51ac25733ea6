// allreduce_bw: an nccl-tests style sweep over gflow's public API: allreduce,
// or the collective of --op (reduce, broadcast, allgather, reducescatter,
// gather, scatter, alltoall).
//
//   gflowrun -n 4 -- allreduce_bw -b 8 -e 64M -f 2
//   gflowrun -n 4 -- allreduce_bw --op alltoall -b 64K -e 64M
//   mpirun -np 4 allreduce_bw -d all -o all
//   gflowrun -n 4 -- allreduce_bw --backend verbs     (RDMA; docs/backends.md)
//   gflowrun -n 8 -- allreduce_bw --device cuda       (GPU buffers: NCCL or staged)
//
// The communicator comes from the environment (gflowrun, torchrun, Open MPI or
// Slurm variables), as in any gflow program; the sweep itself is
// bench/common/sweep.h, shared with the Gloo and MPI harnesses.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/device_buffers.h"
#include "common/options.h"
#include "common/over_gflow.h"
#include "common/sweep.h"
#include "gflow/gflow.h"

namespace gflow::bench {
namespace {

std::shared_ptr<Communicator> create(const std::string& algorithm, const std::string& transport) {
  Options options;
  options.algorithm = algorithm;
  options.transport = transport;
  return Communicator::create(options);
}

// What setting up the job cost, once the sweep is done: rank 0 prints the
// maxima over the ranks (Stats::Resources) as one line of key=value pairs.
void printSetup(Communicator& comm, double initSeconds) {
  const Stats::Resources r = comm.stats().resources;
  std::vector<double> v = {initSeconds,           double(r.peersConnected),
                           double(r.connections), double(r.storeRequests),
                           double(r.storeServed), double(r.threadsStarted),
                           double(r.pinnedBytes), double(r.sharedBytes)};
  comm.allreduce(tensor(v.data(), v.size()), ReduceOp::kMax);
  if (comm.rank() != 0) return;
  std::printf(
      "# setup init_s=%.3f peers_max=%.0f sockets_max=%.0f store_requests_max=%.0f "
      "store_served=%.0f threads_max=%.0f pinned_bytes=%.0f shared_bytes=%.0f\n",
      v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
  std::fflush(stdout);
}

class GflowBackend : public OverGflow {
 public:
  GflowBackend(const std::string& algorithm, const std::string& transport, bool registerBuffers,
               bool onDevice)
      : OverGflow(create(algorithm, transport)), transport_(transport), register_(registerBuffers) {
    if (onDevice) device_ = std::make_unique<DeviceBuffers>(comm_->localRank());
    if (!algorithm.empty()) {
      algorithm_ = algorithm;
    } else if (const char* env = std::getenv("GFLOW_ALGO"); env && *env) {
      algorithm_ = env;
    }
  }

  RunInfo info() const override {
    const char* env = std::getenv("GFLOW_TRANSPORT");
    const std::string transport =
        !transport_.empty() ? transport_ : (env && *env ? env : "default");
    return RunInfo{"gflow", algorithm_, comm_->size(),
                   std::string("gflow ") + GFLOW_VERSION_STRING + ", transport " + transport +
                       (register_ ? " (buffers registered)" : "") +
                       (device_ ? ", buffers on cuda:" + std::to_string(device_->device()) +
                                      " (GFLOW_DEVICE_BACKEND)"
                                : "") +
                       ", hosts " + std::to_string(comm_->numHosts()) + ", local size " +
                       std::to_string(comm_->localSize()),
                   true};
  }
  bool supports(DataType dtype, ReduceOp op) const override { return supportsReduceOp(dtype, op); }

  bool supports(Collective) const override { return true; }

  std::function<void()> prepare(Collective k, void* in, void* out, size_t count, DataType dtype,
                                ReduceOp op) override {
    Communicator* c = comm_.get();
    if (device_) {
      device_->bind(count * dataTypeSize(dtype), in == out);
      const Device gpu{DeviceType::kCUDA, device_->device()};
      const Tensor din(device_->in(), count, dtype, gpu, device_->stream());
      const Tensor dout(device_->out(), count, dtype, gpu, device_->stream());
      return call(k, din, dout, op);
    }
    // Zero-copy transports: pin the sweep's buffers once per size, as a
    // training loop pins its gradient buffers (not timed).
    regs_.clear();
    if (register_) {
      const size_t bytes = count * dataTypeSize(dtype);
      regs_.push_back(c->registerMemory(in, bytes));
      if (out != in) regs_.push_back(c->registerMemory(out, bytes));
    }
    return call(k, Tensor(in, count, dtype), Tensor(out, count, dtype), op);
  }

  // One run of `k` on whole buffers `in` and `out` (their count is the
  // sweep's; the block ops move count / size() per rank or pair).
  std::function<void()> call(Collective k, Tensor in, Tensor out, ReduceOp op) {
    Communicator* c = comm_.get();
    Tensor inBlock = in, outBlock = out;
    inBlock.count = outBlock.count = in.count / static_cast<size_t>(c->size());
    switch (k) {
      case Collective::kAllreduce:
        if (in.data == out.data) return [=] { c->allreduce(in, op); };
        return [=] { c->allreduce(in, out, op); };
      case Collective::kReduce: return [=] { c->reduce(in, out, kSweepRoot, op); };
      case Collective::kBroadcast: return [=] { c->broadcast(out, kSweepRoot); };
      case Collective::kAllgather: return [=] { c->allgather(inBlock, out); };
      case Collective::kReduceScatter: return [=] { c->reduceScatter(in, outBlock, op); };
      case Collective::kGather: return [=] { c->gather(inBlock, out, kSweepRoot); };
      case Collective::kScatter: return [=] { c->scatter(in, outBlock, kSweepRoot); };
      case Collective::kAlltoall: return [=] { c->alltoall(in, out); };
      case Collective::kSendRecv: {
        const int n = c->size(), r = c->rank();
        if (n == 1) return [=] { std::memcpy(out.data, in.data, in.nbytes()); };
        const std::vector<P2POp> ops = {P2POp::send(in, (r + 1) % n),
                                        P2POp::recv(out, (r + n - 1) % n)};
        return [=] { c->sendRecv(ops); };
      }
    }
    return [] {};
  }

  void upload(const void* in, const void* out, size_t bytes) override {
    if (device_) device_->upload(in, out, bytes);
  }
  void download(void* out, size_t bytes) override {
    if (device_) device_->download(out, bytes);
  }

  // Payload bytes received from each rank (Stats). NCCL's traffic is not
  // counted: once NCCL has run an op, the sweep shows no link columns
  // rather than partial ones.
  std::vector<PeerLink> links() const override {
    const Stats s = comm_->stats();
    if (s.ncclOps > 0) return {};
    std::vector<PeerLink> out(s.peers.size());
    for (size_t p = 0; p < out.size(); ++p) {
      out[p].received = s.peers[p].bytesReceived;
      out[p].sameHost = s.peers[p].sameHost;
    }
    return out;
  }

  // `initSeconds`: how long this rank's construction (the communicator's
  // creation) took.
  void printSetup(double initSeconds) { gflow::bench::printSetup(*comm_, initSeconds); }

 private:
  std::string algorithm_ = "auto";
  std::string transport_;
  bool register_ = false;
  std::vector<std::unique_ptr<MemoryRegistration>> regs_;
  std::unique_ptr<DeviceBuffers> device_;
};

}  // namespace
}  // namespace gflow::bench

int main(int argc, char** argv) {
  using namespace gflow::bench;
  DriverInfo info{"allreduce_bw",
                  "Allreduce bandwidth sweep over gflow (nccl-tests style).",
                  "algorithm, passed as Options::algorithm (GFLOW_ALGO syntax: ring, rd, hier,\n"
                  "               shm, auto, allreduce:0-64k:rd,allreduce:64k-:ring, ...)",
                  {}};
  std::string transport, registerFlag = "auto", device = "cpu";
  info.extraFlags.push_back(
      {"--backend", "NAME",
       "network transport between hosts: tcp or verbs (Options::transport; default\n"
       "               GFLOW_TRANSPORT, else tcp). Ranks of one host still use shared memory\n"
       "               unless GFLOW_SHM=0.",
       &transport});
  info.extraFlags.push_back(
      {"--register", "yes|no|auto",
       "register the buffers (Communicator::registerMemory) before each size;\n"
       "               auto: yes with --backend verbs",
       &registerFlag});
  info.extraFlags.push_back(
      {"--device", "cpu|cuda",
       "where the buffers live; cuda: this rank's GPU (local rank modulo the GPUs),\n"
       "               run by NCCL or staged through host memory (GFLOW_DEVICE_BACKEND)",
       &device});
  SweepConfig cfg;
  if (int rc = parseSweepArgs(argc, argv, info, &cfg); rc >= 0) return rc;
  if (registerFlag != "yes" && registerFlag != "no" && registerFlag != "auto") {
    std::fprintf(stderr, "allreduce_bw: --register takes yes, no or auto\n");
    return 2;
  }
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "allreduce_bw: --device takes cpu or cuda\n");
    return 2;
  }
  const bool registerBuffers =
      registerFlag == "yes" || (registerFlag == "auto" && transport == "verbs");
  try {
    const auto begin = std::chrono::steady_clock::now();
    GflowBackend backend(cfg.algorithm, transport, registerBuffers, device == "cuda");
    const std::chrono::duration<double> init = std::chrono::steady_clock::now() - begin;
    const int rc = runSweep(backend, cfg);
    backend.printSetup(init.count());
    return rc;
  } catch (const gflow::Error& e) {
    std::fprintf(stderr, "allreduce_bw: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bw: %s\n", e.what());
  }
  return 1;
}
