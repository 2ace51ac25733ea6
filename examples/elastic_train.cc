// Data-parallel SGD that survives a lost rank (docs/elastic.md).
//
//   gflowrun -n 4 --elastic --max-restarts 1 -- elastic_train --kill-rank 2 --kill-at 20
//
// Each rank averages its gradients with a GradientReducer every step. When a
// rank is lost, the survivors' wait() raises the same error naming it; they
// shrink the job's communicator to themselves, build a new reducer on it,
// and take the parameters and the step from the new rank 0 (a survivor that
// finished a step the others did not may be ahead by one). After every step
// the ranks admit a replacement that waits to join (gflowrun starts one with
// GFLOW_JOIN=1 when --max-restarts allows); it receives the parameters the
// same way. At the end every rank prints `digest <hex>` of its parameters:
// all equal, or the job is wrong.
//
// Options:
//   --steps N         steps to train (default 60)
//   --count C         parameters (float32, in 4 tensors; default 262144)
//   --step-ms T       compute time to emulate per step (default 2)
//   --kill-rank R     the rank (of the starting job) that kills itself with
//   --kill-at S       SIGKILL at the start of step S
//   --hosts H         pretend the starting ranks are on H hosts (GFLOW_HOST_ID
//                     per rank: hierarchical collectives on one machine)
//   --wire int8       gradients travel block-quantized with error feedback
//                     (each survivor's residuals carry over a rebuild)
//
// Lines it prints for scripts (tests/examples/elastic.sh,
// bench/elastic/trials.py): `start <epoch ms>` (first thing), `ready <epoch ms> pid <pid> rank <r>`
// (once the communicator is up), `killing <epoch ms>`, `failed <epoch ms> <error>`, `shrunk <epoch
// ms> size <n>` (after the first op on the shrunk communicator), `grew <epoch ms> size <n>`,
// `joined <epoch ms> rank <r>`, `digest <hex> step <s> size <n>`.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "gflow/reducer.h"

namespace {

struct Args {
  int64_t steps = 60;
  size_t count = 262144;
  int stepMs = 2;
  int killRank = -1;
  int64_t killAt = -1;
  int hosts = 0;
  bool int8 = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "elastic_train: %s needs a value\n", f.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (f == "--steps") {
      a.steps = std::atoll(v);
    } else if (f == "--count") {
      a.count = std::strtoull(v, nullptr, 10);
    } else if (f == "--step-ms") {
      a.stepMs = std::atoi(v);
    } else if (f == "--kill-rank") {
      a.killRank = std::atoi(v);
    } else if (f == "--kill-at") {
      a.killAt = std::atoll(v);
    } else if (f == "--hosts") {
      a.hosts = std::atoi(v);
    } else if (f == "--wire") {
      a.int8 = std::strcmp(v, "int8") == 0;
    } else {
      std::fprintf(stderr, "elastic_train: unknown option %s\n", f.c_str());
      std::exit(2);
    }
  }
  if (a.count < 64) a.count = 64;
  return a;
}

int64_t epochMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The model: 4 parameter tensors (the reducer makes several buckets of
// them) and their gradients; `step` is the next step to run.
struct Model {
  std::vector<std::vector<float>> params, grads;
  int64_t step = 0;

  explicit Model(size_t count) {
    for (size_t n : {count / 2, count / 4, count / 8, count - count / 2 - count / 4 - count / 8}) {
      std::vector<float> p(n);
      for (size_t i = 0; i < n; ++i) p[i] = 0.1f * std::sin(float(i + params.size()));
      params.push_back(std::move(p));
      grads.emplace_back(n, 0.0f);
    }
  }
  std::vector<gflow::Tensor> gradTensors() {
    std::vector<gflow::Tensor> t;
    for (auto& g : grads) t.push_back(gflow::tensor(g.data(), g.size()));
    return t;
  }
  // Rank `rank` of `size`'s gradient for this step: the pull towards its
  // own data's target (a hash of step, rank and index).
  void gradient(int rank) {
    for (size_t t = 0; t < grads.size(); ++t) {
      for (size_t i = 0; i < grads[t].size(); ++i) {
        uint32_t h = uint32_t(i * 2654435761u) ^ uint32_t(step * 40503 + rank * 977 + t);
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const float target = float(h % 2001) / 1000.0f - 1.0f;
        grads[t][i] = params[t][i] - target;
      }
    }
  }
  void update() {
    for (size_t t = 0; t < params.size(); ++t) {
      for (size_t i = 0; i < params[t].size(); ++i) params[t][i] -= 0.1f * grads[t][i];
    }
    ++step;
  }
  // Everyone takes rank 0's parameters and step.
  void sync(gflow::Communicator& c) {
    for (auto& p : params) c.broadcast(gflow::tensor(p.data(), p.size()), 0);
    c.broadcast(gflow::tensor(&step, 1), 0);
  }
  std::string digest() const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the parameters' bytes
    for (const auto& p : params) {
      const auto* b = reinterpret_cast<const unsigned char*>(p.data());
      for (size_t i = 0; i < p.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
    }
    char s[17];
    std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
    return s;
  }
};

gflow::Options options(const Args& a) {
  gflow::Options o;
  const char* rank = std::getenv("GFLOW_RANK");
  const char* size = std::getenv("GFLOW_WORLD_SIZE");
  if (a.hosts > 0 && size) {
    // A joiner (no rank) lands on the last pretend host.
    const int r = rank ? std::atoi(rank) : std::atoi(size) - 1;
    o.hostId = "pretend-host-" + std::to_string(r * a.hosts / std::atoi(size));
  }
  return o;
}

// The training loop, from wherever this rank starts (a joiner: synced).
class Trainer {
 public:
  Trainer(Args a, std::shared_ptr<gflow::Communicator> c) : args_(a), model_(a.count) {
    comm_ = std::move(c);
  }

  void start(bool joined) {
    mayKill_ = !joined;
    rebuild();
    if (joined) std::printf("joined %lld rank %d\n", (long long)epochMs(), comm_->rank());
    if (joined) model_.sync(*comm_);
  }

  void run() {
    const int firstRank = comm_->rank();
    while (model_.step < args_.steps) {
      if (mayKill_ && model_.step == args_.killAt && firstRank == args_.killRank) {
        std::printf("killing %lld\n", (long long)epochMs());
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      try {
        step();
      } catch (const gflow::Error& e) {
        recover(e);
      }
    }
    std::printf("digest %s step %lld size %d\n", model_.digest().c_str(), (long long)model_.step,
                comm_->size());
  }

 private:
  // The reducer on the current communicator: built once, then rebuilt
  // (this rank's error-feedback residuals carry over; a joiner's start
  // empty).
  void rebuild() {
    if (reducer_) {
      reducer_->rebuild(comm_);
      return;
    }
    gflow::ReducerOptions o;
    if (args_.int8) o.wire = gflow::DataType::kQInt8;
    reducer_ = std::make_unique<gflow::GradientReducer>(comm_, model_.gradTensors(), o);
  }

  void step() {
    std::this_thread::sleep_for(std::chrono::milliseconds(args_.stepMs));
    model_.gradient(comm_->rank());
    for (size_t i = model_.grads.size(); i-- > 0;) reducer_->ready(i);  // backward order
    reducer_->wait();
    model_.update();
    std::shared_ptr<gflow::Communicator> grown;
    try {
      grown = comm_->grow();
    } catch (const gflow::Error& e) {
      if (comm_->error()) throw;  // a member was lost: recover()
      // A joiner lost while connecting: the members go on as they were.
      std::printf("grow failed %lld %s\n", (long long)epochMs(), e.what());
      return;
    }
    if (!grown) return;
    comm_ = grown;
    rebuild();
    model_.sync(*comm_);
    std::printf("grew %lld size %d\n", (long long)epochMs(), comm_->size());
  }

  // Every survivor's error names the same culprit, in the numbering of the
  // job's communicator (the reducer's is split from it in rank order).
  void recover(const gflow::Error& e) {
    std::printf("failed %lld %s\n", (long long)epochMs(), e.what());
    if (e.peer() < 0) throw;
    comm_ = comm_->shrink({e.peer()});
    if (!comm_) {
      std::printf("excluded: the others went on without this rank\n");
      std::exit(3);
    }
    rebuild();
    model_.sync(*comm_);
    std::printf("shrunk %lld size %d\n", (long long)epochMs(), comm_->size());
  }

  Args args_;
  Model model_;
  std::shared_ptr<gflow::Communicator> comm_;
  std::unique_ptr<gflow::GradientReducer> reducer_;
  bool mayKill_ = true;  // a replacement never plays the victim
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::printf("start %lld\n", (long long)epochMs());
  const char* join = std::getenv("GFLOW_JOIN");
  const bool joining = join && std::strcmp(join, "1") == 0;
  try {
    auto comm = joining ? gflow::Communicator::join(options(args))
                        : gflow::Communicator::create(options(args));
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::printf("ready %lld pid %d rank %d\n", (long long)epochMs(), int(::getpid()), comm->rank());
    Trainer t(args, comm);
    t.start(joining);
    t.run();
  } catch (const gflow::Error& e) {
    std::fprintf(stderr, "elastic_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
