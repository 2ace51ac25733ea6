#include "bootstrap/environment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "common/params.h"
#include "gflow/error.h"

namespace gflow::bootstrap {
namespace {

using testing::HasSubstr;

// Every variable resolveIdentity or hostId reads. The fixture clears them all
// before each test and restores the original environment afterwards.
const char* const kVars[] = {"GFLOW_RANK",
                             "GFLOW_WORLD_SIZE",
                             "GFLOW_LOCAL_RANK",
                             "GFLOW_LOCAL_SIZE",
                             "GFLOW_ROOT",
                             "GFLOW_JOB_TOKEN",
                             "GFLOW_HOST_ID",
                             "RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "PMIX_NAMESPACE",
                             "PMIX_RANK"};

class EnvironmentTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      if (old) saved_[v] = old;
      ::unsetenv(v);
    }
    params::resetCacheForTesting();
  }
  void TearDown() override {
    for (const char* v : kVars) {
      auto it = saved_.find(v);
      if (it != saved_.end()) {
        ::setenv(v, it->second.c_str(), 1);
      } else {
        ::unsetenv(v);
      }
    }
    params::resetCacheForTesting();
  }
  void set(const char* name, const std::string& value) {
    ::setenv(name, value.c_str(), 1);
    params::resetCacheForTesting();
  }
  // The error detail of resolveIdentity, or "" when it succeeds.
  std::string failure(const Options& o = {}) {
    try {
      resolveIdentity(o);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      return e.detail();
    }
    return "";
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(EnvironmentTest, GflowVariables) {
  set("GFLOW_RANK", "2");
  set("GFLOW_WORLD_SIZE", "4");
  set("GFLOW_LOCAL_RANK", "0");
  set("GFLOW_LOCAL_SIZE", "2");
  set("GFLOW_ROOT", "node0:29400");
  set("GFLOW_JOB_TOKEN", "tok");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rank, 2);
  EXPECT_EQ(id.size, 4);
  EXPECT_EQ(id.localRank, 0);
  EXPECT_EQ(id.localSize, 2);
  EXPECT_EQ(id.rootHost, "node0");
  EXPECT_EQ(id.rootPort, 29400);
  EXPECT_EQ(id.token, "tok");
  EXPECT_EQ(id.source, "GFLOW_*");
}

TEST_F(EnvironmentTest, Torchrun) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "3");
  set("LOCAL_WORLD_SIZE", "4");
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "29500");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rank, 3);
  EXPECT_EQ(id.size, 8);
  EXPECT_EQ(id.localRank, 3);
  EXPECT_EQ(id.localSize, 4);
  EXPECT_EQ(id.rootHost, "10.0.0.1");
  EXPECT_EQ(id.rootPort, 29501);  // MASTER_PORT + 1
  EXPECT_EQ(id.source, "torchrun");
  EXPECT_EQ(id.token, "");
}

TEST_F(EnvironmentTest, OpenMpiNeedsRootFromGflowOrMaster) {
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  std::string err = failure();
  EXPECT_THAT(err, HasSubstr("GFLOW_ROOT"));
  EXPECT_THAT(err, HasSubstr("MASTER_ADDR"));
  set("GFLOW_ROOT", "head:5000");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rank, 1);
  EXPECT_EQ(id.size, 2);
  EXPECT_EQ(id.localRank, 1);
  EXPECT_EQ(id.localSize, 2);
  EXPECT_EQ(id.rootHost, "head");
  EXPECT_EQ(id.source, "Open MPI");
}

TEST_F(EnvironmentTest, OpenMpiWithMasterAddr) {
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "1");
  set("MASTER_ADDR", "::1");
  set("MASTER_PORT", "7000");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rootHost, "::1");
  EXPECT_EQ(id.rootPort, 7001);  // MASTER_PORT + 1
}

TEST_F(EnvironmentTest, Slurm) {
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "6");
  set("SLURM_LOCALID", "1");
  set("GFLOW_ROOT", "[fd00::1]:1234");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rank, 5);
  EXPECT_EQ(id.size, 6);
  EXPECT_EQ(id.localRank, 1);
  EXPECT_EQ(id.localSize, -1);  // derived later from host ids
  EXPECT_EQ(id.rootHost, "fd00::1");
  EXPECT_EQ(id.rootPort, 1234);
  EXPECT_EQ(id.source, "Slurm");
}

TEST_F(EnvironmentTest, OptionsWinWithoutContradictionErrors) {
  set("GFLOW_RANK", "0");
  set("RANK", "3");  // would contradict GFLOW_RANK, but Options settles the rank
  set("WORLD_SIZE", "4");
  set("GFLOW_ROOT", "envhost:1");
  Options o;
  o.rank = 1;
  o.size = 2;
  o.root = "opthost:2";
  o.token = "opt-token";
  set("GFLOW_JOB_TOKEN", "env-token");
  Identity id = resolveIdentity(o);
  EXPECT_EQ(id.rank, 1);
  EXPECT_EQ(id.size, 2);
  EXPECT_EQ(id.rootHost, "opthost");
  EXPECT_EQ(id.rootPort, 2);
  EXPECT_EQ(id.token, "opt-token");
  EXPECT_EQ(id.source, "options");
}

TEST_F(EnvironmentTest, OptionsStoreNeedsNoRoot) {
  Options o;
  o.rank = 0;
  o.size = 1;
  o.store = createHashStore();
  set("GFLOW_JOB_TOKEN", "env-token");
  Identity id = resolveIdentity(o);
  EXPECT_EQ(id.rootHost, "");
  EXPECT_EQ(id.rootPort, 0);
  EXPECT_EQ(id.token, "env-token");
  EXPECT_EQ(id.localRank, -1);
}

TEST_F(EnvironmentTest, OptionsFillWhatEnvironmentLacks) {
  set("GFLOW_WORLD_SIZE", "3");
  Options o;
  o.rank = 2;
  o.store = createHashStore();
  Identity id = resolveIdentity(o);
  EXPECT_EQ(id.rank, 2);
  EXPECT_EQ(id.size, 3);
}

TEST_F(EnvironmentTest, NothingSetSaysWhatToSet) {
  std::string err = failure();
  EXPECT_THAT(err, HasSubstr("GFLOW_RANK and GFLOW_WORLD_SIZE"));
  EXPECT_THAT(err, HasSubstr("Options::rank"));
}

TEST_F(EnvironmentTest, MissingSizeNamesIt) {
  set("RANK", "0");
  set("MASTER_ADDR", "h");
  set("MASTER_PORT", "1");
  std::string err = failure();
  EXPECT_THAT(err, HasSubstr("world size"));
  EXPECT_THAT(err, HasSubstr("GFLOW_WORLD_SIZE"));
  EXPECT_THAT(err, testing::Not(HasSubstr("GFLOW_RANK")));
}

TEST_F(EnvironmentTest, ContradictionNamesBoth) {
  set("GFLOW_RANK", "1");
  set("RANK", "2");
  set("WORLD_SIZE", "4");
  std::string err = failure();
  EXPECT_THAT(err, HasSubstr("GFLOW_RANK=1"));
  EXPECT_THAT(err, HasSubstr("RANK=2"));
  set("RANK", "1");  // agreeing sources are fine
  set("GFLOW_ROOT", "h:1");
  EXPECT_EQ(resolveIdentity({}).rank, 1);
  set("GFLOW_WORLD_SIZE", "5");
  err = failure();
  EXPECT_THAT(err, HasSubstr("GFLOW_WORLD_SIZE=5"));
  EXPECT_THAT(err, HasSubstr("WORLD_SIZE=4"));
}

TEST_F(EnvironmentTest, OuterLaunchersAreShadowed) {
  // `srun torchrun ...`: SLURM_PROCID is the node's task id, not the rank.
  set("SLURM_PROCID", "1");
  set("SLURM_NTASKS", "2");
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "1");
  set("RANK", "9");
  set("WORLD_SIZE", "16");
  set("GFLOW_ROOT", "h:1");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rank, 9);
  EXPECT_EQ(id.size, 16);
  EXPECT_EQ(id.source, "torchrun");
  // Open MPI over Slurm: Open MPI wins.
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  params::resetCacheForTesting();
  id = resolveIdentity({});
  EXPECT_EQ(id.rank, 0);
  EXPECT_EQ(id.size, 1);
  EXPECT_EQ(id.source, "Open MPI");
}

TEST_F(EnvironmentTest, RangeChecks) {
  set("GFLOW_ROOT", "h:1");
  set("GFLOW_RANK", "4");
  set("GFLOW_WORLD_SIZE", "4");
  EXPECT_THAT(failure(), HasSubstr("outside [0, 4)"));
  set("GFLOW_RANK", "0");
  set("GFLOW_WORLD_SIZE", "0");
  EXPECT_THAT(failure(),
              HasSubstr("GFLOW_WORLD_SIZE='0' is not valid: expected an integer in [1,"));
  set("GFLOW_WORLD_SIZE", "4");
  set("GFLOW_LOCAL_RANK", "2");
  set("GFLOW_LOCAL_SIZE", "2");
  EXPECT_THAT(failure(), HasSubstr("local rank 2"));
  set("GFLOW_LOCAL_SIZE", "8");
  EXPECT_THAT(failure(), HasSubstr("local size"));
  Options o;
  o.rank = -5;
  EXPECT_THAT(failure(o), HasSubstr("Options::rank=-5"));
}

TEST_F(EnvironmentTest, MalformedNumbersNameTheVariable) {
  set("GFLOW_ROOT", "h:1");
  set("GFLOW_RANK", "abc");
  set("GFLOW_WORLD_SIZE", "2");
  EXPECT_THAT(failure(), HasSubstr("GFLOW_RANK='abc'"));
  ::unsetenv("GFLOW_RANK");
  set("RANK", "-1");
  EXPECT_THAT(failure(), HasSubstr("RANK='-1'"));
  set("RANK", "1");
  set("WORLD_SIZE", "4x");
  EXPECT_THAT(failure(), HasSubstr("WORLD_SIZE='4x'"));
  ::unsetenv("WORLD_SIZE");
  set("SLURM_NTASKS", "99999999999");
  set("GFLOW_WORLD_SIZE", "2");
  // Slurm is shadowed by RANK/GFLOW_*, but its malformed value is still reported.
  EXPECT_THAT(failure(), HasSubstr("SLURM_NTASKS"));
}

TEST_F(EnvironmentTest, RootProblems) {
  set("GFLOW_RANK", "0");
  set("GFLOW_WORLD_SIZE", "1");
  set("MASTER_ADDR", "host");
  EXPECT_THAT(failure(), HasSubstr("MASTER_PORT is not"));
  ::unsetenv("MASTER_ADDR");
  set("MASTER_PORT", "1");
  EXPECT_THAT(failure(), HasSubstr("MASTER_ADDR is not"));
  set("MASTER_ADDR", "host");
  set("MASTER_PORT", "99999");
  EXPECT_THAT(failure(), HasSubstr("MASTER_ADDR:MASTER_PORT"));
  set("GFLOW_ROOT", "justahost");  // GFLOW_ROOT wins over MASTER_*, and is malformed
  EXPECT_THAT(failure(), HasSubstr("GFLOW_ROOT='justahost'"));
  Options o;
  o.root = "bad";
  EXPECT_THAT(failure(o), HasSubstr("Options::root"));
}

// A process that looks PMIx-launched but whose server cannot be reached (no
// PMIX_SERVER_URI*): the launcher's own variables still serve, and when they
// give no root address the error says why PMIx could not.
TEST_F(EnvironmentTest, UnreachablePmixServerFallsBackToLauncherVariables) {
  set("PMIX_NAMESPACE", "gflow-test-no-server");
  set("PMIX_RANK", "1");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  std::string err = failure();
  EXPECT_THAT(err, HasSubstr("PMIx server could not be used"));
  EXPECT_THAT(err, HasSubstr("GFLOW_ROOT"));
  set("GFLOW_ROOT", "head:5000");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rank, 1);
  EXPECT_EQ(id.size, 2);
  EXPECT_EQ(id.source, "Open MPI");
  EXPECT_FALSE(id.pmix);
}

// GFLOW_* (and torchrun) are the launchers that start the ranks themselves:
// with them set, the PMIx server of an outer launcher is not even asked.
TEST_F(EnvironmentTest, GflowVariablesShadowPmix) {
  set("PMIX_NAMESPACE", "gflow-test-no-server");
  set("PMIX_RANK", "0");
  set("GFLOW_RANK", "1");
  set("GFLOW_WORLD_SIZE", "3");
  set("GFLOW_ROOT", "head:5000");
  Identity id = resolveIdentity({});
  EXPECT_EQ(id.rank, 1);
  EXPECT_EQ(id.source, "GFLOW_*");
  EXPECT_FALSE(id.pmix);
}

TEST_F(EnvironmentTest, HostIdFromTheLauncher) {
  EXPECT_EQ(hostId("nodeA").rfind("nodeA/", 0), 0u) << hostId("nodeA");
  EXPECT_NE(hostId("nodeA"), hostId("nodeB"));
  set("GFLOW_HOST_ID", "rack1-node7");
  EXPECT_EQ(hostId("nodeA"), "rack1-node7");  // GFLOW_HOST_ID still wins
}

TEST_F(EnvironmentTest, HostId) {
  set("GFLOW_HOST_ID", "rack1-node7");
  EXPECT_EQ(hostId(), "rack1-node7");
  ::unsetenv("GFLOW_HOST_ID");
  params::resetCacheForTesting();
  char name[256] = {0};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  std::string id = hostId();
  EXPECT_EQ(id.rfind(std::string(name), 0), 0u) << id;
  EXPECT_NE(id.find('/'), std::string::npos) << "boot id missing: " << id;
  EXPECT_EQ(id, hostId());  // stable
}

}  // namespace
}  // namespace gflow::bootstrap
