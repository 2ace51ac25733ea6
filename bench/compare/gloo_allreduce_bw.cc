// gloo_allreduce_bw: the allreduce sweep of bench/common over Gloo (the
// library PyTorch's CPU backend uses), for side-by-side numbers with gflow's
// allreduce_bw. Only Gloo's public API is used.
//
//   gflowrun -n 4 -- gloo_allreduce_bw -a ring_chunked -e 64M
//
// Rank and world size come from the launcher's environment (gflowrun, Open
// MPI, Slurm or torchrun variables). Rendezvous goes through a gloo FileStore
// in a directory all ranks see (--store; default a per-job directory under
// /tmp named after GFLOW_JOB_TOKEN or the launcher's job id); data moves over
// gloo's TCP transport on --host (default 127.0.0.1).
//
// -a picks the algorithm:
//   ring, ring_chunked, halving_doubling, bcube: Gloo's algorithm classes.
//     They reduce in place; out-of-place is a copy into the output buffer
//     followed by the in-place algorithm (how a caller would use them).
//   func_ring, func_bcube: the gloo::allreduce() function API (the one
//     PyTorch's ProcessGroupGloo calls), with separate input and output.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/options.h"
#include "common/sweep.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_bcube.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/config.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace gflow::bench {
namespace {

const char* const kAlgorithms[] = {"ring",  "ring_chunked", "halving_doubling",
                                   "bcube", "func_ring",    "func_bcube"};

struct LaunchEnv {
  int rank = -1;
  int size = -1;
  std::string job;  // distinguishes concurrent and successive jobs in the store
};

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// Gloo has no launcher integration of its own; read the usual variables.
LaunchEnv launchEnv() {
  static const char* const kPairs[][2] = {{"GFLOW_RANK", "GFLOW_WORLD_SIZE"},
                                          {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                          {"PMI_RANK", "PMI_SIZE"},
                                          {"SLURM_PROCID", "SLURM_NTASKS"},
                                          {"RANK", "WORLD_SIZE"}};
  LaunchEnv e;
  for (const auto& p : kPairs) {
    if (env(p[0]) && env(p[1])) {
      e.rank = std::atoi(env(p[0]));
      e.size = std::atoi(env(p[1]));
      break;
    }
  }
  if (const char* t = env("GFLOW_JOB_TOKEN")) {
    e.job = std::string(t).substr(0, 16);
  } else if (const char* j = env("OMPI_MCA_ess_base_jobid")) {
    e.job = std::string("ompi") + j;
  } else if (const char* s = env("SLURM_JOB_ID")) {
    e.job = std::string("slurm") + s + "." + (env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "0");
  } else if (const char* r = env("GFLOW_ROOT")) {
    e.job = r;
  } else if (const char* m = env("MASTER_PORT")) {
    e.job = std::string("torch") + m;
  } else {
    e.job = "default";
  }
  for (char& c : e.job) {
    if (c == '/' || c == ':') c = '_';
  }
  return e;
}

template <typename T>
const gloo::ReductionFunction<T>* reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return gloo::ReductionFunction<T>::sum;
    case ReduceOp::kProd: return gloo::ReductionFunction<T>::product;
    case ReduceOp::kMin: return gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax: return gloo::ReductionFunction<T>::max;
    case ReduceOp::kAvg:
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: break;
  }
  return nullptr;
}

// gloo::sum<T> and friends are overloaded (typed and void* forms); the
// function API wants the void* one.
using VoidReduce = void (*)(void*, const void*, const void*, size_t);

template <typename T>
VoidReduce reductionFunc(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &gloo::sum<T>;
    case ReduceOp::kProd: return &gloo::product<T>;
    case ReduceOp::kMin: return &gloo::min<T>;
    case ReduceOp::kMax: return &gloo::max<T>;
    case ReduceOp::kAvg:
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: break;
  }
  return nullptr;
}

class GlooBackend : public Backend {
 public:
  GlooBackend(const SweepConfig& cfg, const std::string& storeDir, const std::string& host)
      : algorithm_(cfg.algorithm.empty() ? "ring" : cfg.algorithm) {
    bool known = false;
    for (const char* a : kAlgorithms) known = known || algorithm_ == a;
    if (!known) {
      throw std::invalid_argument("-a " + algorithm_ +
                                  ": expected ring, ring_chunked, halving_doubling, bcube, "
                                  "func_ring or func_bcube");
    }
    LaunchEnv le = launchEnv();
    if (le.rank < 0 || le.size < 1 || le.rank >= le.size) {
      throw std::invalid_argument(
          "cannot tell rank and world size: run under gflowrun, mpirun, srun or torchrun");
    }
    storeDir_ = storeDir;
    if (storeDir_.empty()) {
      storeDir_ = "/tmp/gloo_allreduce_bw." + le.job;
      ownStore_ = true;  // ours to delete at the end
    }
    ::mkdir(storeDir_.c_str(), 0700);  // every rank tries; EEXIST is fine

    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore files(storeDir_);
    gloo::rendezvous::PrefixStore store(le.job, files);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(le.rank, le.size);
    ctx->setTimeout(std::chrono::seconds(300));
    ctx->connectFullMesh(store, dev);
    ctx_ = ctx;
  }

  ~GlooBackend() override {
    // Nobody reads the store after the last barrier of the sweep.
    if (ownStore_ && ctx_ && ctx_->rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(storeDir_, ec);
    }
  }

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  RunInfo info() const override {
    return RunInfo{"gloo", algorithm_, ctx_->size,
                   "gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." +
                       std::to_string(GLOO_VERSION_MINOR) + ", tcp transport, store " + storeDir_};
  }

  bool supports(DataType dtype, ReduceOp op) const override {
    // Gloo has no average and no bitwise reductions.
    if (op == ReduceOp::kAvg || op == ReduceOp::kBand || op == ReduceOp::kBor ||
        op == ReduceOp::kBxor) {
      return false;
    }
    switch (dtype) {
      case DataType::kFloat32:
      case DataType::kFloat16:
      case DataType::kFloat64:
      case DataType::kInt32:
      case DataType::kInt64:
      case DataType::kUInt8:
      case DataType::kInt8: return true;
      default: return false;
    }
  }

  std::function<void()> prepare(Collective, void* in, void* out, size_t count, DataType dtype,
                                ReduceOp op) override {
    switch (dtype) {
      case DataType::kFloat32: return prepareTyped<float>(in, out, count, op);
      case DataType::kFloat16: return prepareTyped<gloo::float16>(in, out, count, op);
      case DataType::kFloat64: return prepareTyped<double>(in, out, count, op);
      case DataType::kInt32: return prepareTyped<int32_t>(in, out, count, op);
      case DataType::kInt64: return prepareTyped<int64_t>(in, out, count, op);
      case DataType::kUInt8: return prepareTyped<uint8_t>(in, out, count, op);
      case DataType::kInt8: return prepareTyped<int8_t>(in, out, count, op);
      default: break;
    }
    throw std::invalid_argument("unsupported data type");
  }

  void barrier() override {
    gloo::BarrierOptions opts(ctx_);
    gloo::barrier(opts);
  }
  double maxOverRanks(double v) override {
    return reduceOne(v, reductionFunc<double>(ReduceOp::kMax));
  }
  int64_t sumOverRanks(int64_t v) override {
    return reduceOne(v, reductionFunc<int64_t>(ReduceOp::kSum));
  }

 private:
  template <typename T>
  T reduceOne(T v, VoidReduce fn) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(&v, 1);
    opts.setReduceFunction(fn);
    gloo::allreduce(opts);
    return v;
  }

  template <typename T>
  std::function<void()> prepareTyped(void* in, void* out, size_t count, ReduceOp op) {
    T* src = static_cast<T*>(in);
    T* dst = static_cast<T*>(out);
    if (algorithm_ == "func_ring" || algorithm_ == "func_bcube") {
      auto opts = std::make_shared<gloo::AllreduceOptions>(ctx_);
      opts->setAlgorithm(algorithm_ == "func_ring" ? gloo::AllreduceOptions::Algorithm::RING
                                                   : gloo::AllreduceOptions::Algorithm::BCUBE);
      if (src != dst) opts->setInput(src, count);
      opts->setOutput(dst, count);
      opts->setReduceFunction(reductionFunc<T>(op));
      return [opts] { gloo::allreduce(*opts); };
    }
    // The algorithm classes take an int count and work in place on dst.
    std::vector<T*> ptrs{dst};
    int n = static_cast<int>(count);
    const gloo::ReductionFunction<T>* fn = reduction<T>(op);
    std::shared_ptr<gloo::Algorithm> algo;
    if (algorithm_ == "ring") {
      algo = std::make_shared<gloo::AllreduceRing<T>>(ctx_, ptrs, n, fn);
    } else if (algorithm_ == "ring_chunked") {
      algo = std::make_shared<gloo::AllreduceRingChunked<T>>(ctx_, ptrs, n, fn);
    } else if (algorithm_ == "halving_doubling") {
      algo = std::make_shared<gloo::AllreduceHalvingDoubling<T>>(ctx_, ptrs, n, fn);
    } else {
      algo = std::make_shared<gloo::AllreduceBcube<T>>(ctx_, ptrs, n, fn);
    }
    if (in == out) return [algo] { algo->run(); };
    size_t bytes = count * sizeof(T);
    return [algo, in, out, bytes] {
      std::memcpy(out, in, bytes);
      algo->run();
    };
  }

  std::string algorithm_;
  std::string storeDir_;
  bool ownStore_ = false;
  std::shared_ptr<gloo::Context> ctx_;
};

}  // namespace
}  // namespace gflow::bench

int main(int argc, char** argv) {
  using namespace gflow::bench;
  std::string storeDir;
  std::string host = "127.0.0.1";
  DriverInfo info{
      "gloo_allreduce_bw",
      "Allreduce bandwidth sweep over Gloo, same flags and columns as allreduce_bw.",
      "ring (default), ring_chunked, halving_doubling, bcube, func_ring, func_bcube",
      {{"--store", "DIR", "rendezvous directory shared by all ranks", &storeDir},
       {"--host", "ADDR", "address of gloo's TCP transport (default 127.0.0.1)", &host}}};
  SweepConfig cfg;
  if (int rc = parseSweepArgs(argc, argv, info, &cfg); rc >= 0) return rc;
  try {
    GlooBackend backend(cfg, storeDir, host);
    int rc = runSweep(backend, cfg);
    backend.barrier();  // the store may go only when every rank is done with it
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce_bw: %s\n", e.what());
  }
  return 1;
}
