// allreduce_bw: an nccl-tests style allreduce sweep over gflow's public API.
//
//   gflowrun -n 4 -- allreduce_bw -b 8 -e 64M -f 2
//   mpirun -np 4 allreduce_bw -d all -o all
//   gflowrun -n 4 -- allreduce_bw --backend verbs     (RDMA; docs/backends.md)
//
// The communicator comes from the environment (gflowrun, torchrun, Open MPI or
// Slurm variables), as in any gflow program; the sweep itself is
// bench/common/sweep.h, shared with the Gloo and MPI harnesses.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/options.h"
#include "common/sweep.h"
#include "gflow/gflow.h"

namespace gflow::bench {
namespace {

class GflowBackend : public Backend {
 public:
  GflowBackend(const std::string& algorithm, const std::string& transport, bool registerBuffers)
      : transport_(transport), register_(registerBuffers) {
    Options options;
    options.algorithm = algorithm;
    options.transport = transport;
    comm_ = Communicator::create(options);
    if (!algorithm.empty()) {
      algorithm_ = algorithm;
    } else if (const char* env = std::getenv("GFLOW_ALGO"); env && *env) {
      algorithm_ = env;
    }
  }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  RunInfo info() const override {
    const char* env = std::getenv("GFLOW_TRANSPORT");
    const std::string transport =
        !transport_.empty() ? transport_ : (env && *env ? env : "default");
    return RunInfo{"gflow", algorithm_, comm_->size(),
                   std::string("gflow ") + GFLOW_VERSION_STRING + ", transport " + transport +
                       (register_ ? " (buffers registered)" : "") + ", hosts " +
                       std::to_string(comm_->numHosts()) + ", local size " +
                       std::to_string(comm_->localSize())};
  }
  bool supports(DataType, ReduceOp) const override { return true; }

  std::function<void()> prepare(void* in, void* out, size_t count, DataType dtype,
                                ReduceOp op) override {
    Communicator* c = comm_.get();
    // Zero-copy transports: pin the sweep's buffers once per size, as a
    // training loop pins its gradient buffers (not timed).
    regs_.clear();
    if (register_) {
      const size_t bytes = count * dataTypeSize(dtype);
      regs_.push_back(c->registerMemory(in, bytes));
      if (out != in) regs_.push_back(c->registerMemory(out, bytes));
    }
    if (in == out) return [=] { c->allreduce(Tensor(in, count, dtype), op); };
    return [=] { c->allreduce(Tensor(in, count, dtype), Tensor(out, count, dtype), op); };
  }

  void barrier() override { comm_->barrier(); }
  double maxOverRanks(double v) override {
    comm_->allreduce(Tensor(&v, 1, DataType::kFloat64), ReduceOp::kMax);
    return v;
  }
  int64_t sumOverRanks(int64_t v) override {
    comm_->allreduce(Tensor(&v, 1, DataType::kInt64), ReduceOp::kSum);
    return v;
  }

 private:
  std::shared_ptr<Communicator> comm_;
  std::string algorithm_ = "auto";
  std::string transport_;
  bool register_ = false;
  std::vector<std::unique_ptr<MemoryRegistration>> regs_;
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
  std::string transport, registerFlag = "auto";
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
  SweepConfig cfg;
  if (int rc = parseSweepArgs(argc, argv, info, &cfg); rc >= 0) return rc;
  if (registerFlag != "yes" && registerFlag != "no" && registerFlag != "auto") {
    std::fprintf(stderr, "allreduce_bw: --register takes yes, no or auto\n");
    return 2;
  }
  const bool registerBuffers =
      registerFlag == "yes" || (registerFlag == "auto" && transport == "verbs");
  try {
    GflowBackend backend(cfg.algorithm, transport, registerBuffers);
    return runSweep(backend, cfg);
  } catch (const gflow::Error& e) {
    std::fprintf(stderr, "allreduce_bw: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bw: %s\n", e.what());
  }
  return 1;
}
