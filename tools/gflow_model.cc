// gflow_model: the cost model of the flat network allreduce
// (src/backend/cost_model.h), made and read.
//
//   gflowrun -n 8 -- gflow_model calibrate FILE [-b 4K] [-e 16M] [-f 4] [-n 20]
//       times ring, recursive doubling and halving-doubling on this job's
//       ranks at each size (the slowest rank's time, median over the
//       iterations), fits alpha, beta and gamma, and writes the model to
//       FILE (rank 0), with each sample's fitted and measured time.
//   gflowrun -n 8 -- gflow_model calibrate-local FILE [-b 4K] [-e 16M] ...
//       on one host: times the shared-memory allreduce of this job's ranks
//       and adds local_alpha and local_beta to the model in FILE (which
//       calibrate or fit made), so that it can weigh the hierarchical
//       composition against the flat algorithms across hosts.
//   gflow_model fit FILE CSV...
//       fits the model to allreduce_bw --csv reports (rank 0's lines:
//       algorithm, world size, bytes, in-place time; ring, rd and hd rows
//       only) and writes it to FILE, with each sample's error.
//   gflow_model check FILE CSV...
//       each report row's measured time against the model's prediction, and
//       the median and largest error.
//   gflow_model predict FILE [--ranks 2,8,64,512] [--per-host L] [-b 4K]
//                            [-e 64M] [-f 4]
//       prints the predicted time of each algorithm and the one a
//       communicator with GFLOW_MODEL=FILE takes, per world size and size.
//       With --per-host L (L > 1), the world sizes are L ranks on each of
//       N / L hosts: the flat algorithms share each host's NIC, the
//       hierarchical composition is a column too (GFLOW_HIER_SEGMENT's
//       segments), and "hier" may be chosen. A world size other than the
//       one the model was fitted on is labelled "model" (extrapolated);
//       the fitted one "fit".
//
// Exit status: 0; 2 for bad usage; 1 with the error otherwise.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cost_model.h"
#include "backend/route.h"
#include "common/params.h"
#include "common/socket.h"
#include "gflow/gflow.h"

namespace {

using gflow::backend::Algorithm;
using gflow::backend::CostModel;

struct Args {
  std::string command, file;
  std::vector<std::string> reports;  // fit, check: allreduce_bw --csv outputs
  uint64_t minBytes = 4 << 10, maxBytes = 16 << 20, factor = 4;
  int iters = 20;
  std::vector<int> ranks = {2, 8, 64, 512};
  int perHost = 1;
};

int usage() {
  std::fprintf(stderr,
               "usage: gflow_model calibrate FILE [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]\n"
               "       gflow_model calibrate-local FILE [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]\n"
               "       gflow_model fit FILE CSV...\n"
               "       gflow_model check FILE CSV...\n"
               "       gflow_model predict FILE [--ranks N,N,...] [--per-host L] [-b MIN] [-e MAX] "
               "[-f FACTOR]\n");
  return 2;
}

// The ring, rd and hd rows of allreduce_bw --csv reports ("[r] " prefixes
// allowed): library,algorithm,world_size,size,count,type,redop,
// oop_time_us,...,ip_time_us (12th field), ...
std::vector<CostModel::Sample> readReports(const std::vector<std::string>& files) {
  std::vector<CostModel::Sample> out;
  for (const std::string& f : files) {
    std::ifstream in(f);
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find("gflow,");
      if (at == std::string::npos) continue;
      std::vector<std::string> c;
      std::istringstream is(line.substr(at));
      for (std::string v; std::getline(is, v, ',');) c.push_back(v);
      if (c.size() < 12) continue;
      Algorithm algo;
      if (c[1] == "ring") {
        algo = Algorithm::kRing;
      } else if (c[1] == "rd") {
        algo = Algorithm::kRecursiveDoubling;
      } else if (c[1] == "hd") {
        algo = Algorithm::kHalvingDoubling;
      } else {
        continue;
      }
      out.push_back({algo, std::stoull(c[3]), std::stoi(c[2]), std::stod(c[11]) * 1e-6});
    }
  }
  return out;
}

// Each sample's measured and predicted time; returns the errors (%).
std::vector<double> printErrors(const CostModel& m, const std::vector<CostModel::Sample>& s) {
  std::printf("# algorithm bytes ranks measured_us predicted_us error_pct\n");
  std::vector<double> errors;
  for (const CostModel::Sample& x : s) {
    const double p = m.predict(x.algo, x.bytes, x.ranks);
    errors.push_back((p / x.seconds - 1) * 100);
    std::printf("%s %llu %d %.1f %.1f %+.1f\n", gflow::backend::toString(x.algo),
                static_cast<unsigned long long>(x.bytes), x.ranks, x.seconds * 1e6, p * 1e6,
                errors.back());
  }
  return errors;
}

int fitReports(const Args& a) {
  const std::vector<CostModel::Sample> s = readReports(a.reports);
  const CostModel m = CostModel::fit(s);
  std::ofstream out(a.file);
  out << m.text() << "\n";
  if (!out) {
    std::fprintf(stderr, "gflow_model: cannot write %s\n", a.file.c_str());
    return 1;
  }
  std::printf("# %s (%zu samples)\n", m.text().c_str(), s.size());
  printErrors(m, s);
  return 0;
}

// The median and largest |error|, over all rows and over those of at least
// 1 MiB.
int check(const Args& a) {
  const CostModel m = CostModel::load(a.file);
  const std::vector<CostModel::Sample> s = readReports(a.reports);
  const std::vector<double> e = printErrors(m, s);
  auto summary = [](std::vector<double> v, const char* what) {
    if (v.empty()) return;
    for (double& x : v) x = std::fabs(x);
    std::sort(v.begin(), v.end());
    std::printf("# %s: %zu rows, median |error| %.1f%%, max %.1f%%\n", what, v.size(),
                v[v.size() / 2], v.back());
  };
  std::vector<double> large;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].bytes >= (1u << 20)) large.push_back(e[i]);
  }
  summary(e, "all sizes");
  summary(large, ">= 1 MiB");
  return 0;
}

bool parse(int argc, char** argv, Args* a) {
  if (argc < 3) return false;
  a->command = argv[1];
  a->file = argv[2];
  if (a->command == "fit" || a->command == "check") {
    for (int i = 3; i < argc; ++i) a->reports.push_back(argv[i]);
    return !a->reports.empty();
  }
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], v = argv[i + 1];
    uint64_t bytes = 0;
    if ((flag == "-b" || flag == "-e") && gflow::params::parseBytes(v, &bytes) && bytes > 0) {
      (flag == "-b" ? a->minBytes : a->maxBytes) = bytes;
    } else if (flag == "-f" && std::atoi(v.c_str()) >= 2) {
      a->factor = static_cast<uint64_t>(std::atoi(v.c_str()));
    } else if (flag == "-n" && std::atoi(v.c_str()) >= 1) {
      a->iters = std::atoi(v.c_str());
    } else if (flag == "--per-host" && std::atoi(v.c_str()) >= 1) {
      a->perHost = std::atoi(v.c_str());
    } else if (flag == "--ranks") {
      a->ranks.clear();
      std::istringstream is(v);
      for (std::string n; std::getline(is, n, ',');) {
        if (std::atoi(n.c_str()) < 1) return false;
        a->ranks.push_back(std::atoi(n.c_str()));
      }
    } else {
      return false;
    }
  }
  return (argc - 3) % 2 == 0 && a->minBytes <= a->maxBytes &&
         (a->command == "calibrate" || a->command == "calibrate-local" || a->command == "predict");
}

std::vector<uint64_t> sizes(const Args& a) {
  std::vector<uint64_t> out;
  for (uint64_t b = a.minBytes; b <= a.maxBytes; b *= a.factor) out.push_back(b);
  return out;
}

// The slowest rank's seconds per allreduce of `bytes` by `algo`: the
// median over `iters` timed ones, after two untimed.
double timeOne(gflow::Communicator& comm, uint64_t bytes, int iters) {
  std::vector<float> buf(std::max<uint64_t>(bytes / 4, 1), 1.0f);
  std::vector<double> t;
  for (int i = -2; i < iters; ++i) {
    comm.barrier();
    const auto begin = std::chrono::steady_clock::now();
    comm.allreduce(gflow::tensor(buf.data(), buf.size()));
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (i >= 0) t.push_back(s);
  }
  std::sort(t.begin(), t.end());
  double median = t[t.size() / 2];
  comm.allreduce(gflow::tensor(&median, 1), gflow::ReduceOp::kMax);
  return median;
}

// The job's store at GFLOW_ROOT (rank 0 serves it), for the three
// communicators calibrate creates: a communicator bootstrapped from the
// environment would start a server of its own on that port, one at a time.
std::shared_ptr<gflow::Store> jobStore() {
  const char* root = std::getenv("GFLOW_ROOT");
  const char* rank = std::getenv("GFLOW_RANK");
  if (!root || !rank) {
    throw gflow::Error(gflow::ErrorCode::kInvalidArgument,
                       "calibrate runs under gflowrun (GFLOW_ROOT and GFLOW_RANK unset)");
  }
  const auto hp = gflow::net::parseHostPort(root, "GFLOW_ROOT");
  gflow::TcpStoreOptions o;
  o.isServer = std::atoi(rank) == 0;
  o.host = o.isServer ? "0.0.0.0" : hp.first;
  o.port = hp.second;
  const char* token = std::getenv("GFLOW_JOB_TOKEN");
  o.token = token ? token : "";
  return std::make_shared<gflow::TcpStore>(o);
}

int calibrate(const Args& a) {
  // One communicator per algorithm on the one store, all alive until the end.
  const std::shared_ptr<gflow::Store> store = jobStore();
  std::vector<std::shared_ptr<gflow::Communicator>> comms;
  for (Algorithm algo : CostModel::algorithms()) {
    gflow::Options o;
    o.algorithm = gflow::backend::toString(algo);
    o.store = store;
    comms.push_back(gflow::Communicator::create(o));
  }
  const int rank = comms[0]->rank(), size = comms[0]->size();
  std::vector<CostModel::Sample> samples;
  for (size_t i = 0; i < comms.size(); ++i) {
    const Algorithm algo = CostModel::algorithms()[i];
    for (uint64_t b : sizes(a)) samples.push_back({algo, b, size, timeOne(*comms[i], b, a.iters)});
  }
  if (rank != 0) return 0;
  const CostModel m = CostModel::fit(samples);
  std::ofstream out(a.file);
  out << m.text() << " fitted_on=" << size << "\n";
  if (!out) {
    std::fprintf(stderr, "gflow_model: cannot write %s\n", a.file.c_str());
    return 1;
  }
  std::printf("# %s fitted_on=%d\n# algorithm bytes ranks measured_us fitted_us error_pct\n",
              m.text().c_str(), size);
  for (const CostModel::Sample& s : samples) {
    const double f = m.predict(s.algo, s.bytes, s.ranks);
    std::printf("%s %llu %d %.1f %.1f %+.1f\n", gflow::backend::toString(s.algo),
                static_cast<unsigned long long>(s.bytes), s.ranks, s.seconds * 1e6, f * 1e6,
                (f / s.seconds - 1) * 100);
  }
  return 0;
}

// On one host: the shared-memory allreduce's samples, fitted into the
// model in a.file as its local parameters.
int calibrateLocal(const Args& a) {
  const CostModel base = CostModel::load(a.file);
  gflow::Options o;
  o.algorithm = "shm";
  o.store = jobStore();
  const std::shared_ptr<gflow::Communicator> comm = gflow::Communicator::create(o);
  if (comm->size() < 2) {
    throw gflow::Error(gflow::ErrorCode::kInvalidArgument,
                       "calibrate-local needs 2+ ranks on one host");
  }
  std::vector<CostModel::Sample> samples;
  for (uint64_t b : sizes(a)) {
    samples.push_back({Algorithm::kAuto, b, comm->size(), timeOne(*comm, b, a.iters)});
  }
  if (comm->stats().sharedMemoryOps == 0) {
    throw gflow::Error(gflow::ErrorCode::kInvalidArgument,
                       "calibrate-local's ranks did not run on shared memory (one host, "
                       "GFLOW_SHM=1)");
  }
  if (comm->rank() != 0) return 0;
  const CostModel m = base.withLocal(samples);
  std::ofstream out(a.file);
  out << m.text() << "\n";
  if (!out) {
    std::fprintf(stderr, "gflow_model: cannot write %s\n", a.file.c_str());
    return 1;
  }
  std::printf("# %s\n# bytes ranks measured_us fitted_us error_pct\n", m.text().c_str());
  for (const CostModel::Sample& s : samples) {
    const double f = m.predictLocal(s.bytes, s.ranks);
    std::printf("%llu %d %.1f %.1f %+.1f\n", static_cast<unsigned long long>(s.bytes), s.ranks,
                s.seconds * 1e6, f * 1e6, (f / s.seconds - 1) * 100);
  }
  return 0;
}

int predict(const Args& a) {
  std::ifstream in(a.file);
  std::stringstream ss;
  ss << in.rdbuf();
  const CostModel m = CostModel::load(a.file);
  const size_t at = ss.str().find("fitted_on=");
  const int fittedOn = at == std::string::npos ? 0 : std::atoi(ss.str().c_str() + at + 10);
  const uint64_t segment = gflow::params::hierSegment();
  std::printf("# %s\n# ranks per_host bytes rd_us hd_us ring_us hier_us chosen basis\n",
              m.text().c_str());
  for (int n : a.ranks) {
    const CostModel::Layout l{std::max(n / a.perHost, 1), std::min(a.perHost, n)};
    for (uint64_t b : sizes(a)) {
      std::printf("%d %d %llu", l.ranks(), l.perHost, static_cast<unsigned long long>(b));
      for (Algorithm algo : CostModel::algorithms())
        std::printf(" %.1f", m.predict(algo, b, l) * 1e6);
      const double hier = m.predictHierarchical(b, l, segment);
      if (std::isfinite(hier)) {
        std::printf(" %.1f", hier * 1e6);
      } else {
        std::printf(" -");
      }
      const CostModel::Choice c = m.fastest(b, l, segment);
      std::printf(" %s %s\n", c.hierarchical ? "hier" : gflow::backend::toString(c.algo),
                  n == fittedOn && l.perHost == 1 ? "fit" : "model");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, &a)) return usage();
  try {
    if (a.command == "calibrate") return calibrate(a);
    if (a.command == "calibrate-local") return calibrateLocal(a);
    if (a.command == "fit") return fitReports(a);
    if (a.command == "check") return check(a);
    return predict(a);
  } catch (const gflow::Error& e) {
    std::fprintf(stderr, "gflow_model: %s\n", e.what());
    return 1;
  }
}
