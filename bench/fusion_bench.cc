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
//                    that holds every gradient (no overlap);
//   fp16, bf16       GradientReducer at the library's default threshold with
//                    float16 / bfloat16 on the wire (mixed precision);
//   csc:<d>          GradientReducer at the default threshold with
//                    coarse-grained sparse communication at density d (top d
//                    of the chunks by norm travel, the rest accumulate);
//                    --csc-chunk sets the chunk; csc16:<d> also sends the
//                    picked chunks in float16. Bare csc / csc16 expand over
//                    --densities, as bare fused does over --thresholds.
// Step time is backward start to every gradient reduced (max over ranks, per
// step). Comm time is the step time of the same mode with compute 0. MB/step
// is the bytes this rank sent per measured step of the compute-0 pass (1e6
// bytes, max over ranks): the reducer's own communicator's Stats for the
// reducer modes, the world communicator's within each step's timed region
// (barriers and the timing allreduce are outside it) for the others. Exact
// over TCP (GFLOW_SHM=0); shared memory counts a rank's bytes as its peers
// read them, which may be after its op returned, so a step's window can miss
// a few percent. Derived:
//   pt/comm     per-tensor comm / this mode's comm (what fusion saves);
//   step/bound  step / max(compute, all-at-end comm), where 1.0 is a perfectly
//               overlapped step;
//   bytes/dense, comm/dense
//               MB/step and comm of this mode over those of the dense
//               reference: fused at the default threshold if it ran, else
//               all-at-end.
// Every step checks the result: rank r writes k + 2r (k = 0..63 per element),
// so the average k + size - 1 is exact in float32 (and in float16 up to 8
// ranks, so fp16 is checked exactly too); wrong values are printed and make
// the exit status 1. bf16 and the CSC modes are lossy: their values are only
// checked to be finite. Uses only gflow's public API.
#include <algorithm>
#include <chrono>
#include <cmath>
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
  std::vector<double> densities = {0.01, 0.1, 0.25};
  size_t cscChunk = 0;  // 0: GFLOW_CSC_CHUNK
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
    "  --modes LIST        per-tensor, fused, fused:<T>, all-at-end, fp16, bf16,\n"
    "                      csc, csc:<D>, csc16, csc16:<D>\n"
    "                      (default per-tensor,fused,all-at-end)\n"
    "  --densities LIST    CSC densities in (0, 1] for bare csc / csc16 (default 0.01,0.1,0.25)\n"
    "  --csc-chunk N       CSC elements per chunk (default 0: GFLOW_CSC_CHUNK)\n"
    "  --cycle-ms N        ReducerOptions::cycleTime for the reducer modes (default: library's)\n"
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

// A CSC density: the whole string a number in (0, 1].
double parseDensity(const std::string& s) {
  size_t end = 0;
  double d = 0;
  try {
    d = std::stod(s, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end == 0 || end != s.size() || !(d > 0 && d <= 1)) {
    throw std::invalid_argument("bad density '" + s + "' (want a number in (0, 1])");
  }
  return d;
}

std::string densityName(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", d);
  return buf;
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
    } else if (flag == "--densities") {
      cfg->densities.clear();
      for (const auto& d : splitList(take())) cfg->densities.push_back(parseDensity(d));
    } else if (flag == "--csc-chunk") {
      const long long c = std::stoll(take());
      if (c < 0) throw std::invalid_argument("--csc-chunk must be >= 0");
      cfg->cscChunk = static_cast<size_t>(c);
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

enum class Kind { kPerTensor, kReducer, kAllAtEnd };

struct Mode {
  std::string name;
  Kind kind = Kind::kReducer;
  uint64_t threshold = 0;  // reducer modes; 0: the library's default
  gflow::DataType wire = gflow::DataType::kFloat32;
  double density = 0;  // CSC; 0: dense
  bool exact = true;   // values checked exactly, else for finiteness only
};

struct Result {
  Mode mode;
  uint64_t threshold = 0;  // reducer modes: the threshold in effect
  double opsPerStep = 0;
  double stepMed = 0, stepMin = 0, commMed = 0, commMin = 0;
  double mbPerStep = 0;  // bytes sent per step / 1e6, max over ranks
};

// One pass's measured steps: times (ms) and bytes sent per step (both max
// over ranks).
struct Pass {
  std::vector<double> times;
  double bytesPerStep = 0;
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
    if (mode.kind == Kind::kReducer) {
      gflow::ReducerOptions options;
      options.op = ReduceOp::kAvg;
      options.fusionThreshold = mode.threshold;
      options.cycleTime = std::chrono::milliseconds(cfg_.cycleMs);
      options.names = model_.names;
      options.wire = mode.wire;
      // Explicit, so GFLOW_CSC_DENSITY in the environment leaves the dense
      // modes dense.
      options.sparse.density = mode.density;
      options.sparse.chunk = cfg_.cscChunk;
      reducer = std::make_unique<gflow::GradientReducer>(comm_, grads_, options);
      r.threshold = reducer->fusionThreshold();
    }
    const Pass step = pass(mode, reducer.get(), cfg_.computeMs);
    const Pass comm = cfg_.computeMs > 0 ? pass(mode, reducer.get(), 0.0) : step;
    if (reducer) {
      const gflow::ReducerStats s = reducer->stats();
      r.opsPerStep = s.steps ? static_cast<double>(s.fusedOps) / static_cast<double>(s.steps) : 0;
    } else {
      r.opsPerStep = mode.kind == Kind::kPerTensor ? static_cast<double>(grads_.size()) : 1.0;
    }
    summarize(step.times, &r.stepMed, &r.stepMin);
    summarize(comm.times, &r.commMed, &r.commMin);
    r.mbPerStep = comm.bytesPerStep / 1e6;
    if (!mode.exact) {
      const int passes = cfg_.computeMs > 0 ? 2 : 1;
      finiteOnlySteps_ += passes * (cfg_.warmup + cfg_.steps);
    }
    reducer.reset();
    comm_->barrier();
    return r;
  }

  // The fusion threshold a reducer gets from fusionThreshold 0
  // (GFLOW_FUSION_THRESHOLD). Collective.
  uint64_t defaultThreshold() {
    float x = 0;
    gflow::ReducerOptions options;
    options.cycleTime = std::chrono::milliseconds(0);
    options.sparse.density = 0;
    gflow::GradientReducer probe(comm_, {gflow::tensor(&x, 1)}, options);
    return probe.fusionThreshold();
  }

  // Steps (of this rank, all passes) whose values were checked for
  // finiteness only.
  int64_t finiteOnlySteps() const { return finiteOnlySteps_; }

  int64_t wrongTotal() {
    int64_t w = wrong_;
    comm_->allreduce(gflow::Tensor(&w, 1, gflow::DataType::kInt64), ReduceOp::kSum);
    return w;
  }

 private:
  // Bytes this rank has sent on the communicator `mode` runs its ops on.
  uint64_t bytesSent(const gflow::GradientReducer* reducer) const {
    return reducer ? reducer->communicator().stats().bytesSent() : comm_->stats().bytesSent();
  }

  // warmup + steps steps; returns the measured step times (ms) and bytes sent
  // per measured step, both max over ranks.
  Pass pass(const Mode& mode, gflow::GradientReducer* reducer, double computeMs) {
    // Tensor i is ready at start + deadline[i].
    std::vector<Clock::duration> deadline;
    size_t done = 0;
    for (size_t c : model_.counts) {
      done += c;
      const double ms = computeMs * static_cast<double>(done) / static_cast<double>(model_.total);
      deadline.push_back(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(ms)));
    }
    Pass out;
    uint64_t sent = 0;  // measured steps
    std::vector<gflow::Work> works;
    works.reserve(grads_.size());
    for (int s = 0; s < cfg_.warmup + cfg_.steps; ++s) {
      fill(mode, s);
      comm_->barrier();
      // The window holds this step's ops only: the barrier above is done,
      // the timing allreduce below comes after.
      const uint64_t sent0 = bytesSent(reducer);
      const Clock::time_point t0 = Clock::now();
      if (mode.kind == Kind::kAllAtEnd) {
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
      const uint64_t sent1 = bytesSent(reducer);
      check(mode, s);
      if (s >= cfg_.warmup) {
        out.times.push_back(ms);
        sent += sent1 - sent0;
      }
    }
    // The bytes ride along as one more element of the max.
    out.times.push_back(static_cast<double>(sent) / cfg_.steps);
    comm_->allreduce(gflow::Tensor(out.times.data(), out.times.size(), gflow::DataType::kFloat64),
                     ReduceOp::kMax);
    out.bytesPerStep = out.times.back();
    out.times.pop_back();
    return out;
  }

  static float base(size_t i, int step, size_t j) {
    return static_cast<float>((j + i * 31 + static_cast<size_t>(step) * 7) & 63);
  }

  // Where gradient i lives for `mode`: all-at-end always reduces the flat
  // buffer; the other modes use the gradients of --layout.
  float* data(const Mode& mode, size_t i) {
    return mode.kind == Kind::kAllAtEnd ? buffer_.data() + offsets_[i]
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
        if (mode.exact ? p[j] == want : std::isfinite(p[j])) continue;
        if (++wrong_ <= 10) {
          std::fprintf(stderr, "fusion_bench: rank %d %s step %d: %s[%zu] = %g, expected %s%g\n",
                       comm_->rank(), mode.name.c_str(), step, model_.names[i].c_str(), j,
                       static_cast<double>(p[j]), mode.exact ? "" : "a finite value, exact ",
                       static_cast<double>(want));
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
  int64_t finiteOnlySteps_ = 0;
};

std::vector<Mode> buildModes(const Config& cfg) {
  std::vector<std::string> names = cfg.modes;
  if (names.empty()) names = {"per-tensor", "fused", "all-at-end"};
  std::vector<Mode> modes;
  auto fused = [](uint64_t t) {
    Mode m;
    m.name = "fused:" + bytesName(t);
    m.threshold = t;
    return m;
  };
  auto csc = [](const std::string& prefix, double d) {
    Mode m;
    m.name = prefix + ":" + densityName(d);
    m.wire = prefix == "csc16" ? gflow::DataType::kFloat16 : gflow::DataType::kFloat32;
    m.density = d;
    m.exact = false;
    return m;
  };
  for (const std::string& n : names) {
    if (n == "per-tensor" || n == "all-at-end") {
      Mode m;
      m.name = n;
      m.kind = n == "per-tensor" ? Kind::kPerTensor : Kind::kAllAtEnd;
      modes.push_back(m);
    } else if (n == "fused") {
      for (uint64_t t : cfg.thresholds) modes.push_back(fused(t));
    } else if (n.rfind("fused:", 0) == 0) {
      modes.push_back(fused(parseBytes(n.substr(6))));
    } else if (n == "fp16" || n == "bf16") {
      Mode m;
      m.name = n;
      m.wire = n == "fp16" ? gflow::DataType::kFloat16 : gflow::DataType::kBFloat16;
      // k + 2r and its average are small integers: exact in float16 (up to
      // 8 ranks), not in bfloat16.
      m.exact = n == "fp16";
      modes.push_back(m);
    } else if (n == "csc" || n == "csc16") {
      for (double d : cfg.densities) modes.push_back(csc(n, d));
    } else if (n.rfind("csc:", 0) == 0) {
      modes.push_back(csc("csc", parseDensity(n.substr(4))));
    } else if (n.rfind("csc16:", 0) == 0) {
      modes.push_back(csc("csc16", parseDensity(n.substr(6))));
    } else {
      throw std::invalid_argument("unknown mode '" + n + "'");
    }
  }
  return modes;
}

void report(const Config& cfg, const Model& model, int size, uint64_t defaultThreshold,
            const std::vector<Result>& results) {
  double perTensorComm = 0, allAtEndComm = -1;
  const Result* fusedDefault = nullptr;
  const Result* allAtEnd = nullptr;
  const std::string fusedDefaultName = "fused:" + bytesName(defaultThreshold);
  bool anyCsc = false;
  for (const Result& r : results) {
    if (r.mode.kind == Kind::kPerTensor) perTensorComm = r.commMed;
    if (r.mode.kind == Kind::kAllAtEnd) allAtEndComm = r.commMed, allAtEnd = &r;
    if (r.mode.name == fusedDefaultName && !fusedDefault) fusedDefault = &r;
    if (r.mode.density > 0) anyCsc = true;
  }
  // The dense reference of bytes/dense and comm/dense.
  const Result* dense = fusedDefault ? fusedDefault : allAtEnd;
  const double bound = allAtEndComm < 0 ? -1 : std::max(cfg.computeMs, allAtEndComm);
  auto ratio = [](double num, double den, const char* format = "%.2f") {
    char buf[32];
    if (num <= 0 || den <= 0) return std::string("-");
    std::snprintf(buf, sizeof buf, format, num / den);
    return std::string(buf);
  };
  if (cfg.csv) {
    std::printf(
        "mode,threshold_bytes,ops_per_step,step_med_ms,step_min_ms,comm_med_ms,comm_min_ms,"
        "pt_over_comm,step_over_bound,mb_per_step,bytes_over_dense,comm_over_dense\n");
  } else {
    std::printf(
        "# fusion_bench: %s (scale %g), %zu tensors, %zu params (%.1f MB float32), %d ranks\n",
        cfg.model.c_str(), cfg.scale, model.names.size(), model.total, model.total * 4 / 1e6, size);
    std::printf("# compute %.1f ms/step, %d steps (+%d warmup), cycle %s, layout %s; times in ms\n",
                cfg.computeMs, cfg.steps, cfg.warmup,
                cfg.cycleMs < 0 ? "default" : (std::to_string(cfg.cycleMs) + " ms").c_str(),
                cfg.layout.c_str());
    std::string chunk;
    if (anyCsc) {
      chunk = ", csc chunk " + (cfg.cscChunk ? std::to_string(cfg.cscChunk) : "default");
    }
    std::printf("# default threshold %s; dense reference %s%s\n",
                bytesName(defaultThreshold).c_str(), dense ? dense->mode.name.c_str() : "none",
                chunk.c_str());
    std::printf("%-14s %8s %9s %9s %9s %9s %8s %10s %9s %11s %10s\n", "mode", "ops/step",
                "step_med", "step_min", "comm_med", "comm_min", "pt/comm", "step/bound", "MB/step",
                "bytes/dense", "comm/dense");
  }
  for (const Result& r : results) {
    const std::string pt = ratio(perTensorComm, r.commMed);
    const std::string sb = ratio(r.stepMed, bound);
    const std::string bd = dense ? ratio(r.mbPerStep, dense->mbPerStep, "%.3f") : "-";
    const std::string cd = dense ? ratio(r.commMed, dense->commMed) : "-";
    const uint64_t threshold = r.mode.kind == Kind::kReducer ? r.threshold : r.mode.threshold;
    if (cfg.csv) {
      std::printf("%s,%llu,%.1f,%.3f,%.3f,%.3f,%.3f,%s,%s,%.6f,%s,%s\n", r.mode.name.c_str(),
                  static_cast<unsigned long long>(threshold), r.opsPerStep, r.stepMed, r.stepMin,
                  r.commMed, r.commMin, pt.c_str(), sb.c_str(), r.mbPerStep, bd.c_str(),
                  cd.c_str());
    } else {
      std::printf("%-14s %8.1f %9.2f %9.2f %9.2f %9.2f %8s %10s %9.3f %11s %10s\n",
                  r.mode.name.c_str(), r.opsPerStep, r.stepMed, r.stepMin, r.commMed, r.commMin,
                  pt.c_str(), sb.c_str(), r.mbPerStep, bd.c_str(), cd.c_str());
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
    const uint64_t defaultThreshold = bench.defaultThreshold();
    std::vector<Result> results;
    for (const Mode& mode : modes) results.push_back(bench.run(mode));
    const int64_t wrong = bench.wrongTotal();
    if (comm->rank() == 0) {
      report(cfg, model, comm->size(), defaultThreshold, results);
      std::string lossy;
      for (const Result& r : results) {
        if (!r.mode.exact) lossy += (lossy.empty() ? "" : ", ") + r.mode.name;
      }
      if (!lossy.empty()) {
        std::printf("# lossy modes: %s: %lld steps' values checked for finiteness only\n",
                    lossy.c_str(), static_cast<long long>(bench.finiteOnlySteps()));
      }
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
