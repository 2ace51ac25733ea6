// Identity resolution. Sources, highest precedence first:
//   1. explicit Options fields (always win, never reported as contradictions);
//   2. GFLOW_* (gflowrun) and torchrun's RANK/WORLD_SIZE/...: the launchers that
//      start the ranks themselves. Where both set a field they must agree;
//   3. the PMIx server of the launcher that started this process (mpirun,
//      srun --mpi=pmix, PRRTE), asked only when tier 2 sets nothing;
//   4. Open MPI (OMPI_COMM_WORLD_*), then 5. Slurm (SLURM_*), the same
//      launchers' variables, for when no PMIx client can be had.
// Open MPI and Slurm are usually *outer* launchers: `srun torchrun ...` leaves
// SLURM_PROCID (the node's task id) next to torchrun's RANK, and a batch
// script's SLURM_NTASKS is still set when gflowrun runs inside it. So a lower
// tier is consulted only when no higher tier sets any identity variable, and
// disagreeing with a higher tier is not an error.
#include "bootstrap/environment.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "bootstrap/pmix.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/socket.h"

namespace gflow::bootstrap {
namespace {

const ErrorContext kCtx = ErrorContext::forOp("bootstrap");

// One identity field and the variable it came from ("" when unset).
struct Field {
  int value = -1;
  std::string var;
  std::string source;
  bool set() const { return !var.empty(); }
};

struct Tier {
  std::string name;
  Field rank, size, localRank, localSize;
  bool any() const { return rank.set() || size.set() || localRank.set() || localSize.set(); }
};

// What became of the PMIx server: `used` when it gave the identity; `why` it
// could not when it was asked and failed.
struct PmixOutcome {
  bool used = false;
  std::string host;
  std::string why;
};

// Launcher variables are not gflow parameters, so they are read directly
// rather than through params:: (which only knows GFLOW_*).
Field launcherInt(const char* var, const char* source) {
  Field f;
  const char* raw = std::getenv(var);
  if (raw == nullptr || *raw == '\0') return f;
  std::string v(raw);
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0' || x < 0 || x > INT_MAX) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << var << "='" << v << "' is not valid: expected a non-negative integer (set by " << source
        << ")";
  }
  f.value = static_cast<int>(x);
  f.var = var;
  f.source = source;
  return f;
}

Field gflowInt(const params::Param& param) {
  Field f;
  if (!params::isSet(param)) return f;
  int64_t x = params::getInt(param);  // throws naming the variable when malformed
  if (x < 0 || x > INT_MAX) {
    GFLOW_THROW(kInvalidArgument, kCtx) << params::shownAssignment(param, params::raw(param))
                                        << " is not valid: expected a non-negative integer";
  }
  f.value = static_cast<int>(x);
  f.var = param.name;
  f.source = "GFLOW_*";
  return f;
}

std::string describe(const Field& f) {
  return f.var + "=" + std::to_string(f.value);
}

// Folds `b` into `a` within one tier; both set and different is an error.
void agree(Field* a, const Field& b) {
  if (!b.set()) return;
  if (!a->set()) {
    *a = b;
    return;
  }
  if (a->value != b.value) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "contradictory launcher settings: " << describe(*a) << " but " << describe(b)
        << "; unset one of them or make them agree";
  }
}

Tier gflowTier() {
  Tier t;
  t.name = "GFLOW_*";
  t.rank = gflowInt(params::spec::rank);
  t.size = gflowInt(params::spec::worldSize);
  t.localRank = gflowInt(params::spec::localRank);
  t.localSize = gflowInt(params::spec::localSize);
  return t;
}

// vars: rank, size, local rank, local size (nullptr: the launcher has none).
Tier launcherTier(const char* name, const std::array<const char*, 4>& vars) {
  Tier t;
  t.name = name;
  Field* fields[4] = {&t.rank, &t.size, &t.localRank, &t.localSize};
  for (int i = 0; i < 4; ++i) {
    if (vars[i] != nullptr) *fields[i] = launcherInt(vars[i], name);
  }
  return t;
}

// The PMIx server's answer. Asked only when the process was started by one;
// a failure is kept in `outcome->why` and leaves the tier empty, so the
// launcher's variables (Open MPI, Slurm) still serve.
Tier pmixTier(PmixOutcome* outcome) {
  Tier t;
  t.name = "PMIx";
  if (!pmix::launched()) return t;
  try {
    const pmix::Job j = pmix::job();
    auto field = [](int v, const char* var) {
      Field f;
      if (v < 0) return f;
      f.value = v;
      f.var = var;
      f.source = "PMIx";
      return f;
    };
    t.rank = field(j.rank, "PMIx rank");
    t.size = field(j.size, "PMIx job size");
    t.localRank = field(j.localRank, "PMIx local rank");
    t.localSize = field(j.localSize, "PMIx local size");
    outcome->host = j.host;
  } catch (const Error& e) {
    outcome->why = e.what();
    GFLOW_LOG(DEBUG) << "not using the PMIx server: " << e.what();
  }
  return t;
}

// An explicit Options value: -1 means unset, other negatives are mistakes.
Field optionField(int value, const char* name) {
  Field f;
  if (value == -1) return f;
  if (value < 0) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "Options::" << name << "=" << value << " is not valid: use -1 (from the environment) "
        << "or a non-negative value";
  }
  f.value = value;
  f.var = std::string("Options::") + name;
  f.source = "options";
  return f;
}

void resolveRoot(const Options& options, const PmixOutcome& pmix, Identity* id) {
  if (options.store) return;  // the caller brings the rendezvous
  if (!options.root.empty()) {
    auto hp = net::parseHostPort(options.root, "Options::root");
    id->rootHost = hp.first;
    id->rootPort = hp.second;
    return;
  }
  if (params::isSet(params::spec::root)) {
    auto hp = net::parseHostPort(params::root(), params::spec::root.name);
    id->rootHost = hp.first;
    id->rootPort = hp.second;
    return;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  bool haveAddr = addr != nullptr && *addr != '\0';
  bool havePort = port != nullptr && *port != '\0';
  if (haveAddr && havePort) {
    std::string host(addr);
    if (host.find(':') != std::string::npos && host[0] != '[') host = "[" + host + "]";
    auto hp = net::parseHostPort(host + ":" + port, "MASTER_ADDR:MASTER_PORT");
    // torch.distributed's own store already listens on MASTER_PORT on rank
    // 0; gflow's store takes the next port so both can run in one job.
    if (hp.second == 65535) {
      GFLOW_THROW(kInvalidArgument, kCtx)
          << "MASTER_PORT=65535 leaves no port for gflow's store (it uses MASTER_PORT+1); "
             "set GFLOW_ROOT=host:port";
    }
    id->rootHost = hp.first;
    id->rootPort = static_cast<uint16_t>(hp.second + 1);
    return;
  }
  if (haveAddr != havePort) {
    GFLOW_THROW(kInvalidArgument, kCtx) << (haveAddr ? "MASTER_ADDR is set but MASTER_PORT is not"
                                                     : "MASTER_PORT is set but MASTER_ADDR is not")
                                        << "; set both, or set GFLOW_ROOT=host:port";
  }
  if (pmix.used) return;  // shared through the PMIx server (rendezvous.h)
  GFLOW_THROW(kInvalidArgument, kCtx)
      << "cannot find rank 0's store: set GFLOW_ROOT=host:port (or MASTER_ADDR and "
         "MASTER_PORT), or pass Options::root or Options::store, or launch under a PMIx "
         "server (mpirun, srun --mpi=pmix)"
      << (pmix.why.empty() ? "" : "; the PMIx server could not be used: " + pmix.why);
}

constexpr Field Tier::*kFields[4] = {&Tier::rank, &Tier::size, &Tier::localRank, &Tier::localSize};

// The four identity fields after precedence: each Options field, else the
// first tier that sets any identity variable (GFLOW_* with torchrun, then
// PMIx, then Open MPI, then Slurm). The result's name is that tier's ("" when
// none); `pmix` says whether the PMIx server was that tier.
Tier resolveFields(const Options& options, PmixOutcome* pmix) {
  Tier direct = gflowTier();
  Tier torch = launcherTier("torchrun", {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
  Tier ompi =
      launcherTier("Open MPI", {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"});
  // Slurm has no plain per-node task count (SLURM_TASKS_PER_NODE is "2(x3),1").
  Tier slurm = launcherTier("Slurm", {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr});

  // GFLOW_* and torchrun form one tier; fields are checked against each other
  // only where Options does not settle them anyway.
  Field opt[4] = {optionField(options.rank, "rank"), optionField(options.size, "size"),
                  optionField(options.localRank, "localRank"),
                  optionField(options.localSize, "localSize")};
  if (direct.any() || torch.any()) {
    if (!direct.any()) direct.name = torch.name;
    for (int i = 0; i < 4; ++i) {
      if (!opt[i].set()) agree(&(direct.*kFields[i]), torch.*kFields[i]);
    }
  }
  Tier server;
  if (!direct.any() && !torch.any()) server = pmixTier(pmix);
  const Tier* primary = nullptr;
  for (const Tier* t : {&direct, &server, &ompi, &slurm}) {
    if (t->any()) {
      primary = t;
      break;
    }
  }
  // The rendezvous goes through PMIx only when its numbering is the job's:
  // rank 0 there is the rank that publishes.
  pmix->used = primary == &server && !opt[0].set() && !opt[1].set();
  for (const Tier* t : {&ompi, &slurm}) {
    if (primary != nullptr && t != primary && t->any()) {
      GFLOW_LOG(DEBUG) << "identity from " << primary->name << "; ignoring " << t->name
                       << " variables (lower precedence)";
    }
  }

  Tier got;
  if (primary) got.name = primary->name;
  for (int i = 0; i < 4; ++i) {
    got.*kFields[i] = opt[i].set() ? opt[i] : (primary ? primary->*kFields[i] : Field{});
  }
  return got;
}

// Raises unless `got` sets both the rank and the world size.
void requireRankAndSize(const Tier& got) {
  const Field& rank = got.rank;
  const Field& size = got.size;
  if (rank.set() && size.set()) return;
  std::string what = !rank.set() && !size.set() ? "rank and world size"
                     : !rank.set()              ? "rank"
                                                : "world size";
  std::string vars = !rank.set() && !size.set() ? "GFLOW_RANK and GFLOW_WORLD_SIZE"
                     : !rank.set()              ? "GFLOW_RANK"
                                                : "GFLOW_WORLD_SIZE";
  std::string opts = !rank.set() && !size.set() ? "Options::rank and Options::size"
                     : !rank.set()              ? "Options::rank"
                                                : "Options::size";
  GFLOW_THROW(kInvalidArgument, kCtx)
      << "cannot determine this process's " << what << ": set " << vars << " (or launch with "
      << "gflowrun, torchrun, mpirun or srun, which set their own variables), or pass " << opts
      << (!got.name.empty() ? "; the " + got.name + " variables that are set do not give it" : "");
}

// Raises unless the rank and the local rank and size fit the world size.
void checkRanges(const Tier& got) {
  const Field& rank = got.rank;
  const Field& size = got.size;
  const Field& localRank = got.localRank;
  const Field& localSize = got.localSize;
  if (size.value < 1) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "world size must be at least 1 (" << describe(size) << ")";
  }
  if (rank.value >= size.value) {
    GFLOW_THROW(kInvalidArgument, kCtx) << "rank " << rank.value << " is outside [0, " << size.value
                                        << ") (" << describe(rank) << ", " << describe(size) << ")";
  }
  if (localSize.set() && (localSize.value < 1 || localSize.value > size.value)) {
    GFLOW_THROW(kInvalidArgument, kCtx) << "local size must be in [1, world size " << size.value
                                        << "] (" << describe(localSize) << ")";
  }
  if (localRank.set() && localSize.set() && localRank.value >= localSize.value) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "local rank " << localRank.value << " is outside [0, " << localSize.value << ") ("
        << describe(localRank) << ", " << describe(localSize) << ")";
  }
  if (localRank.set() && localRank.value >= size.value) {
    GFLOW_THROW(kInvalidArgument, kCtx)
        << "local rank " << localRank.value << " is not below the world size " << size.value << " ("
        << describe(localRank) << ")";
  }
}

}  // namespace

Identity resolveIdentity(const Options& options) {
  PmixOutcome pmix;
  const Tier got = resolveFields(options, &pmix);
  requireRankAndSize(got);
  checkRanges(got);
  Identity id;
  id.rank = got.rank.value;
  id.size = got.size.value;
  id.localRank = got.localRank.value;
  id.localSize = got.localSize.value;
  id.source = got.rank.source;
  resolveRoot(options, pmix, &id);
  id.token = !options.token.empty() ? options.token : params::jobToken();
  id.pmix = pmix.used;
  if (pmix.used) id.launcherHost = pmix.host;
  GFLOW_LOG(DEBUG) << "identity: rank " << id.rank << " of " << id.size << " (local "
                   << id.localRank << " of " << id.localSize << ") from " << id.source;
  return id;
}

std::string hostId(const std::string& launcherHost) {
  std::string fixed = params::hostId();
  if (!fixed.empty()) return fixed;
  char name[256] = {0};
  if (!launcherHost.empty()) {
    std::snprintf(name, sizeof(name), "%s", launcherHost.c_str());
  } else if (::gethostname(name, sizeof(name) - 1) < 0) {
    std::snprintf(name, sizeof(name), "unknown");
  }
  // The boot id tells apart containers that share a hostname but not a kernel
  // (and so cannot share memory), and hosts cloned from one image.
  std::string bootId;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, bootId);
  while (!bootId.empty() && (bootId.back() == '\n' || bootId.back() == ' ')) bootId.pop_back();
  return bootId.empty() ? std::string(name) : std::string(name) + "/" + bootId;
}

}  // namespace gflow::bootstrap
