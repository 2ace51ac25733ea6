// gflowrun: starts N local ranks of a program and supervises them.
//
//   gflowrun -n 4 [options] [--] prog args...
//
// Each rank gets GFLOW_RANK, GFLOW_WORLD_SIZE, GFLOW_LOCAL_RANK,
// GFLOW_LOCAL_SIZE, GFLOW_ROOT (rank 0's store on loopback) and one job token
// shared by all ranks. Output is forwarded line by line with a "[rank] "
// prefix. The job is all-or-nothing: the first rank that fails takes the
// others down, and gflowrun exits with that rank's status. With --elastic
// the job keeps going when a rank fails: gflowrun serves the job's store
// itself (so it outlives any rank), the survivors shrink and go on
// (docs/elastic.md), and --max-restarts K starts up to K replacements, each
// with GFLOW_JOIN=1 instead of a rank, to join the job. --serve-store
// serves only such a store, for ranks another launcher starts.
//
// gflowrun's own work is one thread: one poll() loop over the ranks' output
// pipes and a signalfd that carries SIGCHLD and the signals to forward (the
// --elastic store runs on threads of its own).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/fd_limit.h"
#include "common/params.h"
#include "gflow/error.h"
#include "gflow/store.h"
#include "topology/data_interface.h"
#include "topology/pinning.h"
#include "topology/topology.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kUsageExit = 2;
constexpr int kTimeoutExit = 124;
constexpr int kExecFailedExit = 127;
// A line longer than this is forwarded in pieces, so a rank that prints
// without newlines (progress bars) cannot grow gflowrun's memory unboundedly.
constexpr size_t kMaxLine = 64 * 1024;
// After the last rank exits, how long to keep reading output that its
// leftover background children may still write before giving up on EOF.
constexpr std::chrono::milliseconds kDrainAfterExit{1000};
// --elastic: how long the other ranks may run on after one finished
// successfully (a stopped rank the survivors left behind never ends).
constexpr std::chrono::milliseconds kElasticLinger{30000};

// Variables the launcher owns per rank; --env may not set them.
const char* const kRankVars[] = {"GFLOW_RANK", "GFLOW_WORLD_SIZE", "GFLOW_LOCAL_RANK",
                                 "GFLOW_LOCAL_SIZE"};
// Identity variables of other launchers. Ranks would inherit the outer
// launcher's values (e.g. SLURM_PROCID=0 in every rank when gflowrun runs
// inside an allocation), which contradict GFLOW_RANK, so they are dropped.
const char* const kForeignIdentityVars[] = {"RANK",
                                            "WORLD_SIZE",
                                            "LOCAL_RANK",
                                            "LOCAL_WORLD_SIZE",
                                            "GROUP_RANK",
                                            "MASTER_ADDR",
                                            "MASTER_PORT",
                                            "OMPI_COMM_WORLD_RANK",
                                            "OMPI_COMM_WORLD_SIZE",
                                            "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "OMPI_COMM_WORLD_LOCAL_SIZE",
                                            "PMI_RANK",
                                            "PMI_SIZE",
                                            "PMIX_RANK",
                                            "SLURM_PROCID",
                                            "SLURM_NTASKS",
                                            "SLURM_NPROCS",
                                            "SLURM_LOCALID",
                                            "SLURM_STEP_NUM_TASKS"};

struct Config {
  int np = 0;
  std::vector<std::pair<std::string, std::string>> env;  // --env, in order
  int64_t timeoutMs = 0;                                 // 0: no job timeout
  int64_t graceMs = 5000;
  std::string token;  // --token-file's contents
  std::string root;   // --root host:port
  int port = -1;      // --port
  bool prefix = true;
  bool printConfig = false;
  bool topology = false;
  bool elastic = false;     // --elastic
  int maxRestarts = 0;      // --max-restarts
  bool serveStore = false;  // --serve-store
  std::vector<std::string> argv;
};

[[noreturn]] void usageError(const std::string& msg) {
  std::fprintf(stderr, "gflowrun: %s\nTry 'gflowrun --help'.\n", msg.c_str());
  std::exit(kUsageExit);
}

void printHelp() {
  std::printf(
      "Usage: gflowrun -n N [options] [--] program [args...]\n"
      "       gflowrun --serve-store [--root HOST:PORT | --port PORT] [--token-file FILE]\n"
      "       gflowrun --print-config\n"
      "       gflowrun --topology\n"
      "\n"
      "Starts N ranks of `program` on this host, each in its own process group, with\n"
      "GFLOW_RANK, GFLOW_WORLD_SIZE, GFLOW_LOCAL_RANK, GFLOW_LOCAL_SIZE, GFLOW_ROOT and\n"
      "GFLOW_JOB_TOKEN set. When a rank fails, the others get SIGTERM, then SIGKILL after\n"
      "the grace period; gflowrun exits with the first failing rank's status (its exit\n"
      "code, or 128+signal). SIGINT, SIGTERM and SIGHUP are forwarded to every rank.\n"
      "\n"
      "Options:\n"
      "  -n, --np N          number of ranks (required)\n"
      "  --env K=V           set K=V in every rank (repeatable; not GFLOW_JOB_TOKEN)\n"
      "  --token-file FILE   the job token: FILE's first line (FILE must be private)\n"
      "  --root HOST:PORT    address of rank 0's store (default 127.0.0.1:<free port>)\n"
      "  --port PORT         store port on 127.0.0.1 (default: a free port)\n"
      "  --timeout T         kill the job after T (300, 30s, 5m; bare number = seconds)\n"
      "                      and exit 124\n"
      "  --grace T           time between SIGTERM and SIGKILL (default 5s)\n"
      "  --elastic           a failed rank does not end the job: gflowrun serves the job's\n"
      "                      store (GFLOW_ROOT_EXTERNAL=1) and the survivors go on\n"
      "                      (Communicator::shrink); exit 0 when any rank exits 0;\n"
      "                      30s after the first rank exits 0, the others are terminated\n"
      "  --max-restarts K    with --elastic: start up to K replacements for failed ranks,\n"
      "                      each with GFLOW_JOIN=1 and no rank (Communicator::join)\n"
      "  --serve-store       serve only a job store (at --root, --port, or a free port on\n"
      "                      127.0.0.1; the job token from --token-file or GFLOW_JOB_TOKEN,\n"
      "                      required) until SIGINT or SIGTERM; prints HOST:PORT. For ranks\n"
      "                      that another launcher starts (mpirun --enable-recovery, srun)\n"
      "                      with GFLOW_ROOT=HOST:PORT GFLOW_ROOT_EXTERNAL=1, so the store\n"
      "                      outlives rank 0 (docs/elastic.md)\n"
      "  --no-prefix         do not prefix output lines with \"[rank] \"\n"
      "  --print-config      print every GFLOW_* parameter (default, current value, doc)\n"
      "  --topology          print this host's NUMA nodes, cores, GPUs and NICs (hwloc),\n"
      "                      which NIC is nearest each GPU, and where progress threads pin\n"
      "  -h, --help          this text\n"
      "\n"
      "The job token comes from --token-file, else an exported GFLOW_JOB_TOKEN; otherwise\n"
      "a fresh random token is generated for each job. It is never taken from the\n"
      "command line, where every user of the host can read it.\n");
}

// The job token from `path`: its first line, which must not be empty; the
// file must be private (no group or other access), as a token's secrecy is
// what keeps strangers out.
std::string readTokenFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) usageError("--token-file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0) {
    char buf[4096];
    ssize_t n = 0;
    while (text.size() < 65536 && (n = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, n);
  }
  ::close(fd);
  if (!S_ISREG(st.st_mode)) usageError("--token-file '" + path + "': not a regular file");
  if ((st.st_mode & 077) != 0) {
    usageError("--token-file '" + path + "': the file is readable or writable by others " +
               "(chmod 600 it)");
  }
  text = text.substr(0, text.find('\n'));
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) usageError("--token-file '" + path + "': the first line is empty");
  return text;
}

int64_t parseDurationArg(const std::string& flag, const std::string& v) {
  int64_t ms = 0;
  if (!gflow::params::parseDurationMs(v, &ms)) {
    usageError(flag + " '" + v + "': expected a duration such as 30, 30s, 500ms or 5m");
  }
  return ms;
}

int parsePort(const std::string& what, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long p = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0' || p < 1 || p > 65535) {
    usageError(what + " '" + v + "': expected a port number in 1..65535");
  }
  return static_cast<int>(p);
}

void checkHostPort(const std::string& what, const std::string& v) {
  size_t colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    usageError(what + " '" + v + "': expected host:port");
  }
  parsePort(what, v.substr(colon + 1));
}

bool isRankVar(const std::string& key) {
  for (const char* k : kRankVars) {
    if (key == k) return true;
  }
  return false;
}

Config parseArgs(int argc, char** argv) {
  Config cfg;
  bool sawNp = false;
  int i = 1;
  while (i < argc) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") break;  // the program starts here
    // Accept "--flag=value", "--flag value", "-n4", "-n 4" and mpirun's "-np 4".
    std::string flag = arg == "-np" ? "--np" : arg;
    std::string value;
    bool inlineValue = false;
    if (arg.rfind("--", 0) == 0) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        flag = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        inlineValue = true;
      }
    } else if (arg != "-np" && arg.size() > 2 && arg[1] == 'n') {
      flag = "-n";
      value = arg.substr(2);
      inlineValue = true;
    }
    auto takeValue = [&]() -> std::string {
      if (inlineValue) return value;
      if (i + 1 >= argc) usageError(flag + " needs a value");
      return argv[++i];
    };
    auto noValue = [&]() {
      if (inlineValue) usageError(flag + " takes no value");
    };

    if (flag == "-h" || flag == "--help") {
      printHelp();
      std::exit(0);
    } else if (flag == "-n" || flag == "--np") {
      std::string v = takeValue();
      char* end = nullptr;
      errno = 0;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || errno != 0 || *end != '\0' || n < 1 || n > 65536) {
        usageError(flag + " '" + v + "': expected a number of ranks in 1..65536");
      }
      cfg.np = static_cast<int>(n);
      sawNp = true;
    } else if (flag == "--env") {
      std::string kv = takeValue();
      size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) usageError("--env '" + kv + "': expected K=V");
      std::string key = kv.substr(0, eq);
      if (isRankVar(key)) {
        usageError("--env cannot set " + key + ": gflowrun sets it per rank (use -n)");
      }
      if (key == "GFLOW_JOB_TOKEN") {
        // Every local user can read a process's argv (/proc/<pid>/cmdline).
        usageError(
            "--env cannot set GFLOW_JOB_TOKEN: a secret on the command line is readable "
            "by every user of this host; use --token-file FILE or export it");
      }
      cfg.env.emplace_back(key, kv.substr(eq + 1));
    } else if (flag == "--token-file") {
      cfg.token = readTokenFile(takeValue());
    } else if (flag == "--root") {
      cfg.root = takeValue();
      checkHostPort("--root", cfg.root);
    } else if (flag == "--port") {
      cfg.port = parsePort("--port", takeValue());
    } else if (flag == "--timeout") {
      cfg.timeoutMs = parseDurationArg(flag, takeValue());
      if (cfg.timeoutMs <= 0) usageError("--timeout must be positive");
    } else if (flag == "--grace") {
      cfg.graceMs = parseDurationArg(flag, takeValue());
    } else if (flag == "--elastic") {
      noValue();
      cfg.elastic = true;
    } else if (flag == "--max-restarts") {
      const std::string v = takeValue();
      char* end = nullptr;
      errno = 0;
      const long k = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || errno != 0 || *end != '\0' || k < 0 || k > 65536) {
        usageError("--max-restarts '" + v + "': expected a number in 0..65536");
      }
      cfg.maxRestarts = static_cast<int>(k);
    } else if (flag == "--serve-store") {
      noValue();
      cfg.serveStore = true;
    } else if (flag == "--no-prefix") {
      noValue();
      cfg.prefix = false;
    } else if (flag == "--print-config") {
      noValue();
      cfg.printConfig = true;
    } else if (flag == "--topology") {
      noValue();
      cfg.topology = true;
    } else {
      usageError("unknown option '" + arg + "'");
    }
    ++i;
  }
  for (; i < argc; ++i) cfg.argv.emplace_back(argv[i]);

  if (cfg.printConfig || cfg.topology) return cfg;  // need neither -n nor a program
  if (cfg.serveStore) {
    if (sawNp || !cfg.argv.empty() || cfg.elastic) {
      usageError("--serve-store runs no ranks: no -n, --elastic or program");
    }
    if (!cfg.root.empty() && cfg.port >= 0) usageError("--root and --port are exclusive");
    return cfg;
  }
  if (!sawNp) usageError("missing -n N (the number of ranks)");
  if (cfg.argv.empty()) usageError("missing the program to run");
  if (!cfg.root.empty() && cfg.port >= 0) usageError("--root and --port are exclusive");
  if (cfg.maxRestarts > 0 && !cfg.elastic) usageError("--max-restarts needs --elastic");
  return cfg;
}

// A job store served here at `root` (else --port, else a free port on
// 127.0.0.1) with `token`; its address in `address`.
std::unique_ptr<gflow::TcpStore> storeServer(const Config& cfg, const std::string& root,
                                             const std::string& token, std::string* address) {
  gflow::TcpStoreOptions so;
  so.isServer = true;
  so.token = token;
  so.port = cfg.port > 0 ? static_cast<uint16_t>(cfg.port) : 0;
  if (!root.empty()) {
    const size_t colon = root.rfind(':');
    so.host = root.substr(0, colon);
    so.port = static_cast<uint16_t>(parsePort("--root", root.substr(colon + 1)));
  }
  auto store = std::make_unique<gflow::TcpStore>(so);
  *address = root.empty() ? "127.0.0.1:" + std::to_string(store->port()) : root;
  return store;
}

void printConfig() {
  std::printf("# GFLOW_* parameters (docs/configuration.md)\n");
  for (const gflow::params::Param& p : gflow::params::all()) {
    const char* cur = std::getenv(p.name);
    bool perRank = isRankVar(p.name) || std::string(p.name) == "GFLOW_ROOT";
    std::printf("%s\n", p.name);
    std::printf("  default: %s\n", *p.defaultValue ? p.defaultValue : "(none)");
    if (perRank) {
      std::printf("  current: %s (gflowrun sets it for each rank)\n", cur ? cur : "(unset)");
    } else if (gflow::params::isSecret(p)) {
      // Whether it is set, never the value; the doc says gflowrun makes one.
      std::printf("  current: %s\n", gflow::params::shownValue(p, cur ? cur : "").c_str());
    } else {
      std::printf("  current: %s\n",
                  cur ? gflow::params::shownValue(p, cur, std::string::npos).c_str() : "(unset)");
    }
    if (const std::string a = gflow::params::acceptedValues(p); !a.empty()) {
      std::printf("  accepts: %s\n", a.c_str());
    }
    if (p.scope == gflow::params::Scope::kAgree) {
      std::printf("  every rank must use the same value\n");
    }
    std::printf("  %s\n", p.doc);
  }
}

// What Topology::discover() found, and where a rank started here would pin
// its progress thread (the same decision pinCurrentThreadNear makes).
int printTopology() {
  namespace topo = gflow::topology;
  try {
    const topo::Topology& t = topo::Topology::discover();
    std::fputs(t.describe().c_str(), stdout);
    const std::string nic = topo::dataInterfaceName();
    const long long pin = static_cast<long long>(gflow::params::pin());
    std::printf("Progress threads (GFLOW_PIN=%lld), data interface %s: ", pin,
                nic.empty() ? "(none)" : nic.c_str());
    if (pin == 0) {
      std::printf("not pinned\n");
    } else {
      topo::PinPlan plan = topo::planPin(t, nic, topo::currentThreadAffinity(), topo::currentCpu());
      if (plan.bind) {
        std::printf("pinned to cpus %s, %s\n", topo::formatCpuList(plan.cpus).c_str(),
                    plan.reason.c_str());
      } else {
        std::printf("not pinned (%s)\n", plan.reason.c_str());
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gflowrun: %s\n", e.what());
    return 1;
  }
}

// Binds port 0 on loopback and returns the port the kernel chose. The socket
// is closed before rank 0 binds the port, so another process could take it in
// between; the window is short, and --port/--root exist for when it matters.
int pickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    std::fprintf(stderr, "gflowrun: socket: %s\n", std::strerror(errno));
    std::exit(1);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::fprintf(stderr, "gflowrun: cannot find a free port: %s\n", std::strerror(errno));
    std::exit(1);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Writes all of `data`; gives up silently when the reader is gone (EPIPE):
// losing output must not take the job down.
void writeAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      return;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// Splits one rank's stream into lines and writes each with the rank prefix.
// Complete lines of one read go out in a single write, so lines of different
// ranks never interleave mid-line.
class LineForwarder {
 public:
  LineForwarder(std::string prefix, int outFd) : prefix_(std::move(prefix)), outFd_(outFd) {}

  void feed(const char* data, size_t n) {
    std::string out;
    size_t start = 0;
    for (size_t i = 0; i < n; ++i) {
      if (data[i] != '\n') continue;
      out += prefix_;
      out.append(partial_);
      out.append(data + start, i + 1 - start);
      partial_.clear();
      start = i + 1;
    }
    partial_.append(data + start, n - start);
    while (partial_.size() >= kMaxLine) {
      out += prefix_;
      out.append(partial_, 0, kMaxLine);
      out += '\n';
      partial_.erase(0, kMaxLine);
    }
    if (!out.empty()) writeAll(outFd_, out.data(), out.size());
  }

  // End of stream: a last line without '\n' still gets its prefix and a
  // newline, so the next rank's line starts on a line of its own.
  void finish() {
    if (partial_.empty()) return;
    std::string out = prefix_ + partial_ + "\n";
    partial_.clear();
    writeAll(outFd_, out.data(), out.size());
  }

 private:
  std::string prefix_;
  int outFd_;
  std::string partial_;
};

int statusToExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "stopped";
}

bool failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

class Job {
 public:
  explicit Job(Config cfg) : cfg_(std::move(cfg)) {}

  int run() {
    setUpSignals();
    // Each rank's output pipes stay open here (two read ends with the
    // prefix, none without) until it exits; the ranks inherit the raised
    // limit too.
    const size_t ranks = size_t(cfg_.np) + size_t(cfg_.maxRestarts);
    gflow::fdlimit::require(cfg_.prefix ? 2 * ranks + 8 : 8,
                            "gflowrun with " + std::to_string(cfg_.np) + " ranks",
                            gflow::ErrorContext::forOp("gflowrun"));
    prepareEnvironment();
    if (cfg_.timeoutMs > 0) {
      jobDeadline_ = Clock::now() + std::chrono::milliseconds(cfg_.timeoutMs);
      jobDeadlineArmed_ = true;
    }
    for (int r = 0; r < cfg_.np && !shuttingDown_; ++r) spawn(r);
    loop();
    if (timedOut_) return kTimeoutExit;
    if (cfg_.elastic && anySucceeded_ && interruptSignal_ == 0) return 0;
    if (haveFailure_) return statusToExitCode(firstFailure_);
    if (interruptSignal_ != 0) return 128 + interruptSignal_;
    return 0;
  }

 private:
  struct Rank {
    pid_t pid = -1;
    bool running = false;
    int fds[2] = {-1, -1};  // stdout, stderr pipes (read ends); -1 when closed
    std::vector<LineForwarder> fwd;
  };

  void setUpSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    // Blocked signals are delivered through the signalfd instead; the ranks
    // get the original mask back before exec.
    sigprocmask(SIG_BLOCK, &set, &savedMask_);
    sigfd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd_ < 0) {
      std::fprintf(stderr, "gflowrun: signalfd: %s\n", std::strerror(errno));
      std::exit(1);
    }
    // A closed stdout must not kill gflowrun before it has reaped the ranks.
    ::signal(SIGPIPE, SIG_IGN);
  }

  // The environment every rank shares; per-rank variables are appended in spawn().
  void prepareEnvironment() {
    std::string root = cfg_.root;
    std::string token = cfg_.token;
    if (const char* t = std::getenv("GFLOW_JOB_TOKEN"); token.empty() && t && *t) token = t;
    for (const auto& [k, v] : cfg_.env) {
      if (k == "GFLOW_ROOT" && root.empty()) root = v;
    }
    // An inherited GFLOW_ROOT (say, from an enclosing gflow job) is ignored:
    // this job's rank 0 serves its own store.
    if (root.empty() && !cfg_.elastic) {
      int port = cfg_.port >= 0 ? cfg_.port : pickFreePort();
      root = "127.0.0.1:" + std::to_string(port);
    }
    if (token.empty()) token = gflow::auth::randomToken();
    if (cfg_.elastic) root = serveStore(cfg_.root, token);

    auto dropped = [&](const std::string& key) {
      if (isRankVar(key) || key == "GFLOW_ROOT" || key == "GFLOW_JOB_TOKEN") return true;
      for (const char* k : kForeignIdentityVars) {
        if (key == k) return true;
      }
      for (const auto& kv : cfg_.env) {
        if (kv.first == key) return true;
      }
      return false;
    };
    for (char** e = environ; *e; ++e) {
      std::string entry = *e;
      if (!dropped(entry.substr(0, entry.find('=')))) baseEnv_.push_back(entry);
    }
    for (const auto& [k, v] : cfg_.env) {
      if (k != "GFLOW_ROOT" && k != "GFLOW_JOB_TOKEN") baseEnv_.push_back(k + "=" + v);
    }
    // Rank 0 prints the run's stragglers when its communicator ends,
    // unless the user chose otherwise.
    bool atExitSet = std::getenv("GFLOW_STRAGGLER_AT_EXIT") != nullptr;
    for (const auto& kv : cfg_.env) atExitSet = atExitSet || kv.first == "GFLOW_STRAGGLER_AT_EXIT";
    if (!atExitSet) baseEnv_.push_back("GFLOW_STRAGGLER_AT_EXIT=1");
    baseEnv_.push_back("GFLOW_ROOT=" + root);
    if (cfg_.elastic) baseEnv_.push_back("GFLOW_ROOT_EXTERNAL=1");
    baseEnv_.push_back("GFLOW_JOB_TOKEN=" + token);
    baseEnv_.push_back("GFLOW_WORLD_SIZE=" + std::to_string(cfg_.np));
    baseEnv_.push_back("GFLOW_LOCAL_SIZE=" + std::to_string(cfg_.np));
  }

  // --elastic: the job's store, served here so that it outlives every rank;
  // returns its address.
  std::string serveStore(const std::string& root, const std::string& token) {
    std::string address;
    store_ = storeServer(cfg_, root, token, &address);
    return address;
  }

  // Starts rank `r` (index into ranks_ and its output label); a replacement
  // (`joining`) gets GFLOW_JOIN=1 instead of a rank.
  void spawn(int r, bool joining = false) {
    std::vector<std::string> env = baseEnv_;
    if (joining) {
      env.push_back("GFLOW_JOIN=1");
    } else {
      env.push_back("GFLOW_RANK=" + std::to_string(r));
      env.push_back("GFLOW_LOCAL_RANK=" + std::to_string(r));
    }
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (std::string& s : cfg_.argv) argv.push_back(s.data());
    argv.push_back(nullptr);

    int outPipe[2] = {-1, -1}, errPipe[2] = {-1, -1}, execPipe[2];
    // O_CLOEXEC everywhere: a rank must not inherit another rank's pipe ends,
    // or gflowrun would never see EOF on them.
    if ((cfg_.prefix && (::pipe2(outPipe, O_CLOEXEC) != 0 || ::pipe2(errPipe, O_CLOEXEC) != 0)) ||
        ::pipe2(execPipe, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "gflowrun: pipe: %s\n", std::strerror(errno));
      std::exit(1);
    }
    // A rank runs in its own process group, so a terminal's SIGTTIN would
    // stop rank 0 if it read from the terminal; it gets stdin only when stdin
    // is a file or pipe. The other ranks always read /dev/null.
    bool inheritStdin = r == 0 && !::isatty(STDIN_FILENO);

    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "gflowrun: fork: %s\n", std::strerror(errno));
      std::exit(1);
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      ::setpgid(0, 0);
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &savedMask_, nullptr);
      if (cfg_.prefix) {
        ::dup2(outPipe[1], STDOUT_FILENO);
        ::dup2(errPipe[1], STDERR_FILENO);
      }
      if (!inheritStdin) {
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
      }
      ::execvpe(argv[0], argv.data(), envp.data());
      int err = errno;
      ssize_t ignored = ::write(execPipe[1], &err, sizeof(err));
      (void)ignored;
      ::_exit(kExecFailedExit);
    }
    // Also in the parent, so the group exists before we might signal it.
    ::setpgid(pid, pid);
    ranks_[r].pid = pid;
    ranks_[r].running = true;
    ++running_;
    if (cfg_.prefix) {
      ::close(outPipe[1]);
      ::close(errPipe[1]);
      ranks_[r].fds[0] = outPipe[0];
      ranks_[r].fds[1] = errPipe[0];
      ::fcntl(outPipe[0], F_SETFL, O_NONBLOCK);
      ::fcntl(errPipe[0], F_SETFL, O_NONBLOCK);
      std::string prefix = "[" + std::to_string(r) + "] ";
      ranks_[r].fwd.emplace_back(prefix, STDOUT_FILENO);
      ranks_[r].fwd.emplace_back(prefix, STDERR_FILENO);
    }
    ::close(execPipe[1]);
    // EOF means exec succeeded (the pipe is close-on-exec); an int is errno.
    int err = 0;
    ssize_t n;
    do {
      n = ::read(execPipe[0], &err, sizeof(err));
    } while (n < 0 && errno == EINTR);
    ::close(execPipe[0]);
    if (n == static_cast<ssize_t>(sizeof(err))) {
      std::fprintf(stderr, "gflowrun: rank %d: cannot execute '%s': %s\n", r, argv[0],
                   std::strerror(err));
      // The child exits 127; record that as the job's failure right away
      // and start no further ranks.
      // (A replacement's exec failure ends only it: the job goes on.)
      if (!joining) recordFailure(r, kExecFailedExit << 8, /*announce=*/false);
    }
  }

  void signalAll(int sig) {
    for (const Rank& rk : ranks_) {
      if (rk.running) ::kill(-rk.pid, sig);
    }
  }

  // Starts the orderly end of the job: SIGTERM now, SIGKILL after the grace.
  void shutDown(int sig) {
    if (!shuttingDown_) {
      shuttingDown_ = true;
      killAt_ = Clock::now() + std::chrono::milliseconds(cfg_.graceMs);
    }
    signalAll(sig);
  }

  void recordFailure(int r, int status, bool announce) {
    if (shuttingDown_) return;  // a consequence of the shutdown, not its cause
    if (!haveFailure_) firstFailure_ = status;
    haveFailure_ = true;
    if (cfg_.elastic && announce) {
      keepGoing(r, status);
      return;
    }
    if (announce) {
      std::fprintf(stderr, "gflowrun: rank %d %s; terminating the other ranks\n", r,
                   describeStatus(status).c_str());
    }
    shutDown(SIGTERM);
  }

  // --elastic: the others go on without rank r; a replacement joins while
  // restarts are left.
  void keepGoing(int r, int status) {
    const bool replace = restarts_ < cfg_.maxRestarts;
    std::fprintf(
        stderr, "gflowrun: rank %d %s; the job goes on (--elastic)%s\n", r,
        describeStatus(status).c_str(),
        replace ? (", replacement " + std::to_string(ranks_.size()) + " joins").c_str() : "");
    if (!replace) return;
    ++restarts_;
    ranks_.emplace_back();
    spawn(static_cast<int>(ranks_.size()) - 1, /*joining=*/true);
  }

  // Rank r exited 0. --elastic: a rank the survivors shrank away from (a
  // stopped one) may never exit, so the others get kElasticLinger to end
  // as well before the orderly shutdown.
  void finished(int r) {
    const bool first = !anySucceeded_;
    anySucceeded_ = true;
    if (!cfg_.elastic || !first || running_ == 0) return;
    lingerUntil_ = Clock::now() + kElasticLinger;
    lingerArmed_ = true;
    lingerRank_ = r;
  }

  void reap() {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        if (ranks_[r].pid != pid || !ranks_[r].running) continue;
        ranks_[r].running = false;
        --running_;
        if (running_ == 0) drainUntil_ = Clock::now() + kDrainAfterExit;
        if (failed(status)) {
          recordFailure(static_cast<int>(r), status, /*announce=*/true);
        } else {
          finished(static_cast<int>(r));
        }
      }
    }
  }

  void handleSignals() {
    signalfd_siginfo si;
    while (::read(sigfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) continue;  // reap() runs after every wakeup anyway
      if (interruptSignal_ != 0) {
        // A second interrupt: the user has waited long enough.
        std::fprintf(stderr, "gflowrun: %s again; killing all ranks\n", strsignal(sig));
        signalAll(SIGKILL);
        continue;
      }
      interruptSignal_ = sig;
      // Forwarded as-is, so a rank sees the signal the user sent; the ranks'
      // resulting exits are not reported as failures.
      shutDown(sig);
    }
  }

  void readOutput(Rank& rk, int stream) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(rk.fds[stream], buf, sizeof(buf));
      if (n > 0) {
        rk.fwd[stream].feed(buf, static_cast<size_t>(n));
        if (static_cast<size_t>(n) < sizeof(buf)) return;
        continue;
      }
      if (n < 0 && (errno == EINTR)) continue;
      if (n < 0 && errno == EAGAIN) return;
      rk.fwd[stream].finish();  // EOF or a read error: this stream is done
      ::close(rk.fds[stream]);
      rk.fds[stream] = -1;
      return;
    }
  }

  void closeAllOutput() {
    for (Rank& rk : ranks_) {
      for (int s = 0; s < 2; ++s) {
        if (rk.fds[s] < 0) continue;
        readOutput(rk, s);
        if (rk.fds[s] < 0) continue;
        rk.fwd[s].finish();
        ::close(rk.fds[s]);
        rk.fds[s] = -1;
      }
    }
  }

  static int msUntil(Clock::time_point t) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 1 << 30));
  }

  void loop() {
    std::vector<pollfd> pfds;
    std::vector<std::pair<size_t, int>> owners;  // (rank, stream) of pfds[1..]
    for (;;) {
      reap();
      Clock::time_point now = Clock::now();
      if (jobDeadlineArmed_ && now >= jobDeadline_) {
        jobDeadlineArmed_ = false;
        if (running_ > 0 && !shuttingDown_) {
          std::fprintf(stderr, "gflowrun: job timed out after %.3gs; terminating all ranks\n",
                       cfg_.timeoutMs / 1000.0);
          timedOut_ = true;
          shutDown(SIGTERM);
        }
      }
      if (lingerArmed_ && now >= lingerUntil_) {
        lingerArmed_ = false;
        if (running_ > 0 && !shuttingDown_) {
          std::fprintf(stderr,
                       "gflowrun: %d rank(s) still running %llds after rank %d finished; "
                       "terminating them (--elastic)\n",
                       running_, static_cast<long long>(kElasticLinger.count() / 1000),
                       lingerRank_);
          shutDown(SIGTERM);
        }
      }
      if (shuttingDown_ && !killed_ && running_ > 0 && now >= killAt_) {
        killed_ = true;
        signalAll(SIGKILL);
      }

      pfds.clear();
      owners.clear();
      pfds.push_back({sigfd_, POLLIN, 0});
      for (size_t r = 0; r < ranks_.size(); ++r) {
        for (int s = 0; s < 2; ++s) {
          if (ranks_[r].fds[s] < 0) continue;
          pfds.push_back({ranks_[r].fds[s], POLLIN, 0});
          owners.emplace_back(r, s);
        }
      }
      if (running_ == 0) {
        // Every rank is gone; only leftover children may still hold a pipe.
        if (owners.empty()) return;
        if (now >= drainUntil_) {
          closeAllOutput();
          return;
        }
      }

      int timeout = -1;
      auto consider = [&](Clock::time_point t) {
        int ms = msUntil(t);
        if (timeout < 0 || ms < timeout) timeout = ms;
      };
      if (jobDeadlineArmed_) consider(jobDeadline_);
      if (lingerArmed_) consider(lingerUntil_);
      if (shuttingDown_ && !killed_ && running_ > 0) consider(killAt_);
      if (running_ == 0) consider(drainUntil_);

      int n = ::poll(pfds.data(), pfds.size(), timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        std::fprintf(stderr, "gflowrun: poll: %s\n", std::strerror(errno));
        signalAll(SIGKILL);
        std::exit(1);
      }
      if (pfds[0].revents & POLLIN) handleSignals();
      for (size_t i = 1; i < pfds.size(); ++i) {
        if (pfds[i].revents == 0) continue;
        readOutput(ranks_[owners[i - 1].first], owners[i - 1].second);
      }
    }
  }

  Config cfg_;
  std::vector<std::string> baseEnv_;
  std::vector<Rank> ranks_ = std::vector<Rank>(static_cast<size_t>(cfg_.np));
  sigset_t savedMask_{};
  int sigfd_ = -1;
  int running_ = 0;

  bool shuttingDown_ = false;
  bool killed_ = false;
  Clock::time_point killAt_{};
  bool jobDeadlineArmed_ = false;
  Clock::time_point jobDeadline_{};
  Clock::time_point drainUntil_{};

  bool haveFailure_ = false;
  int firstFailure_ = 0;
  bool anySucceeded_ = false;
  bool lingerArmed_ = false;  // --elastic: a rank finished; the others' time
  Clock::time_point lingerUntil_{};
  int lingerRank_ = -1;
  int restarts_ = 0;                        // replacements started (--elastic)
  std::unique_ptr<gflow::TcpStore> store_;  // --elastic: the job's store
  bool timedOut_ = false;
  int interruptSignal_ = 0;
};

}  // namespace

// --serve-store: only the job's store, until SIGINT, SIGTERM or SIGHUP.
int serveStoreOnly(const Config& cfg) {
  std::string token = cfg.token;
  if (const char* t = std::getenv("GFLOW_JOB_TOKEN"); token.empty() && t && *t) token = t;
  if (token.empty()) {
    usageError(
        "--serve-store needs the job token: --token-file FILE or an exported "
        "GFLOW_JOB_TOKEN (the ranks must have the same)");
  }
  // Blocked before the store's threads start, so they inherit the mask and
  // sigwait() below takes the signal.
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, sig);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::string address;
  auto store = storeServer(cfg, cfg.root, token, &address);
  std::printf("%s\n", address.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  return 0;
}

int main(int argc, char** argv) {
  Config cfg = parseArgs(argc, argv);
  if (cfg.printConfig) {
    printConfig();
    return 0;
  }
  if (cfg.topology) return printTopology();
  try {
    if (cfg.serveStore) return serveStoreOnly(cfg);
    return Job(std::move(cfg)).run();
  } catch (const gflow::Error& e) {
    std::fprintf(stderr, "gflowrun: %s\n", e.what());
    return 1;
  }
}
