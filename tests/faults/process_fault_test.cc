// Process-based fault tests: every rank is a separate fault_worker process
// (tests/faults/fault_worker.cc), started here with fork/exec and its identity
// in GFLOW_* variables, so faults are real: SIGKILL, SIGSTOP, wrong tokens,
// strangers on the store and data ports, ranks calling different collectives.
//
// Each test owns a Job: a set of rank processes with stdout/stderr in files (so
// nothing has to be drained while waiting), reaped with their exit times, and
// a hard deadline after which every process is SIGKILLed and the test fails
// instead of hanging. Children also die with the test binary (PDEATHSIG).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store_protocol.h"
#include "common/auth.h"
#include "common/socket.h"
#include "gflow/gflow.h"
#include "transport/tcp/frame.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

const char* const kWorker = GFLOW_TEST_BINARY_DIR "/tests/faults/fault_worker";
const char* const kToken = "fault-test-token";
constexpr const char* k4MiB = "4194304";

// fault_worker's exit status for a gflow::Error of `code`.
int exitCodeFor(gflow::ErrorCode code) {
  return 10 + static_cast<int>(code);
}

double secondsSince(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A port that was free a moment ago (for rank 0's store).
uint16_t freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ADD_FAILURE() << "cannot find a free port: " << std::strerror(errno);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Launcher variables a developer's shell may carry that would change the
// workers' identity or tuning; the workers get a clean copy of the rest.
bool inheritedVariable(const std::string& kv) {
  static const char* const kDrop[] = {
      "GFLOW_",       "RANK=",        "WORLD_SIZE=",      "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
      "MASTER_ADDR=", "MASTER_PORT=", "OMPI_COMM_WORLD_", "SLURM_"};
  for (const char* p : kDrop) {
    if (kv.compare(0, std::strlen(p), p) == 0) return false;
  }
  return true;
}

// What one rank process did.
struct RankResult {
  bool exited = false;
  int exitCode = -1;  // WEXITSTATUS; -1 when a signal ended it
  int signal = 0;
  Clock::time_point exitTime{};
  std::string out, err;
  // From the worker's GFLOW_ERROR line (code empty: no such line).
  std::string code;
  int peer = -1;
  long seq = -1;  // the op's sequence number on its communicator
  std::string what;

  bool printed(const std::string& prefix) const {
    return out.find("\n" + prefix) != std::string::npos ||
           out.compare(0, prefix.size(), prefix) == 0;
  }
  // The rank is named as the error's peer or in its message ("rank 2 ...", "(peer 2)").
  bool names(int rank) const {
    const std::string r = std::to_string(rank);
    return peer == rank || std::regex_search(what, std::regex("\\b(rank|peer) " + r + "\\b"));
  }
};

class Job {
 public:
  using Args = std::function<std::vector<std::string>(int rank)>;

  // Every wait of this job ends by `hardLimit` after construction.
  Job(int size, Args args, Clock::duration hardLimit = seconds(14))
      : size_(size), args_(std::move(args)), hardDeadline_(Clock::now() + hardLimit) {
    char tmpl[] = "/tmp/gflow_fault.XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr) << std::strerror(errno);
    dir_ = d ? d : "/tmp";
    port_ = freePort();
    env_["GFLOW_WORLD_SIZE"] = std::to_string(size);
    env_["GFLOW_ROOT"] = root();
    env_["GFLOW_JOB_TOKEN"] = kToken;
    env_["GFLOW_SOCKET_IFNAME"] = "lo";
    rankEnv_.resize(size);
    results_.resize(size);
    pids_.assign(size, -1);
  }

  ~Job() {
    killAll();
    for (int r = 0; r < size_; ++r) {
      std::remove(outPath(r).c_str());
      std::remove(errPath(r).c_str());
    }
    ::rmdir(dir_.c_str());
  }

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  void setEnv(const std::string& k, const std::string& v) { env_[k] = v; }
  void setRankEnv(int rank, const std::string& k, const std::string& v) { rankEnv_[rank][k] = v; }
  std::string root() const { return "127.0.0.1:" + std::to_string(port_); }
  uint16_t port() const { return port_; }

  void start() {
    std::vector<std::string> base;
    for (char** e = environ; *e != nullptr; ++e) {
      if (inheritedVariable(*e)) base.emplace_back(*e);
    }
    started_ = Clock::now();
    for (int r = 0; r < size_; ++r) {
      std::map<std::string, std::string> vars = env_;
      vars["GFLOW_RANK"] = std::to_string(r);
      for (const auto& [k, v] : rankEnv_[r]) vars[k] = v;
      std::vector<std::string> envs = base;
      for (const auto& [k, v] : vars) envs.push_back(k + "=" + v);
      std::vector<std::string> argv = args_(r);
      argv.insert(argv.begin(), kWorker);
      // Everything is prepared before fork(): the child only makes syscalls.
      std::vector<char*> cargv, cenv;
      for (auto& s : argv) cargv.push_back(s.data());
      cargv.push_back(nullptr);
      for (auto& s : envs) cenv.push_back(s.data());
      cenv.push_back(nullptr);
      int out = ::open(outPath(r).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      int err = ::open(errPath(r).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      const pid_t parent = ::getpid();
      pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(125);
        ::dup2(out, STDOUT_FILENO);
        ::dup2(err, STDERR_FILENO);
        ::execve(kWorker, cargv.data(), cenv.data());
        ::_exit(126);
      }
      ::close(out);
      ::close(err);
      ASSERT_GT(pid, 0) << "fork: " << std::strerror(errno);
      pids_[r] = pid;
    }
  }

  // Reaps whatever has exited; records exit times.
  void poll() {
    for (int r = 0; r < size_; ++r) {
      if (pids_[r] <= 0 || results_[r].exited) continue;
      int status = 0;
      if (::waitpid(pids_[r], &status, WNOHANG) == pids_[r]) {
        RankResult& res = results_[r];
        res.exited = true;
        res.exitTime = Clock::now();
        if (WIFEXITED(status)) res.exitCode = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) res.signal = WTERMSIG(status);
      }
    }
  }

  // Polls until pred() holds (true) or `limit` / the hard deadline passes.
  bool waitUntil(const std::function<bool()>& pred, Clock::duration limit) {
    const Clock::time_point until = std::min(Clock::now() + limit, hardDeadline_);
    for (;;) {
      poll();
      if (pred()) return true;
      if (Clock::now() >= until) return false;
      std::this_thread::sleep_for(milliseconds(2));
    }
  }

  bool exited(int rank) const { return results_[rank].exited; }

  // Waits until every rank in `ranks` (all when empty) has exited. On timeout
  // every process still running is SIGKILLed and false is returned.
  bool waitExit(Clock::duration limit, std::vector<int> ranks = {}) {
    if (ranks.empty()) {
      for (int r = 0; r < size_; ++r) ranks.push_back(r);
    }
    bool ok = waitUntil(
        [&] {
          for (int r : ranks) {
            if (!results_[r].exited) return false;
          }
          return true;
        },
        limit);
    collect();
    if (!ok) {
      timedOut_ = true;
      killAll();
    }
    return ok;
  }

  // Highest GFLOW_PROGRESS iteration `rank` has printed (0: none).
  int progress(int rank) const {
    static const std::regex kLine("GFLOW_PROGRESS rank=\\d+ iter=(\\d+)");
    std::string out = readFile(outPath(rank));
    int best = 0;
    for (std::sregex_iterator it(out.begin(), out.end(), kLine), end; it != end; ++it) {
      best = std::max(best, std::stoi((*it)[1].str()));
    }
    return best;
  }

  bool waitProgress(int iters, Clock::duration limit) {
    return waitUntil(
        [&] {
          for (int r = 0; r < size_; ++r) {
            if (results_[r].exited || progress(r) < iters) return false;
          }
          return true;
        },
        limit);
  }

  Clock::time_point signal(int rank, int sig) {
    Clock::time_point now = Clock::now();
    EXPECT_EQ(::kill(pids_[rank], sig), 0) << std::strerror(errno);
    return now;
  }

  const RankResult& result(int rank) const { return results_[rank]; }
  Clock::time_point started() const { return started_; }

  // Everything a failure message needs.
  std::string report() {
    collect();
    std::ostringstream os;
    os << "job of " << size_ << " ranks, root " << root()
       << (timedOut_ ? " (hit its timeout; survivors were SIGKILLed)" : "") << "\n";
    for (int r = 0; r < size_; ++r) {
      const RankResult& res = results_[r];
      os << "--- rank " << r << ": ";
      if (!res.exited) {
        os << "still running";
      } else if (res.signal) {
        os << "killed by signal " << res.signal;
      } else {
        os << "exit " << res.exitCode;
      }
      if (res.exited) os << " after " << secondsSince(started_, res.exitTime) << " s";
      os << "\nstdout:\n" << tail(res.out) << "stderr:\n" << tail(res.err);
    }
    return os.str();
  }

 private:
  std::string outPath(int r) const { return dir_ + "/rank" + std::to_string(r) + ".out"; }
  std::string errPath(int r) const { return dir_ + "/rank" + std::to_string(r) + ".err"; }

  static std::string tail(const std::string& s) {
    return s.size() <= 3000 ? s : "..." + s.substr(s.size() - 3000);
  }

  void collect() {
    static const std::regex kError(
        "GFLOW_ERROR code=(\\S+) rank=-?\\d+ peer=(-?\\d+) op=\\S+ seq=(\\d+) what=(.*)");
    for (int r = 0; r < size_; ++r) {
      RankResult& res = results_[r];
      res.out = readFile(outPath(r));
      res.err = readFile(errPath(r));
      std::smatch m;
      if (std::regex_search(res.out, m, kError)) {
        res.code = m[1].str();
        res.peer = std::stoi(m[2].str());
        res.seq = std::stol(m[3].str());
        res.what = m[4].str();
      }
    }
  }

  void killAll() {
    for (int r = 0; r < size_; ++r) {
      if (pids_[r] > 0 && !results_[r].exited) {
        ::kill(pids_[r], SIGKILL);
        int status = 0;
        ::waitpid(pids_[r], &status, 0);
        results_[r].exited = true;
        results_[r].signal = SIGKILL;
        results_[r].exitTime = Clock::now();
      }
    }
  }

  int size_;
  Args args_;
  Clock::time_point hardDeadline_;
  Clock::time_point started_{};
  std::string dir_;
  uint16_t port_ = 0;
  std::map<std::string, std::string> env_;
  std::vector<std::map<std::string, std::string>> rankEnv_;
  std::vector<pid_t> pids_;
  std::vector<RankResult> results_;
  bool timedOut_ = false;
};

Job::Args sameArgs(std::vector<std::string> args) {
  return [args](int) { return args; };
}

// One line per rank in the test log: when it exited (seconds after `event`)
// and the error it reported.
void logRank(const std::string& event, int rank, double seconds, const RankResult& res) {
  std::string said = res.code.empty() ? "exit " + std::to_string(res.exitCode) : res.what;
  if (said.size() > 400) said = said.substr(0, 400) + "...";
  std::printf("[ timing   ] %s: rank %d exited after %.3f s: %s\n", event.c_str(), rank, seconds,
              said.c_str());
}

// ---- raw sockets for the garbage tests ------------------------------------

gflow::net::Socket connectRaw(const std::string& host, uint16_t port) {
  return gflow::net::connectTo(host, port, gflow::Deadline::after(seconds(5)), "test target");
}

void sendBytes(int fd, const std::vector<uint8_t>& b) {
  // The peer may drop us at any point; that is its right.
  ssize_t r = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
  (void)r;
}

std::vector<uint8_t> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(gen());
  return b;
}

// Authenticates like a gflow process with the job's token; false when the
// other side refused (the caller then has nothing to send).
bool authenticateAs(int fd, const std::string& label) {
  try {
    gflow::auth::authenticate(fd, kToken, label, /*initiator=*/true,
                              gflow::Deadline::after(seconds(5)));
    return true;
  } catch (const gflow::Error& e) {
    ADD_FAILURE() << "authenticating to the " << label << " port: " << e.what();
    return false;
  }
}

gflow::TcpStoreOptions clientOptions(const Job& job) {
  gflow::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = job.port();
  o.token = kToken;
  o.timeout = seconds(5);
  return o;
}

// Garbage of every kind against the store at `port`. Connections that are
// meant to stay open (silent peers, half-sent frames) go to `keep`.
void attackStore(uint16_t port, std::vector<gflow::net::Socket>* keep, uint32_t seed) {
  namespace proto = gflow::bootstrap::proto;
  {  // random bytes, then close
    auto s = connectRaw("127.0.0.1", port);
    sendBytes(s.fd(), randomBytes(4096, seed));
  }
  {  // a huge length prefix before any handshake
    auto s = connectRaw("127.0.0.1", port);
    sendBytes(s.fd(), std::vector<uint8_t>(64, 0xff));
  }
  keep->push_back(connectRaw("127.0.0.1", port));  // connects, stays silent
  {
    auto s = connectRaw("127.0.0.1", port);  // a few handshake bytes, then silent
    sendBytes(s.fd(), {'G', 'F', 'L'});
    keep->push_back(std::move(s));
  }
  {  // authenticated, then a request announcing 4 GiB
    auto s = connectRaw("127.0.0.1", port);
    if (authenticateAs(s.fd(), proto::kAuthLabel)) {
      std::vector<uint8_t> h;
      proto::writeHeader(&h, proto::kRequestMagic, static_cast<uint8_t>(proto::Op::kSet),
                         0xffffffffu);
      sendBytes(s.fd(), h);
    }
  }
  {  // authenticated, then a request with a bad magic and random body
    auto s = connectRaw("127.0.0.1", port);
    if (authenticateAs(s.fd(), proto::kAuthLabel)) sendBytes(s.fd(), randomBytes(512, seed + 1));
  }
  {  // authenticated, half of a valid 1 MiB set, then silent
    auto s = connectRaw("127.0.0.1", port);
    if (authenticateAs(s.fd(), proto::kAuthLabel)) {
      std::vector<uint8_t> h;
      proto::writeHeader(&h, proto::kRequestMagic, static_cast<uint8_t>(proto::Op::kSet), 1u << 20);
      sendBytes(s.fd(), h);
      sendBytes(s.fd(), randomBytes(1000, seed + 2));
      keep->push_back(std::move(s));
    }
  }
}

// ---- 1. kill -9 mid-loop ---------------------------------------------------

// `path`: how the ranks of this one machine talk. "shm": shared memory (the
// default for ranks of one host); "tcp": GFLOW_SHM=0; "hier": GFLOW_HOST_ID
// splits the ranks into two pretend hosts (shared memory inside each, TCP
// between them, hierarchical collectives).
struct RankCase {
  int size;
  int victim;
  const char* path = "shm";
};

void PrintTo(const RankCase& c, std::ostream* os) {
  *os << c.size << " ranks, rank " << c.victim << ", " << c.path;
}

std::string caseName(const ::testing::TestParamInfo<RankCase>& info) {
  return "n" + std::to_string(info.param.size) + "_rank" + std::to_string(info.param.victim) + "_" +
         info.param.path;
}

void setPath(Job& job, const RankCase& c) {
  if (std::string(c.path) == "tcp") job.setEnv("GFLOW_SHM", "0");
  if (std::string(c.path) == "hier") {
    for (int r = 0; r < c.size; ++r) {
      job.setRankEnv(r, "GFLOW_HOST_ID", "pretend-host-" + std::to_string(r * 2 / c.size));
    }
  }
}

// Names in /dev/shm (gflow's segments are memfds and never appear there).
std::set<std::string> devShmEntries() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

class FaultKill : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultKill, SurvivorsReportPeerLostNamingTheKilledRank) {
  const int n = GetParam().size, victim = GetParam().victim;
  const std::set<std::string> shmBefore = devShmEntries();
  Job job(n, sameArgs({"loop", "0", k4MiB}));
  setPath(job, GetParam());
  job.start();
  ASSERT_TRUE(job.waitProgress(3, seconds(8))) << job.report();
  const Clock::time_point killed = job.signal(victim, SIGKILL);
  ASSERT_TRUE(job.waitExit(seconds(11))) << job.report();
  const std::string report = job.report();
  EXPECT_EQ(job.result(victim).signal, SIGKILL) << report;
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const RankResult& res = job.result(r);
    const double took = secondsSince(killed, res.exitTime);
    logRank("n=" + std::to_string(n) + " kill rank " + std::to_string(victim), r, took, res);
    EXPECT_EQ(res.exitCode, exitCodeFor(gflow::ErrorCode::kPeerLost)) << "rank " << r << "\n"
                                                                      << report;
    EXPECT_EQ(res.code, "peer_lost") << "rank " << r << "\n" << report;
    EXPECT_TRUE(res.names(victim))
        << "rank " << r << " does not name rank " << victim << ": " << res.what;
    EXPECT_LT(took, 10.0) << "rank " << r << "\n" << report;
  }
  for (const std::string& name : devShmEntries()) {
    EXPECT_TRUE(shmBefore.count(name)) << "/dev/shm/" << name << " appeared during the job";
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultKill,
                         ::testing::Values(RankCase{3, 1}, RankCase{4, 2}, RankCase{3, 0},
                                           RankCase{3, 1, "tcp"}, RankCase{4, 2, "tcp"},
                                           RankCase{4, 1, "hier"}, RankCase{4, 2, "hier"}),
                         caseName);

// ---- 2. SIGSTOP mid-loop with a short timeout -------------------------------

class FaultStop : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultStop, SurvivorsTimeOutNamingTheStoppedRank) {
  const int n = GetParam().size, victim = GetParam().victim;
  Job job(n, sameArgs({"loop", "0", k4MiB}));
  job.setEnv("GFLOW_TIMEOUT", "3s");
  setPath(job, GetParam());
  job.start();
  ASSERT_TRUE(job.waitProgress(3, seconds(6))) << job.report();
  const Clock::time_point stopped = job.signal(victim, SIGSTOP);
  std::vector<int> survivors;
  for (int r = 0; r < n; ++r) {
    if (r != victim) survivors.push_back(r);
  }
  const bool allFailed = job.waitExit(seconds(7), survivors);
  EXPECT_FALSE(job.exited(victim)) << "the stopped rank exited\n" << job.report();
  job.signal(victim, SIGKILL);
  ASSERT_TRUE(allFailed) << job.report();
  ASSERT_TRUE(job.waitExit(seconds(3))) << job.report();
  const std::string report = job.report();
  for (int r : survivors) {
    const RankResult& res = job.result(r);
    const double took = secondsSince(stopped, res.exitTime);
    logRank("n=" + std::to_string(n) + " stop rank " + std::to_string(victim), r, took, res);
    EXPECT_TRUE(res.code == "timeout" || res.code == "peer_lost") << "rank " << r << "\n" << report;
    EXPECT_EQ(res.exitCode, res.code == "timeout" ? exitCodeFor(gflow::ErrorCode::kTimeout)
                                                  : exitCodeFor(gflow::ErrorCode::kPeerLost))
        << "rank " << r << "\n"
        << report;
    EXPECT_TRUE(res.names(victim)) << "rank " << r << " blames someone else than the stopped rank "
                                   << victim << ": " << res.what;
    EXPECT_LT(took, 3.0 + 2.0) << "rank " << r << "\n" << report;
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultStop,
                         ::testing::Values(RankCase{3, 1}, RankCase{4, 3}, RankCase{3, 1, "tcp"},
                                           RankCase{4, 3, "hier"}),
                         caseName);

// ---- 3. a rank with another job token ---------------------------------------

class FaultToken : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultToken, WrongTokenIsUnauthorizedAndNobodyHangs) {
  const int n = GetParam().size, intruder = GetParam().victim;
  Job job(n, sameArgs({"loop", "3", "65536"}));
  job.setEnv("GFLOW_TIMEOUT", "5s");
  job.setRankEnv(intruder, "GFLOW_JOB_TOKEN", "another-job");
  job.start();
  ASSERT_TRUE(job.waitExit(seconds(5 + 4))) << job.report();
  const std::string report = job.report();
  int unauthorized = 0;
  for (int r = 0; r < n; ++r) {
    const RankResult& res = job.result(r);
    logRank("token of rank " + std::to_string(intruder) + " differs", r,
            secondsSince(job.started(), res.exitTime), res);
    EXPECT_NE(res.exitCode, 0) << "rank " << r << " completed a job with a stranger\n" << report;
    EXPECT_FALSE(res.code.empty()) << "rank " << r << " printed no GFLOW_ERROR\n" << report;
    if (res.code == "unauthorized") {
      ++unauthorized;
      EXPECT_EQ(res.exitCode, exitCodeFor(gflow::ErrorCode::kUnauthorized)) << report;
    }
  }
  EXPECT_GE(unauthorized, 1) << report;
  if (intruder != 0) {
    // Rank 0's store refuses the intruder.
    EXPECT_EQ(job.result(intruder).code, "unauthorized") << report;
  } else {
    // The store itself has the other token: every other rank is refused.
    for (int r = 1; r < n; ++r) EXPECT_EQ(job.result(r).code, "unauthorized") << report;
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultToken, ::testing::Values(RankCase{3, 2}, RankCase{3, 0}), caseName);

// ---- 4. garbage to the store and data ports ---------------------------------

TEST(FaultGarbage, StoreSurvivesGarbageDuringSetupAndWhileJobRuns) {
  // Rank 2 starts late so the first batch hits the store mid-setup.
  Job job(3, [](int r) {
    std::vector<std::string> a = {"loop", "40", "262144", "25"};
    if (r == 2) a.insert(a.begin(), {"sleep-before-init", "1000"});
    return a;
  });
  job.start();
  std::vector<gflow::net::Socket> keep;
  attackStore(job.port(), &keep, 1);  // connectRaw retries until rank 0 listens
  ASSERT_TRUE(job.waitProgress(2, seconds(8))) << job.report();
  attackStore(job.port(), &keep, 2);
  {
    gflow::TcpStore client(clientOptions(job));
    EXPECT_EQ(client.getString("gflow/created/0", seconds(2)), "1");
  }
  ASSERT_TRUE(job.waitExit(seconds(10))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(job.result(r).exitCode, 0) << "rank " << r << "\n" << report;
    EXPECT_TRUE(job.result(r).printed("GFLOW_DONE")) << "rank " << r << "\n" << report;
  }
}

// The data listener of rank `target` as published in the store.
std::pair<std::string, uint16_t> dataAddress(const Job& job, int target) {
  gflow::TcpStore client(clientOptions(job));
  std::string addr = client.getString("gflow/w1/tcp/addr/" + std::to_string(target), seconds(5));
  return gflow::net::parseHostPort(addr, "data address");
}

// Strangers that talk garbage and go away: the setup must not notice.
void attackDataPort(const std::pair<std::string, uint16_t>& at, uint32_t seed) {
  namespace tcp = gflow::transport::tcp;
  {
    auto s = connectRaw(at.first, at.second);
    sendBytes(s.fd(), randomBytes(4096, seed));
  }
  {
    auto s = connectRaw(at.first, at.second);
    sendBytes(s.fd(), std::vector<uint8_t>(64, 0xff));
  }
  {  // knows the token, but a bad hello
    auto s = connectRaw(at.first, at.second);
    if (authenticateAs(s.fd(), "gflow-data/v1")) {
      sendBytes(s.fd(), randomBytes(sizeof(tcp::Hello), seed + 1));
    }
  }
  {  // knows the token and the communicator, claims a rank outside the world
    auto s = connectRaw(at.first, at.second);
    if (authenticateAs(s.fd(), "gflow-data/v1")) {
      const std::string prefix = "gflow/w1/";  // as tcp_connect.cc derives the id
      gflow::auth::Digest d = gflow::auth::sha256(prefix.data(), prefix.size());
      uint64_t commId;
      std::memcpy(&commId, d.data(), sizeof(commId));
      tcp::Hello h{tcp::kHelloMagic, tcp::kProtocolVersion, 7, 8, 0, 1, commId};
      std::vector<uint8_t> b(sizeof(h));
      std::memcpy(b.data(), &h, sizeof(h));
      sendBytes(s.fd(), b);
      uint8_t ok = 1;
      EXPECT_EQ(::recv(s.fd(), &ok, 1, MSG_WAITALL), 1);
      EXPECT_EQ(ok, 0) << "a hello from rank 7 of 8 was accepted";
    }
  }
}

TEST(FaultGarbage, DataListenersSurviveGarbageDuringSetup) {
  Job job(3, [](int r) {
    std::vector<std::string> a = {"loop", "5", "65536"};
    if (r == 2) a.insert(a.begin(), {"sleep-before-init", "2000"});
    return a;
  });
  job.start();
  attackDataPort(dataAddress(job, 0), 10);
  attackDataPort(dataAddress(job, 1), 20);
  EXPECT_LT(secondsSince(job.started(), Clock::now()), 2.0)
      << "precondition: the garbage was meant to arrive before rank 2 connects";
  ASSERT_TRUE(job.waitExit(seconds(10))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(job.result(r).exitCode, 0) << "rank " << r << "\n" << report;
    EXPECT_TRUE(job.result(r).printed("GFLOW_DONE")) << "rank " << r << "\n" << report;
  }
}

// A stranger that connects to a data port and says nothing (a port scanner,
// a health check) must not hold up the ranks that are still to connect.
TEST(FaultGarbage, SilentStrangerOnDataPortDoesNotStallSetup) {
  Job job(3, [](int r) {
    std::vector<std::string> a = {"loop", "3", "65536"};
    if (r == 2) a.insert(a.begin(), {"sleep-before-init", "1500"});
    return a;
  });
  job.setEnv("GFLOW_TIMEOUT", "6s");
  job.start();
  auto at = dataAddress(job, 0);
  gflow::net::Socket silent = connectRaw(at.first, at.second);
  ASSERT_LT(secondsSince(job.started(), Clock::now()), 1.5)
      << "precondition: the stranger was meant to connect before rank 2";
  const bool finished = job.waitExit(seconds(8));
  const std::string report = job.report();
  ASSERT_TRUE(finished) << report;
  for (int r = 0; r < 3; ++r) {
    const RankResult& res = job.result(r);
    logRank("silent stranger", r, secondsSince(job.started(), res.exitTime), res);
    EXPECT_EQ(res.exitCode, 0) << "rank " << r << "\n" << report;
  }
}

// ---- 5. ranks calling different collectives ---------------------------------

struct MismatchCase {
  int size;
  const char* kind;  // fault_worker's mismatch kind
};

void PrintTo(const MismatchCase& c, std::ostream* os) {
  *os << c.size << " ranks, " << c.kind;
}

class FaultMismatch : public ::testing::TestWithParam<MismatchCase> {};

// Which rank notices first, and whether the others are still sending to it
// when it leaves, varies from run to run, so each case runs several jobs.
TEST_P(FaultMismatch, EveryRankRaisesMismatchNamingTheRanks) {
  const int n = GetParam().size;
  for (int attempt = 0; attempt < 8 && !HasFailure(); ++attempt) {
    Job job(n, sameArgs({"mismatch", GetParam().kind, "1048576"}));
    job.start();
    ASSERT_TRUE(job.waitExit(seconds(5))) << job.report();
    const std::string report = "attempt " + std::to_string(attempt) + ": " + job.report();
    for (int r = 0; r < n; ++r) {
      const RankResult& res = job.result(r);
      if (attempt == 0) {
        logRank("mismatch " + std::string(GetParam().kind), r,
                secondsSince(job.started(), res.exitTime), res);
      }
      EXPECT_EQ(res.exitCode, exitCodeFor(gflow::ErrorCode::kMismatch)) << "rank " << r << "\n"
                                                                        << report;
      EXPECT_EQ(res.code, "mismatch") << "rank " << r << ": " << res.what;
      // Rank 1 disagrees with everyone else: both sides are named.
      bool namesOther = false;
      for (int o = 0; o < n; ++o) namesOther |= (o != 1 && res.names(o));
      EXPECT_TRUE(res.names(1) && namesOther)
          << "rank " << r << "'s message does not name rank 1 and one of the others: " << res.what;
    }
  }
}

std::string mismatchName(const ::testing::TestParamInfo<MismatchCase>& info) {
  return "n" + std::to_string(info.param.size) + "_" + info.param.kind;
}

INSTANTIATE_TEST_SUITE_P(, FaultMismatch,
                         ::testing::Values(MismatchCase{3, "op"}, MismatchCase{4, "op"},
                                           MismatchCase{3, "count"}),
                         mismatchName);

// A disagreement at op #3 must fail op #3 everywhere. A rank still finishing
// op #2 (which every rank called alike) when a peer's report of #3 arrives
// must not raise for #2: the others returned from #2 successfully. The race
// needs a slow rank, so the job is repeated.
TEST(FaultMismatchSeq, EveryRankFailsTheDisagreeingOp) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    Job job(3, sameArgs({"mismatch", "count", "1048576"}));
    job.start();
    ASSERT_TRUE(job.waitExit(seconds(5))) << job.report();
    const std::string report = job.report();
    for (int r = 0; r < 3; ++r) {
      const RankResult& res = job.result(r);
      // #1 is create()'s internal allgather, #2 the common allreduce, #3 the odd one.
      ASSERT_EQ(res.seq, 3) << "attempt " << attempt << ": rank " << r
                            << " raised for another op than the one the ranks disagree on ("
                            << res.printed("GFLOW_PROGRESS") << " progress)\n"
                            << report;
    }
  }
}

// ---- 6. a rank that exits right after the last op ---------------------------

class FaultExit : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultExit, RankLeavingAfterLastOpDoesNotFailTheOthers) {
  const int n = GetParam().size, leaver = GetParam().victim;
  Job job(n, [leaver](int r) {
    std::vector<std::string> a = {"loop", "5", k4MiB};
    if (r != leaver) a.insert(a.begin(), {"linger", "1000"});
    return a;
  });
  job.start();
  ASSERT_TRUE(job.waitExit(seconds(12))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(job.result(r).exitCode, 0) << "rank " << r << "\n" << report;
    EXPECT_TRUE(job.result(r).printed("GFLOW_DONE")) << "rank " << r << "\n" << report;
    if (r != leaver) {
      EXPECT_TRUE(job.result(r).printed("GFLOW_LINGERED")) << "rank " << r << "\n" << report;
    }
  }
}

TEST(FaultExitStriped, LeavingWithSeveralSocketsPerPeerFailsNobody) {
  // With several connections per peer, EOF on one of them while the last
  // message still arrives on another must not count as a lost peer.
  for (int leaver : {0, 2}) {
    Job job(3, [leaver](int r) {
      std::vector<std::string> a = {"loop", "20", "65536"};
      if (r != leaver) a.insert(a.begin(), {"linger", "500"});
      return a;
    });
    job.setEnv("GFLOW_SOCKETS_PER_PEER", "3");
    job.setEnv("GFLOW_STRIPE_MIN", "4096");
    job.start();
    ASSERT_TRUE(job.waitExit(seconds(12))) << job.report();
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(job.result(r).exitCode, 0) << "leaver " << leaver << " rank " << r << "\n"
                                           << job.report();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultExit,
                         ::testing::Values(RankCase{3, 2}, RankCase{3, 0}, RankCase{4, 1}),
                         caseName);

}  // namespace
