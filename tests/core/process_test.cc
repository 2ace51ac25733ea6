// The process-wide settings of gflow/process.h: the log level and the CUDA
// component's path.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "common/logging.h"
#include "cuda/loader.h"
#include "gflow/gflow.h"

namespace gflow {
namespace {

TEST(ProcessSettings, SetLogLevelReplacesTheLevelAtOnce) {
  const LogLevel was = logLevel();
  setLogLevel(LogLevel::kTrace);
  EXPECT_EQ(logLevel(), LogLevel::kTrace);
  EXPECT_TRUE(log::enabled(log::Level::TRACE));
  setLogLevel(LogLevel::kError);
  EXPECT_FALSE(log::enabled(log::Level::WARN));
  EXPECT_TRUE(log::enabled(log::Level::ERROR));
  setLogLevel(was);
  EXPECT_EQ(logLevel(), was);
}

// In a fresh child (this process may have loaded the component already):
// the path set before the load is the one tried.
TEST(ProcessSettings, CudaComponentPathIsTheOneLoaded) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string bogus = "/nonexistent/gflow-test/libgflow_cuda.so.0";
    try {
      setCudaComponent(bogus);
    } catch (const Error&) {
      _exit(77);  // the parent had loaded it before the fork
    }
    cuda::installRuntimeForTesting(nullptr);
    std::string why;
    const bool loaded = cuda::loadRuntime(&why) != nullptr;
    _exit(!loaded && why.find(bogus) != std::string::npos ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "the component was loaded before the fork";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ProcessSettings, CudaComponentAfterTheLoadIsAnError) {
  std::string why;
  (void)cuda::componentSymbol("gflow_cuda_runtime");  // the load happens (or fails) once
  try {
    setCudaComponent("/elsewhere/libgflow_cuda.so.0");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("already loaded"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gflow
