// `gflowrun --topology` prints what Topology::discover() found and exits 0.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

#ifdef GFLOW_TEST_GFLOWRUN

// Runs `gflowrun args` through the shell; returns its exit code and stdout.
int runGflowrun(const std::string& args, std::string* out) {
  const std::string cmd = std::string("'") + GFLOW_TEST_GFLOWRUN + "' " + args + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out->append(buf, n);
  int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(TopologyGflowrun, PrintsTheTopologyAndExits0) {
  std::string out;
  ASSERT_EQ(runGflowrun("--topology", &out), 0) << out;
  EXPECT_NE(out.find("NUMA nodes:"), std::string::npos) << out;
  EXPECT_NE(out.find("Cores:"), std::string::npos) << out;
  EXPECT_NE(out.find("Progress threads (GFLOW_PIN="), std::string::npos) << out;
}

TEST(TopologyGflowrun, HelpMentionsTopology) {
  std::string out;
  ASSERT_EQ(runGflowrun("--help", &out), 0);
  EXPECT_NE(out.find("--topology"), std::string::npos) << out;
}

TEST(TopologyGflowrun, TopologyTakesNoValue) {
  std::string out;
  EXPECT_EQ(runGflowrun("--topology=yes", &out), 2);
}

#endif  // GFLOW_TEST_GFLOWRUN

}  // namespace
