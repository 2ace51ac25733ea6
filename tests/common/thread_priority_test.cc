// common/thread_priority.h, and the progress thread's priority
// (Options::progress.priority / GFLOW_PROGRESS_PRIORITY).
#include "common/thread_priority.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"

namespace gflow {
namespace {

TEST(ThreadPriority, NiceAboveCountsDownFromTheStarterAndClamps) {
  EXPECT_EQ(thread_priority::niceAbove(0, 10), -10);
  EXPECT_EQ(thread_priority::niceAbove(5, -3), 8);
  EXPECT_EQ(thread_priority::niceAbove(0, 0), 0);
  EXPECT_EQ(thread_priority::niceAbove(5, 39), -20);
  EXPECT_EQ(thread_priority::niceAbove(-10, -39), 19);
}

TEST(ThreadPriority, AThreadLowersItsOwnPriorityOnly) {
  const int mine = thread_priority::currentNice();
  int seen = -100;
  std::string err = "not run";
  std::thread t([&] {
    err = thread_priority::setCurrentNice(thread_priority::niceAbove(mine, -3));
    seen = thread_priority::currentNice();
  });
  t.join();
  EXPECT_EQ(err, "");
  EXPECT_EQ(seen, thread_priority::niceAbove(mine, -3));
  EXPECT_EQ(thread_priority::currentNice(), mine);  // per thread, not per process
}

// In a child: without CAP_SYS_NICE (as root, it gives up root first) and
// with RLIMIT_NICE 0, a raise fails and says what would allow it. Exits 0
// when it does.
void giveUpNicePermission() {
  const rlimit none{0, 0};
  if (setrlimit(RLIMIT_NICE, &none) != 0) _exit(2);
  if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
}

[[noreturn]] void raiseWithoutPermission() {
  giveUpNicePermission();
  const int start = thread_priority::currentNice();
  const std::string err = thread_priority::setCurrentNice(start - 5);
  const bool named =
      err.find("CAP_SYS_NICE") != std::string::npos && err.find("ulimit -e") != std::string::npos;
  _exit(named && thread_priority::currentNice() == start ? 0 : 1);
}

TEST(ThreadPriority, ARaiseWithoutPermissionSaysWhatItNeeds) {
  EXPECT_EXIT(raiseWithoutPermission(), ::testing::ExitedWithCode(0), "");
}

// In a child without the permission: two ranks' progress threads and a
// split's both ask for a raise; the process warns once. Exits 10 + the
// number of warnings when that is not 1.
[[noreturn]] void refusedRaisesWarnOnce() {
  giveUpNicePermission();
  // Into a file: the death test already captures stderr.
  FILE* log = std::tmpfile();
  if (!log || dup2(fileno(log), STDERR_FILENO) < 0) _exit(4);
  Options o;
  o.progress.priority = 5;
  testing::runRanks(
      2,
      [](Communicator& c) {
        std::vector<float> v(100, 1.0f);
        c.allreduceAsync(tensor(v.data(), v.size())).wait();
        std::shared_ptr<Communicator> half = c.split(0, c.rank());
        half->allreduceAsync(tensor(v.data(), v.size())).wait();
      },
      o);
  std::string err(static_cast<size_t>(std::ftell(log)), '\0');
  std::rewind(log);
  if (std::fread(err.data(), 1, err.size(), log) != err.size()) _exit(5);
  int warnings = 0;
  for (size_t at = err.find("progress thread stays at nice"); at != std::string::npos;
       at = err.find("progress thread stays at nice", at + 1)) {
    ++warnings;
  }
  _exit(warnings == 1 ? 0 : 10 + warnings);
}

TEST(ThreadPriority, ARefusedRaiseWarnsOncePerProcess) {
  EXPECT_EXIT(refusedRaisesWarnOnce(), ::testing::ExitedWithCode(0), "");
}

// The nice values of this process's threads named gflow-progress.
std::vector<int> progressThreadNices() {
  std::vector<int> nices;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "gflow-progress") continue;
    std::ifstream statFile(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(statFile)), std::istreambuf_iterator<char>());
    // After "pid (comm) ": state is field 3, nice field 19.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i) {
    }
    nices.push_back(std::stoi(field));
  }
  return nices;
}

// Two ranks (threads) run an async allreduce, which starts each one's
// progress thread; both must be at nice `want`.
void expectProgressThreadsAt(int want, const Options& o) {
  testing::runRanks(
      2,
      [&](Communicator& c) {
        std::vector<float> v(1000, 1.0f);
        Work w = c.allreduceAsync(tensor(v.data(), v.size()));
        w.wait();
        EXPECT_EQ(v[999], 2.0f);
        c.barrier();
        if (c.rank() == 0) {
          int at = 0;
          for (int n : progressThreadNices()) at += n == want;
          EXPECT_GE(at, 2) << "progress threads at nice " << want;
        }
        c.barrier();
      },
      o);
}

// Lowered here: raising needs a privilege the test may lack.
TEST(ThreadPriority, TheProgressThreadRunsTheAskedLevelsFromItsStarter) {
  Options o;
  o.progress.priority = -4;
  expectProgressThreadsAt(thread_priority::niceAbove(thread_priority::currentNice(), -4), o);
}

TEST(ThreadPriority, TheEnvironmentSetsTheLevelWhenOptionsDoNot) {
  testing::ScopedEnv env("GFLOW_PROGRESS_PRIORITY", "-2");
  expectProgressThreadsAt(thread_priority::niceAbove(thread_priority::currentNice(), -2), {});
}

// The one signed range among the parameters: both ends hold, past them fails.
TEST(ThreadPriority, TheVariableTakesMinus39To39) {
  for (const char* ok : {"-39", "-1", "0", "39"}) {
    testing::ScopedEnv env("GFLOW_PROGRESS_PRIORITY", ok);
    EXPECT_NO_THROW(params::validateAll()) << ok;
  }
  for (const char* bad : {"-40", "40", "-9223372036854775808", "-99999999999999999999", "ten"}) {
    testing::ScopedEnv env("GFLOW_PROGRESS_PRIORITY", bad);
    try {
      params::validateAll();
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("GFLOW_PROGRESS_PRIORITY"), std::string::npos) << bad;
    }
  }
}

}  // namespace
}  // namespace gflow
