// fusion_bench: what lazy allreduce with chunk fusion buys a training step.
//
//   gflowrun -n 4 fusion_bench --model bench/models/resnet50.txt
//   gflowrun -n 4 --no-prefix fusion_bench --model bench/models/bert_base.txt --csv
//
// It replays a model's gradient table (bench/models/*.txt: "<name> <count>"
// float32 rows in the order backward produces them) with a simulated backward:
// per step, tensor i becomes ready once its share of --compute-ms has passed
// (shares in proportion to element counts, cumulative, so deadlines do not
// drift). The "layers" sleep rather than spin, so several ranks on a few cores
// leave the CPU to the communication threads, as a GPU trainer would.
//
// Modes, measured side by side in one run:
//   per-tensor       allreduceAsync(grad, avg) as each gradient is ready, then
//                    wait for all of them (no fusion);
//   fused:<T>        GradientReducer with fusionThreshold T: ready(i) as each
//                    gradient is ready, wait() at the end;
//   all-at-end       after backward, one allreduce of the one contiguous buffer
//                    that holds every gradient (no overlap).
// Step time is backward start to every gradient reduced (max over ranks, per
// step). Comm time is the step time of the same mode with compute 0. Derived:
//   pt/comm     per-tensor comm / this mode's comm (what fusion saves);
//   step/bound  step / max(compute, all-at-end comm), where 1.0 is a perfectly
//               overlapped step.
// Every step checks the result: rank r writes k + 2r (k = 0..63 per element),
// so the average k + size - 1 is exact in float32; wrong values are printed
// and make the exit status 1. Uses only gflow's public API.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "gflow/reducer.h"

namespace {

using Clock = std::chrono::steady_clock;
using gflow::ReduceOp;

struct Config {
  std::string model;
  double computeMs = 60;
  int steps = 10;
  int warmup = 2;
  std::vector<uint64_t> thresholds = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
  std::vector<std::string> modes;  // empty: all
  long cycleMs = -1;
  std::string layout = "separate";
  double scale = 1.0;
  bool csv = false;
};

const char kUsage[] =
    "usage: fusion_bench --model FILE [options]   (run under gflowrun -n N)\n"
    "  --model FILE        gradient table: '<name> <elements>' rows, backward order\n"
    "  --compute-ms MS     simulated backward time per step (default 60)\n"
    "  --steps N           measured steps per mode (default 10)\n"
    "  --warmup N          unmeasured steps per mode (default 2)\n"
    "  --thresholds LIST   fusion thresholds in bytes, K/M/G suffixes (default 1M,4M,16M,64M)\n"
    "  --modes LIST        per-tensor, fused, fused:<T>, all-at-end (default all)\n"
    "  --cycle-ms N        ReducerOptions::cycleTime for the fused modes (default: library's)\n"
    "  --layout L          separate: every gradient its own allocation (fused buckets\n"
    "                      pack and unpack); flat: views into one buffer in table\n"
    "                      order (fused buckets reduce in place) (default separate)\n"
    "  --scale F           multiply every tensor's size by F (default 1)\n"
    "  --csv               print CSV instead of the table (use gflowrun --no-prefix)\n"
    "  --help              this text\n";

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

uint64_t parseBytes(const std::string& s) {
  size_t end = 0;
  const double v = std::stod(s, &end);
  double mult = 1;
  const std::string suffix = s.substr(end);
  if (suffix == "K" || suffix == "k") {
    mult = 1024.0;
  } else if (suffix == "M" || suffix == "m") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g") {
    mult = 1024.0 * 1024 * 1024;
  } else if (!suffix.empty()) {
    throw std::invalid_argument("bad size '" + s + "'");
  }
  if (v * mult < 1) throw std::invalid_argument("size '" + s + "' must be positive");
  return static_cast<uint64_t>(v * mult);
}

std::string bytesName(uint64_t b) {
  const char* units[] = {"", "K", "M", "G"};
  int u = 0;
  while (u < 3 && b % 1024 == 0 && b >= 1024) b /= 1024, ++u;
  return std::to_string(b) + units[u];
}

// Returns -1 to go on, else the exit status.
int parseArgs(int argc, char** argv, Config* cfg) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    const size_t eq = flag.find('=');
    bool hasValue = false;
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1), flag = flag.substr(0, eq), hasValue = true;
    }
    auto take = [&]() -> std::string {
      if (hasValue) return value;
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (flag == "--model") {
      cfg->model = take();
    } else if (flag == "--compute-ms") {
      cfg->computeMs = std::stod(take());
    } else if (flag == "--steps") {
      cfg->steps = std::stoi(take());
    } else if (flag == "--warmup") {
      cfg->warmup = std::stoi(take());
    } else if (flag == "--thresholds") {
      cfg->thresholds.clear();
      for (const auto& t : splitList(take())) cfg->thresholds.push_back(parseBytes(t));
    } else if (flag == "--modes") {
      cfg->modes = splitList(take());
    } else if (flag == "--cycle-ms") {
      cfg->cycleMs = std::stol(take());
    } else if (flag == "--scale") {
      cfg->scale = std::stod(take());
      if (!(cfg->scale > 0)) throw std::invalid_argument("--scale must be > 0");
    } else if (flag == "--layout") {
      cfg->layout = take();
      if (cfg->layout != "flat" && cfg->layout != "separate") {
        throw std::invalid_argument("--layout takes flat or separate");
      }
    } else if (flag == "--csv") {
      cfg->csv = true;
    } else {
      throw std::invalid_argument("unknown flag '" + flag + "'");
    }
  }
  if (cfg->model.empty()) throw std::invalid_argument("--model is required");
  if (cfg->steps < 1 || cfg->warmup < 0 || cfg->computeMs < 0) {
    throw std::invalid_argument("need --steps >= 1, --warmup >= 0, --compute-ms >= 0");
  }
  return -1;
}

struct Model {
  std::vector<std::string> names;
  std::vector<size_t> counts;
  size_t total = 0;
};

// `scale` multiplies every count (at least 1 element each): scale 0.01 keeps
// the tensor count and mix of a model at 1/100 of its bytes, i.e. the
// bytes-to-latency ratio of a network ~100x faster than this one.
Model readModel(const std::string& path, double scale) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open model table '" + path + "'");
  Model m;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    std::string name;
    long long count = 0;
    if (!(row >> name >> count) || count <= 0) {
      throw std::runtime_error(path + ": bad row '" + line + "'");
    }
    const auto scaled =
        std::max<size_t>(1, static_cast<size_t>(static_cast<double>(count) * scale + 0.5));
    m.names.push_back(name);
    m.counts.push_back(scaled);
    m.total += scaled;
  }
  if (m.names.empty()) throw std::runtime_error(path + ": no tensors");
  return m;
}

struct Mode {
  std::string name;
  uint64_t threshold = 0;  // fused modes
};

struct Result {
  Mode mode;
  double opsPerStep = 0;
  double stepMed = 0, stepMin = 0, commMed = 0, commMin = 0;
};

class Bench {
 public:
  Bench(const Config& cfg, Model model, std::shared_ptr<gflow::Communicator> comm)
      : cfg_(cfg), model_(std::move(model)), comm_(std::move(comm)), buffer_(model_.total) {
    size_t at = 0;
    for (size_t i = 0; i < model_.counts.size(); ++i) {
      offsets_.push_back(at);
      if (cfg_.layout == "flat") {
        grads_.push_back(gflow::tensor(buffer_.data() + at, model_.counts[i]));
      } else {
        // Its own allocation, with a gap so no two are adjacent by chance.
        separate_.emplace_back(model_.counts[i] + 16);
        grads_.push_back(gflow::tensor(separate_.back().data(), model_.counts[i]));
      }
      at += model_.counts[i];
    }
  }

  // Runs `mode` with and without compute; returns the results (rank 0's copy
  // is the one printed; every rank computes the same numbers).
  Result run(const Mode& mode) {
    Result r;
    r.mode = mode;
    std::unique_ptr<gflow::GradientReducer> reducer;
    if (mode.threshold > 0) {
      gflow::ReducerOptions options;
      options.op = ReduceOp::kAvg;
      options.fusionThreshold = mode.threshold;
      options.cycleTime = std::chrono::milliseconds(cfg_.cycleMs);
      options.names = model_.names;
      reducer = std::make_unique<gflow::GradientReducer>(comm_, grads_, options);
    }
    const std::vector<double> step = pass(mode, reducer.get(), cfg_.computeMs);
    const std::vector<double> comm = cfg_.computeMs > 0 ? pass(mode, reducer.get(), 0.0) : step;
    if (reducer) {
      const gflow::ReducerStats s = reducer->stats();
      r.opsPerStep = s.steps ? static_cast<double>(s.fusedOps) / static_cast<double>(s.steps) : 0;
    } else {
      r.opsPerStep = mode.name == "per-tensor" ? static_cast<double>(grads_.size()) : 1.0;
    }
    summarize(step, &r.stepMed, &r.stepMin);
    summarize(comm, &r.commMed, &r.commMin);
    reducer.reset();
    comm_->barrier();
    return r;
  }

  int64_t wrongTotal() {
    int64_t w = wrong_;
    comm_->allreduce(gflow::Tensor(&w, 1, gflow::DataType::kInt64), ReduceOp::kSum);
    return w;
  }

 private:
  // warmup + steps steps; returns the measured step times (ms, max over ranks).
  std::vector<double> pass(const Mode& mode, gflow::GradientReducer* reducer, double computeMs) {
    // Tensor i is ready at start + deadline[i].
    std::vector<Clock::duration> deadline;
    size_t done = 0;
    for (size_t c : model_.counts) {
      done += c;
      const double ms = computeMs * static_cast<double>(done) / static_cast<double>(model_.total);
      deadline.push_back(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(ms)));
    }
    std::vector<double> times;
    std::vector<gflow::Work> works;
    works.reserve(grads_.size());
    for (int s = 0; s < cfg_.warmup + cfg_.steps; ++s) {
      fill(mode, s);
      comm_->barrier();
      const Clock::time_point t0 = Clock::now();
      if (mode.name == "all-at-end") {
        std::this_thread::sleep_until(t0 + deadline.back());
        comm_->allreduce(gflow::tensor(buffer_.data(), buffer_.size()), ReduceOp::kAvg);
      } else {
        for (size_t i = 0; i < grads_.size(); ++i) {
          std::this_thread::sleep_until(t0 + deadline[i]);
          if (reducer) {
            reducer->ready(i);
          } else {
            works.push_back(comm_->allreduceAsync(grads_[i], ReduceOp::kAvg));
          }
        }
        if (reducer) reducer->wait();
        for (const gflow::Work& w : works) w.wait();
        works.clear();
      }
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      check(mode, s);
      if (s >= cfg_.warmup) times.push_back(ms);
    }
    comm_->allreduce(gflow::Tensor(times.data(), times.size(), gflow::DataType::kFloat64),
                     ReduceOp::kMax);
    return times;
  }

  static float base(size_t i, int step, size_t j) {
    return static_cast<float>((j + i * 31 + static_cast<size_t>(step) * 7) & 63);
  }

  // Where gradient i lives for `mode`: all-at-end always reduces the flat
  // buffer; the other modes use the gradients of --layout.
  float* data(const Mode& mode, size_t i) {
    return mode.name == "all-at-end" ? buffer_.data() + offsets_[i]
                                     : static_cast<float*>(grads_[i].data);
  }

  void fill(const Mode& mode, int step) {
    const auto mine = static_cast<float>(2 * comm_->rank());
    for (size_t i = 0; i < grads_.size(); ++i) {
      float* p = data(mode, i);
      for (size_t j = 0; j < model_.counts[i]; ++j) p[j] = base(i, step, j) + mine;
    }
  }

  void check(const Mode& mode, int step) {
    const auto add = static_cast<float>(comm_->size() - 1);
    for (size_t i = 0; i < grads_.size(); ++i) {
      const float* p = data(mode, i);
      for (size_t j = 0; j < model_.counts[i]; ++j) {
        const float want = base(i, step, j) + add;
        if (p[j] == want) continue;
        if (++wrong_ <= 10) {
          std::fprintf(stderr, "fusion_bench: rank %d %s step %d: %s[%zu] = %g, expected %g\n",
                       comm_->rank(), mode.name.c_str(), step, model_.names[i].c_str(), j,
                       static_cast<double>(p[j]), static_cast<double>(want));
        }
      }
    }
  }

  static void summarize(std::vector<double> v, double* med, double* min) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *min = v.front();
  }

  const Config& cfg_;
  Model model_;
  std::shared_ptr<gflow::Communicator> comm_;
  std::vector<float> buffer_;  // every gradient, contiguous (all-at-end reduces it whole)
  std::vector<std::vector<float>> separate_;  // --layout separate
  std::vector<size_t> offsets_;
  std::vector<gflow::Tensor> grads_;
  int64_t wrong_ = 0;
};

std::vector<Mode> buildModes(const Config& cfg) {
  std::vector<std::string> names = cfg.modes;
  if (names.empty()) names = {"per-tensor", "fused", "all-at-end"};
  std::vector<Mode> modes;
  for (const std::string& n : names) {
    if (n == "per-tensor" || n == "all-at-end") {
      modes.push_back({n, 0});
    } else if (n == "fused") {
      for (uint64_t t : cfg.thresholds) modes.push_back({"fused:" + bytesName(t), t});
    } else if (n.rfind("fused:", 0) == 0) {
      const uint64_t t = parseBytes(n.substr(6));
      modes.push_back({"fused:" + bytesName(t), t});
    } else {
      throw std::invalid_argument("unknown mode '" + n + "'");
    }
  }
  return modes;
}

void report(const Config& cfg, const Model& model, int size, const std::vector<Result>& results) {
  double perTensorComm = 0, allAtEndComm = -1;
  for (const Result& r : results) {
    if (r.mode.name == "per-tensor") perTensorComm = r.commMed;
    if (r.mode.name == "all-at-end") allAtEndComm = r.commMed;
  }
  const double bound = allAtEndComm < 0 ? -1 : std::max(cfg.computeMs, allAtEndComm);
  auto ratio = [](double num, double den) {
    char buf[32];
    if (num <= 0 || den <= 0) return std::string("-");
    std::snprintf(buf, sizeof buf, "%.2f", num / den);
    return std::string(buf);
  };
  if (cfg.csv) {
    std::printf(
        "mode,threshold_bytes,ops_per_step,step_med_ms,step_min_ms,comm_med_ms,comm_min_ms,"
        "pt_over_comm,step_over_bound\n");
  } else {
    std::printf(
        "# fusion_bench: %s (scale %g), %zu tensors, %zu params (%.1f MB float32), %d ranks\n",
        cfg.model.c_str(), cfg.scale, model.names.size(), model.total, model.total * 4 / 1e6, size);
    std::printf("# compute %.1f ms/step, %d steps (+%d warmup), cycle %s, layout %s; times in ms\n",
                cfg.computeMs, cfg.steps, cfg.warmup,
                cfg.cycleMs < 0 ? "default" : (std::to_string(cfg.cycleMs) + " ms").c_str(),
                cfg.layout.c_str());
    std::printf("%-14s %8s %9s %9s %9s %9s %8s %10s\n", "mode", "ops/step", "step_med", "step_min",
                "comm_med", "comm_min", "pt/comm", "step/bound");
  }
  for (const Result& r : results) {
    const std::string pt = ratio(perTensorComm, r.commMed);
    const std::string sb = ratio(r.stepMed, bound);
    if (cfg.csv) {
      std::printf("%s,%llu,%.1f,%.3f,%.3f,%.3f,%.3f,%s,%s\n", r.mode.name.c_str(),
                  static_cast<unsigned long long>(r.mode.threshold), r.opsPerStep, r.stepMed,
                  r.stepMin, r.commMed, r.commMin, pt.c_str(), sb.c_str());
    } else {
      std::printf("%-14s %8.1f %9.2f %9.2f %9.2f %9.2f %8s %10s\n", r.mode.name.c_str(),
                  r.opsPerStep, r.stepMed, r.stepMin, r.commMed, r.commMin, pt.c_str(), sb.c_str());
    }
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  std::vector<Mode> modes;
  try {
    if (int rc = parseArgs(argc, argv, &cfg); rc >= 0) return rc;
    modes = buildModes(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    Model model = readModel(cfg.model, cfg.scale);
    auto comm = gflow::init();
    Bench bench(cfg, model, comm);
    std::vector<Result> results;
    for (const Mode& mode : modes) results.push_back(bench.run(mode));
    const int64_t wrong = bench.wrongTotal();
    if (comm->rank() == 0) {
      report(cfg, model, comm->size(), results);
      if (wrong > 0) std::printf("# FAILED: %lld wrong values\n", static_cast<long long>(wrong));
    }
    comm->barrier();
    comm.reset();
    gflow::finalize();
    return wrong > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_bench: %s\n", e.what());
  }
  return 1;
}
