// verbs_overhead: what the verbs transport's protocol costs per allreduce,
// measured on the software RDMA device (tests/testing/soft_verbs.h), where
// speed means nothing but every work request, completion and registration
// is counted. Ranks run as threads, one host id each, so all traffic
// between them crosses verbs with the default GFLOW_IB_* settings.
//
//   verbs_overhead [--ranks N] [--iters K] [--sizes 4K,64K,1M,16M] [--algo ring|rd]
//
// Per allreduce and rank: RDMA work requests posted, writes with immediate,
// completions polled, completion-channel wake-ups, memory registrations, and
// bytes written relative to the ideal ring traffic 2 (N-1)/N x size.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "testing/soft_verbs.h"

namespace sv = gflow::testing::softverbs;

namespace {

uint64_t parseSize(const std::string& s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s.c_str(), &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  if (*end == 'G' || *end == 'g') v <<= 30;
  return v;
}

struct Row {
  double wrs, imm, cqes, events, regs, bytesRatio;
};

Row run(int n, int iters, uint64_t bytes, const std::string& algo, bool registered) {
  sv::Installed dev;
  auto store = gflow::createHashStore();
  std::vector<std::shared_ptr<gflow::Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      gflow::Options o;
      o.rank = r;
      o.size = n;
      o.store = store;
      o.transport = "verbs";
      o.algorithm = algo;
      o.hostId = "host" + std::to_string(r);
      comms[r] = gflow::Communicator::create(o);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  const size_t count = bytes / sizeof(float);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(count, 1.0f));
  std::vector<std::unique_ptr<gflow::MemoryRegistration>> regs;
  if (registered) {
    for (int r = 0; r < n; ++r) regs.push_back(comms[r]->registerMemory(bufs[r].data(), bytes));
  }
  auto once = [&] {
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] { comms[r]->allreduce(gflow::tensor(bufs[r].data(), count)); });
    }
    for (auto& t : threads) t.join();
    threads.clear();
  };
  once();  // sizes and registers the scratch buffers
  sv::resetCounters();
  for (int i = 0; i < iters; ++i) once();
  const sv::Counters c = sv::counters();
  const double per = double(iters) * n;
  const double ideal = 2.0 * (n - 1) / n * double(bytes);
  regs.clear();
  comms.clear();
  return Row{double(c.postSendWrs) / per, double(c.writesWithImm) / per,
             double(c.cqesPolled) / per,  double(c.cqEvents) / per,
             double(c.regMr) / per,       double(c.bytesWritten) / per / ideal};
}

}  // namespace

int main(int argc, char** argv) {
  int n = 4, iters = 10;
  std::string algo = "ring";
  std::vector<uint64_t> sizes = {4 << 10, 64 << 10, 1 << 20, 16 << 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--ranks") {
      n = std::atoi(v.c_str());
    } else if (f == "--iters") {
      iters = std::atoi(v.c_str());
    } else if (f == "--algo") {
      algo = v;
    } else if (f == "--sizes") {
      sizes.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        size_t c = v.find(',', pos);
        sizes.push_back(
            parseSize(v.substr(pos, c == std::string::npos ? std::string::npos : c - pos)));
        if (c == std::string::npos) break;
        pos = c + 1;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: verbs_overhead [--ranks N] [--iters K] [--sizes 4K,1M] [--algo ring|rd]\n");
      return 2;
    }
  }
  std::printf(
      "# verbs protocol overhead per allreduce and rank, software device, %d ranks, %s, %d iters\n",
      n, algo.c_str(), iters);
  std::printf("%10s %10s %8s %8s %8s %8s %8s %10s\n", "bytes", "buffers", "WRs", "imm", "CQEs",
              "wakeups", "reg_mr", "bytes/ring");
  try {
    for (uint64_t b : sizes) {
      for (bool reg : {false, true}) {
        Row r = run(n, iters, b, algo, reg);
        std::printf("%10llu %10s %8.1f %8.1f %8.1f %8.1f %8.2f %10.3f\n", (unsigned long long)b,
                    reg ? "registered" : "plain", r.wrs, r.imm, r.cqes, r.events, r.regs,
                    r.bytesRatio);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verbs_overhead: %s\n", e.what());
    return 1;
  }
  return 0;
}
