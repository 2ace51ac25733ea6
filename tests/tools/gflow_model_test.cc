// gflow_model end to end under gflowrun: calibrate writes a flat model of
// the job it runs in, calibrate-local adds the shared-memory parameters
// (gflow-model 2), and predict with --per-host weighs the hierarchical
// composition beside the flat algorithms. Times are never asserted, only
// what the tool writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/cost_model.h"

namespace gflow {
namespace {

#if defined(GFLOW_TEST_GFLOWRUN) && defined(GFLOW_TEST_GFLOW_MODEL)

using ::testing::HasSubstr;

// The command's output (stdout and stderr) and exit status.
std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  *status = ::pclose(p);
  return out;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(GflowModelTool, CalibrateThenCalibrateLocalThenPredictAcrossHosts) {
  const std::string file = ::testing::TempDir() + "gflow_model_test.txt";
  std::remove(file.c_str());
  const std::string run2 = std::string(GFLOW_TEST_GFLOWRUN) + " -n 2 " + GFLOW_TEST_GFLOW_MODEL;
  int status = -1;
  std::string out =
      run("GFLOW_SHM=0 " + run2 + " calibrate " + file + " -b 4K -e 256K -n 3", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_THAT(readFile(file), HasSubstr("gflow-model 1 "));
  out = run(run2 + " calibrate-local " + file + " -b 4K -e 256K -n 3", &status);
  ASSERT_EQ(status, 0) << out;
  const backend::CostModel m = backend::CostModel::load(file);
  EXPECT_TRUE(m.params().hasLocal) << readFile(file);
  EXPECT_THAT(readFile(file), HasSubstr("gflow-model 2 "));
  out = run(std::string(GFLOW_TEST_GFLOW_MODEL) + " predict " + file +
                " --ranks 16 --per-host 4 -b 1M -e 1M",
            &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("hier_us"));
  EXPECT_THAT(out, HasSubstr("16 4 1048576 "));
  // Without shared memory, calibrate-local refuses, naming why.
  out = run("GFLOW_SHM=0 " + run2 + " calibrate-local " + file + " -b 4K -e 16K -n 2", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("shared memory"));
  std::remove(file.c_str());
}

#endif

}  // namespace
}  // namespace gflow
