// Helpers of the process-based fault tests: a Job is a set of fault_worker
// rank processes (tests/faults/fault_worker.cc) started with fork/exec, their
// identity in GFLOW_* variables, stdout/stderr in files (so nothing has to be
// drained while waiting), reaped with their exit times, and a hard deadline
// after which every process is SIGKILLed and the test fails instead of
// hanging. Children also die with the test binary (PDEATHSIG).
#pragma once

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

extern char** environ;

namespace gflow::faulttest {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

inline const char* const kWorker = GFLOW_TEST_BINARY_DIR "/tests/faults/fault_worker";
inline const char* const kToken = "fault-test-token";
inline constexpr const char* k4MiB = "4194304";

// fault_worker's exit status for a gflow::Error of `code`.
inline int exitCodeFor(gflow::ErrorCode code) {
  return 10 + static_cast<int>(code);
}

inline double secondsSince(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A port that was free a moment ago (for rank 0's store), drawn below the
// kernel's ephemeral range so that no outgoing connection of a parallel test
// can be handed it before rank 0 binds it.
inline uint16_t freePort() {
  int lo = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> lo;
  const int bottom = lo > 21024 ? 20000 : 1024, top = lo > 21024 ? lo - 1 : 65535;
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = static_cast<uint16_t>(bottom + rng() % (top - bottom + 1));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    const bool free = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (fd >= 0) ::close(fd);
    if (free) return port;
  }
  ADD_FAILURE() << "cannot find a free port below " << lo;
  return 0;
}

// Launcher variables a developer's shell may carry that would change the
// workers' identity or tuning; the workers get a clean copy of the rest.
inline bool inheritedVariable(const std::string& kv) {
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

inline Job::Args sameArgs(std::vector<std::string> args) {
  return [args](int) { return args; };
}

// One line per rank in the test log: when it exited (seconds after `event`)
// and the error it reported.
inline void logRank(const std::string& event, int rank, double seconds, const RankResult& res) {
  std::string said = res.code.empty() ? "exit " + std::to_string(res.exitCode) : res.what;
  if (said.size() > 400) said = said.substr(0, 400) + "...";
  std::printf("[ timing   ] %s: rank %d exited after %.3f s: %s\n", event.c_str(), rank, seconds,
              said.c_str());
}

}  // namespace gflow::faulttest
