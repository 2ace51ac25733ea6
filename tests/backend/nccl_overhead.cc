// nccl_overhead: what gflow adds around an NCCL op between ranks, measured
// on the software CUDA and NCCL (tests/testing/soft_cuda.h, soft_nccl.h),
// whose "kernels" are host threads: the numbers are this machine's host
// costs (the executing thread's route, the op check's round trip over the
// host path, the event waits), not a GPU's. Ranks run as threads of one
// process, each on its own soft GPU, one host (the op check runs over
// shared memory) or, with --network, over loopback TCP.
//
//   nccl_overhead [--ranks N] [--iters K] [--rounds R] [--count C] [--network]
//
// Per round, interleaved: K device allreduces of C float32 with the op
// check off (GFLOW_NCCL_VERIFY=0), then with it on, each after a warm-up.
// Prints us per op for each, per round, and the median of the per-round
// differences (the check's cost per op).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "testing/soft_cuda.h"
#include "testing/soft_nccl.h"

namespace softcuda = gflow::testing::softcuda;
namespace softnccl = gflow::testing::softnccl;

namespace {

struct Config {
  int ranks = 2;
  int iters = 2000;
  int rounds = 7;
  size_t count = 256;
  bool network = false;
};

// us per op of `iters` allreduces on every rank (rank 0's clock).
double run(const Config& cfg, bool verify) {
  auto store = gflow::createHashStore();
  std::vector<std::shared_ptr<gflow::Communicator>> comms(cfg.ranks);
  std::vector<std::thread> threads;
  std::vector<double> us(cfg.ranks);
  for (int r = 0; r < cfg.ranks; ++r) {
    threads.emplace_back([&, r] {
      gflow::Options o;
      o.rank = r;
      o.size = cfg.ranks;
      o.store = store;
      o.shm.enabled = !cfg.network;
      o.device.verifyOps = verify;
      o.device.backend = "nccl";
      auto c = gflow::Communicator::create(o);
      void* mem = softcuda::alloc(r, cfg.count * sizeof(float));
      const gflow::Tensor t(mem, cfg.count, gflow::DataType::kFloat32,
                            gflow::Device{gflow::DeviceType::kCUDA, r});
      for (int i = 0; i < 50; ++i) c->allreduce(t);
      c->barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < cfg.iters; ++i) c->allreduce(t);
      us[r] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count() /
              cfg.iters;
      c->barrier();
      c.reset();
      softcuda::free(mem);
    });
  }
  for (auto& t : threads) t.join();
  return us[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (f == "--network") {
      cfg.network = true;
      continue;
    }
    if (f == "--ranks") {
      cfg.ranks = std::atoi(v);
    } else if (f == "--iters") {
      cfg.iters = std::atoi(v);
    } else if (f == "--rounds") {
      cfg.rounds = std::atoi(v);
    } else if (f == "--count") {
      cfg.count = static_cast<size_t>(std::atoll(v));
    } else {
      std::fprintf(stderr,
                   "usage: nccl_overhead [--ranks N] [--iters K] [--rounds R] [--count C] "
                   "[--network]\n");
      return 2;
    }
    ++i;
  }
  softcuda::install(cfg.ranks);
  softnccl::enable();
  std::printf(
      "# device allreduce of %zu float32 on the software NCCL, %d ranks (threads), %s, "
      "%d ops per run\n",
      cfg.count, cfg.ranks, cfg.network ? "host path TCP" : "host path shared memory", cfg.iters);
  std::printf("%6s %12s %12s %12s\n", "round", "off_us", "check_us", "diff_us");
  std::vector<double> diffs;
  try {
    for (int r = 0; r < cfg.rounds; ++r) {
      const double off = run(cfg, false), on = run(cfg, true);
      diffs.push_back(on - off);
      std::printf("%6d %12.2f %12.2f %12.2f\n", r + 1, off, on, on - off);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_overhead: %s\n", e.what());
    return 1;
  }
  std::printf("median of the per-round differences: %.2f us per op\n", median(diffs));
  softcuda::uninstall();
  return 0;
}
