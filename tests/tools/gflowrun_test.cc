// End-to-end tests of the gflowrun launcher: it is run as a subprocess on
// small `sh -c` rank programs, and its exit status and output are checked.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gflow/error.h"
#include "gflow/store.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

// One gflowrun process with stdout/stderr captured in files (files, not
// pipes, so a test never has to drain output while it waits).
class Launch {
 public:
  // `prefixArgv` runs before gflowrun (e.g. {"env", "-u", "X"}).
  explicit Launch(const std::vector<std::string>& args,
                  const std::vector<std::string>& prefixArgv = {}) {
    char tmpl[] = "/tmp/gflowrun_test.XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    std::vector<std::string> all = prefixArgv;
    all.push_back(GFLOW_TEST_GFLOWRUN);
    all.insert(all.end(), args.begin(), args.end());
    // Everything is prepared before fork(): the child only makes syscalls.
    std::vector<char*> argv;
    for (std::string& s : all) argv.push_back(s.data());
    argv.push_back(nullptr);
    int out = ::open((dir_ + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err = ::open((dir_ + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::execvp(argv[0], argv.data());
      ::_exit(126);
    }
    ::close(out);
    ::close(err);
    started_ = Clock::now();
  }

  ~Launch() {
    if (!done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::remove((dir_ + "/out").c_str());
    std::remove((dir_ + "/err").c_str());
    ::rmdir(dir_.c_str());
  }

  // Waits up to `limit`; returns the exit code (128+sig when killed by a
  // signal), or -1 on timeout (gflowrun is then killed).
  int wait(std::chrono::seconds limit = std::chrono::seconds(30)) {
    while (Clock::now() - started_ < limit) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        done_ = true;
        elapsed_ = Clock::now() - started_;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  // Polls stdout until `count` lines contain `needle`.
  bool waitForLines(const std::string& needle, size_t count) {
    auto until = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < until) {
      auto ls = lines(out());
      if (static_cast<size_t>(std::count_if(ls.begin(), ls.end(), [&](const std::string& l) {
            return l.find(needle) != std::string::npos;
          })) >= count) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  pid_t pid() const { return pid_; }
  double seconds() const { return std::chrono::duration<double>(elapsed_).count(); }
  std::string out() const { return readFile(dir_ + "/out"); }
  std::string err() const { return readFile(dir_ + "/err"); }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  bool done_ = false;
  Clock::time_point started_;
  Clock::duration elapsed_{};
};

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Gflowrun, SetsIdentityPerRank) {
  Launch run(
      {"-n", "3", "--", "sh", "-c",
       "echo $GFLOW_RANK $GFLOW_WORLD_SIZE $GFLOW_LOCAL_RANK $GFLOW_LOCAL_SIZE $GFLOW_ROOT"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  auto ls = sorted(lines(run.out()));
  ASSERT_EQ(ls.size(), 3u) << run.out();
  std::string root;
  for (int r = 0; r < 3; ++r) {
    std::istringstream in(ls[r]);
    std::string prefix, addr;
    int rank, size, localRank, localSize;
    in >> prefix >> rank >> size >> localRank >> localSize >> addr;
    EXPECT_EQ(prefix, "[" + std::to_string(r) + "]");
    EXPECT_EQ(rank, r);
    EXPECT_EQ(size, 3);
    EXPECT_EQ(localRank, r);
    EXPECT_EQ(localSize, 3);
    EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
    if (r == 0) root = addr;
    EXPECT_EQ(addr, root) << "every rank must see the same root";
  }
}

TEST(Gflowrun, PrefixesStdoutAndStderrSeparately) {
  Launch run({"-n", "2", "sh", "-c", "echo out; echo err >&2; printf partial"});
  ASSERT_EQ(run.wait(), 0);
  EXPECT_EQ(sorted(lines(run.out())),
            (std::vector<std::string>{"[0] out", "[0] partial", "[1] out", "[1] partial"}));
  EXPECT_EQ(sorted(lines(run.err())), (std::vector<std::string>{"[0] err", "[1] err"}));
}

TEST(Gflowrun, NoPrefix) {
  Launch run({"-n", "2", "--no-prefix", "sh", "-c", "echo plain"});
  ASSERT_EQ(run.wait(), 0);
  EXPECT_EQ(run.out(), "plain\nplain\n");
}

TEST(Gflowrun, EnvOptionReachesRanks) {
  Launch run({"-n", "2", "--env", "GFLOW_TEST_X=42", "--env", "GFLOW_DEBUG=INFO", "sh", "-c",
              "echo $GFLOW_TEST_X $GFLOW_DEBUG"});
  ASSERT_EQ(run.wait(), 0);
  EXPECT_EQ(sorted(lines(run.out())), (std::vector<std::string>{"[0] 42 INFO", "[1] 42 INFO"}));
}

// gflowrun sets GFLOW_STRAGGLER_AT_EXIT=1 (unless the user set it): rank 0
// prints the run's straggler summary when its communicator ends.
TEST(Gflowrun, RankZeroPrintsTheStragglerSummaryAtExit) {
  const std::string worker = std::string(GFLOW_TEST_BINARY_DIR) + "/tests/faults/fault_worker";
  Launch run({"-n", "2", worker, "straggle", "5", "4096", "1"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_NE(run.err().find("[0] gflow straggler summary (2 ranks): rank 1 was last in"),
            std::string::npos)
      << run.err();
  EXPECT_EQ(run.err().find("[1] gflow straggler summary"), std::string::npos) << run.err();
  Launch off(
      {"-n", "2", "--env", "GFLOW_STRAGGLER_AT_EXIT=0", worker, "straggle", "2", "4096", "1"});
  ASSERT_EQ(off.wait(), 0) << off.err();
  EXPECT_EQ(off.err().find("straggler summary"), std::string::npos) << off.err();
}

TEST(Gflowrun, FailingRankSetsExitCodeAndStopsOthersQuickly) {
  // Rank 1 fails at once; its siblings would sleep for a minute.
  Launch run({"-n", "3", "sh", "-c", "if [ $GFLOW_RANK = 1 ]; then exit 3; fi; sleep 60"});
  EXPECT_EQ(run.wait(), 3);
  EXPECT_LT(run.seconds(), 10.0);
  EXPECT_NE(run.err().find("rank 1 exited with status 3"), std::string::npos) << run.err();
}

TEST(Gflowrun, SiblingIgnoringSigtermIsKilledAfterGrace) {
  Launch run({"-n", "2", "--grace", "1", "sh", "-c",
              "if [ $GFLOW_RANK = 0 ]; then sleep 0.2; exit 5; fi; trap '' TERM; sleep 60"});
  EXPECT_EQ(run.wait(), 5);
  EXPECT_GE(run.seconds(), 1.0);
  EXPECT_LT(run.seconds(), 10.0);
}

TEST(Gflowrun, RankKilledBySignalGives128PlusSignal) {
  Launch run({"-n", "2", "sh", "-c", "if [ $GFLOW_RANK = 1 ]; then kill -KILL $$; fi; sleep 60"});
  EXPECT_EQ(run.wait(), 128 + SIGKILL);
  EXPECT_LT(run.seconds(), 10.0);
}

TEST(Gflowrun, ForwardsSigtermToRanks) {
  Launch run(
      {"-n", "3", "sh", "-c", "trap 'echo got-term; exit 0' TERM; echo ready; sleep 60 & wait"});
  ASSERT_TRUE(run.waitForLines("ready", 3)) << run.out();
  ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
  EXPECT_EQ(run.wait(), 128 + SIGTERM);
  EXPECT_LT(run.seconds(), 10.0);
  auto ls = lines(run.out());
  for (int r = 0; r < 3; ++r) {
    std::string want = "[" + std::to_string(r) + "] got-term";
    EXPECT_NE(std::find(ls.begin(), ls.end(), want), ls.end()) << run.out();
  }
}

TEST(Gflowrun, TimeoutKillsJobWith124) {
  Launch run({"-n", "2", "--timeout", "1", "sleep", "60"});
  EXPECT_EQ(run.wait(), 124);
  EXPECT_LT(run.seconds(), 10.0);
}

TEST(Gflowrun, GeneratesOneTokenPerJob) {
  auto tokens = [] {
    Launch run({"-n", "2", "sh", "-c", "echo $GFLOW_JOB_TOKEN"}, {"env", "-u", "GFLOW_JOB_TOKEN"});
    EXPECT_EQ(run.wait(), 0);
    std::vector<std::string> t;
    for (const std::string& l : lines(run.out())) t.push_back(l.substr(l.find(' ') + 1));
    return t;
  };
  auto first = tokens();
  auto second = tokens();
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(first[0].size(), 64u);
  EXPECT_EQ(first[0].find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(first[0], first[1]) << "ranks of one job share the token";
  EXPECT_EQ(second[0], second[1]);
  EXPECT_NE(first[0], second[0]) << "each job gets a fresh token";
}

TEST(Gflowrun, KeepsExistingToken) {
  Launch run({"-n", "2", "sh", "-c", "echo $GFLOW_JOB_TOKEN"}, {"env", "GFLOW_JOB_TOKEN=s3cret"});
  ASSERT_EQ(run.wait(), 0);
  EXPECT_EQ(sorted(lines(run.out())), (std::vector<std::string>{"[0] s3cret", "[1] s3cret"}));
}

// A file holding `text`, with `mode`; removed with the object.
class TempFile {
 public:
  TempFile(const std::string& text, mode_t mode) {
    char tmpl[] = "/tmp/gflowrun_token.XXXXXX";
    const int fd = ::mkstemp(tmpl);
    path_ = tmpl;
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::fchmod(fd, mode);
    ::close(fd);
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Gflowrun, TokenFileReachesRanks) {
  TempFile f("fr0m-a-file\nsecond line ignored\n", 0600);
  Launch run({"-n", "2", "--token-file", f.path(), "sh", "-c", "echo $GFLOW_JOB_TOKEN"},
             {"env", "GFLOW_JOB_TOKEN=exported"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_EQ(sorted(lines(run.out())),
            (std::vector<std::string>{"[0] fr0m-a-file", "[1] fr0m-a-file"}));
}

// A token in argv is readable by every local user (/proc/<pid>/cmdline):
// refused, as is a token file others can read.
TEST(Gflowrun, RefusesATokenOnTheCommandLineOrInAPublicFile) {
  Launch inArgv({"-n", "2", "--env", "GFLOW_JOB_TOKEN=s3cret", "true"});
  EXPECT_EQ(inArgv.wait(), 2);
  EXPECT_NE(inArgv.err().find("--token-file"), std::string::npos) << inArgv.err();
  Launch inline_({"-n", "2", "--env=GFLOW_JOB_TOKEN=s3cret", "true"});
  EXPECT_EQ(inline_.wait(), 2);
  TempFile open("s3cret\n", 0644);
  Launch publicFile({"-n", "2", "--token-file", open.path(), "true"});
  EXPECT_EQ(publicFile.wait(), 2);
  EXPECT_NE(publicFile.err().find("chmod 600"), std::string::npos) << publicFile.err();
  TempFile empty("\n", 0600);
  Launch emptyFile({"-n", "2", "--token-file", empty.path(), "true"});
  EXPECT_EQ(emptyFile.wait(), 2);
  Launch missing({"-n", "2", "--token-file", "/nonexistent/token", "true"});
  EXPECT_EQ(missing.wait(), 2);
}

TEST(Gflowrun, HonoursPort) {
  Launch run({"-n", "1", "--port", "45678", "sh", "-c", "echo $GFLOW_ROOT"});
  ASSERT_EQ(run.wait(), 0);
  EXPECT_EQ(run.out(), "[0] 127.0.0.1:45678\n");
}

// The ranks run with the open-file limit raised to the hard limit, and a
// job whose output pipes alone would pass the hard limit is refused up
// front, saying how many descriptors it needs.
TEST(Gflowrun, RaisesTheOpenFileLimitAndSaysWhenTheHardOneIsTooSmall) {
  Launch ok({"-n", "2", "--", "sh", "-c", "ulimit -n"}, {"prlimit", "--nofile=64:2048"});
  ASSERT_EQ(ok.wait(), 0) << ok.err();
  EXPECT_NE(ok.out().find("[0] 2048"), std::string::npos) << ok.out();
  EXPECT_NE(ok.out().find("[1] 2048"), std::string::npos) << ok.out();
  Launch tooMany({"-n", "100", "--", "true"}, {"prlimit", "--nofile=64:64"});
  EXPECT_EQ(tooMany.wait(), 1);
  EXPECT_NE(tooMany.err().find("gflowrun with 100 ranks needs"), std::string::npos)
      << tooMany.err();
  EXPECT_NE(tooMany.err().find("ulimit -n"), std::string::npos) << tooMany.err();
}

TEST(Gflowrun, MissingProgramExits127) {
  Launch run({"-n", "2", "/nonexistent/program"});
  EXPECT_EQ(run.wait(), 127);
  EXPECT_NE(run.err().find("cannot execute"), std::string::npos) << run.err();
}

TEST(Gflowrun, BadUsageExits2) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {},                              // nothing at all
           {"true"},                        // no -n
           {"-n", "2"},                     // no program
           {"-n", "0", "true"},             // bad count
           {"-n", "2", "--bogus", "true"},  // unknown option
           {"-n", "2", "--env", "NOEQUALS", "true"},
           {"-n", "2", "--env", "GFLOW_RANK=1", "true"},
           {"-n", "2", "--timeout", "soon", "true"},
           {"-n", "2", "--root", "nohostport", "true"},
           {"--serve-store", "-n", "2", "true"},  // runs no ranks
       }) {
    Launch run(args);
    EXPECT_EQ(run.wait(), 2) << ::testing::PrintToString(args);
    EXPECT_NE(run.err().find("gflowrun: "), std::string::npos);
  }
}

// --serve-store: a store that needs the job token, at the address it
// prints, until SIGTERM (docs/elastic.md, under mpirun or srun).
TEST(Gflowrun, ServeStoreServesTheJobStoreUntilSigterm) {
  Launch run({"--serve-store"}, {"env", "GFLOW_JOB_TOKEN=serve-store-test-token"});
  ASSERT_TRUE(run.waitForLines("127.0.0.1:", 1)) << run.out() << run.err();
  const std::string address = lines(run.out()).at(0);
  gflow::TcpStoreOptions o;
  o.host = address.substr(0, address.rfind(':'));
  o.port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  o.timeout = std::chrono::milliseconds(5000);
  o.token = "serve-store-test-token";
  gflow::TcpStore member(o);
  member.setString("k", "v");
  EXPECT_EQ(member.getString("k", std::chrono::milliseconds(1000)), "v");
  o.token = "a stranger's guess";
  EXPECT_THROW(gflow::TcpStore(o).add("k2", 1), gflow::Error);
  ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
  EXPECT_EQ(run.wait(), 0);

  Launch tokenless({"--serve-store"}, {"env", "-u", "GFLOW_JOB_TOKEN"});
  EXPECT_EQ(tokenless.wait(), 2) << "a store anyone could use";
  EXPECT_NE(tokenless.err().find("needs the job token"), std::string::npos) << tokenless.err();
}

TEST(Gflowrun, PrintConfigListsRegistry) {
  Launch run({"--print-config"}, {"env", "GFLOW_DEBUG=TRACE"});
  ASSERT_EQ(run.wait(), 0);
  std::string out = run.out();
  EXPECT_NE(out.find("GFLOW_TIMEOUT\n  default: 300s"), std::string::npos) << out;
  EXPECT_NE(out.find("GFLOW_DEBUG\n  default: WARN\n  current: TRACE"), std::string::npos) << out;
}

// A token of `n` characters that repeats no 12 of them.
std::string distinctToken(size_t n) {
  std::string t;
  for (unsigned i = 0; t.size() < n; ++i) t += "Tk" + std::to_string(i * 7919u % 100003u) + "q";
  t.resize(n);
  return t;
}

// Whether `out` holds any 12 characters of `token` in a row.
bool showsPartOf(const std::string& out, const std::string& token) {
  for (size_t i = 0; i + 12 <= token.size(); i += 4) {
    if (out.find(token.substr(i, 12)) != std::string::npos) return true;
  }
  return false;
}

// The job token is a secret (params_table.h, GFLOW_PARAM_SECRETS): no
// output of a job shows it, whether its ranks refuse it (over 4096
// characters) or run with it, logging at TRACE with straggler reports, and
// --print-config says only that it is set.
TEST(Gflowrun, NoOutputShowsTheJobToken) {
  const std::string worker = std::string(GFLOW_TEST_BINARY_DIR) + "/tests/faults/fault_worker";
  const std::string tooLong = distinctToken(5000);
  Launch refused({"-n", "2", "--env", "GFLOW_DEBUG=TRACE", worker, "straggle", "2", "4096", "1"},
                 {"env", "GFLOW_JOB_TOKEN=" + tooLong});
  EXPECT_NE(refused.wait(), 0) << refused.err();
  const std::string said = refused.out() + refused.err();
  EXPECT_NE(said.find("GFLOW_JOB_TOKEN (set, hidden) is not valid: expected at most"),
            std::string::npos)
      << said.substr(0, 2000);
  EXPECT_FALSE(showsPartOf(said, tooLong));

  const std::string token = distinctToken(200);
  Launch ran({"-n", "2", "--env", "GFLOW_DEBUG=TRACE", "--env", "GFLOW_STRAGGLER_REPORT=1ms",
              worker, "straggle", "5", "4096", "1"},
             {"env", "GFLOW_JOB_TOKEN=" + token});
  ASSERT_EQ(ran.wait(), 0) << ran.err().substr(0, 2000);
  EXPECT_NE(ran.err().find("straggler summary"), std::string::npos) << "the reports ran";
  EXPECT_FALSE(showsPartOf(ran.out() + ran.err(), token));

  Launch config({"--print-config"}, {"env", "GFLOW_JOB_TOKEN=" + token});
  ASSERT_EQ(config.wait(), 0);
  EXPECT_NE(config.out().find("GFLOW_JOB_TOKEN\n  default: (none)\n  current: (set, hidden)"),
            std::string::npos)
      << config.out();
  EXPECT_FALSE(showsPartOf(config.out() + config.err(), token));
}

}  // namespace
