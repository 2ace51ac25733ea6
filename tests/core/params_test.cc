// The parameter registry: parsing, defaults, errors naming the variable, and
// docs/configuration.md listing every parameter.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "common/params.h"
#include "gflow/error.h"
#include "testing/scoped_env.h"

namespace gflow {
namespace {

TEST(Params, ParsesBytesAndDurations) {
  uint64_t b = 0;
  EXPECT_TRUE(params::parseBytes("64K", &b));
  EXPECT_EQ(b, 65536u);
  EXPECT_TRUE(params::parseBytes("4M", &b));
  EXPECT_EQ(b, 4u << 20);
  EXPECT_FALSE(params::parseBytes("-1", &b));
  EXPECT_FALSE(params::parseBytes("12Q", &b));
  int64_t ms = 0;
  EXPECT_TRUE(params::parseDurationMs("300", &ms));
  EXPECT_EQ(ms, 300000);
  EXPECT_TRUE(params::parseDurationMs("250ms", &ms));
  EXPECT_EQ(ms, 250);
  EXPECT_TRUE(params::parseDurationMs("2m", &ms));
  EXPECT_EQ(ms, 120000);
  EXPECT_FALSE(params::parseDurationMs("soon", &ms));
}

TEST(Params, BadValueNamesTheVariable) {
  setenv("GFLOW_TIMEOUT", "forever", 1);
  params::resetCacheForTesting();
  try {
    params::timeoutMs();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("GFLOW_TIMEOUT"), std::string::npos);
  }
  unsetenv("GFLOW_TIMEOUT");
  params::resetCacheForTesting();
  EXPECT_EQ(params::timeoutMs(), 300000);
}

// Every numeric parameter has a range, and its default lies inside it.
TEST(Params, EveryNumberHasARangeThatHoldsItsDefault) {
  for (const params::Param& p : params::all()) {
    if (p.kind == params::Kind::kString) {
      EXPECT_EQ(params::rangeOf(p), nullptr) << p.name;
      continue;
    }
    const params::Range* r = params::rangeOf(p);
    ASSERT_NE(r, nullptr) << p.name << " has no row in GFLOW_PARAM_RANGES";
    EXPECT_LE(r->lo, r->hi) << p.name;
    EXPECT_NE(params::acceptedValues(p), "") << p.name;
  }
  params::resetCacheForTesting();
  EXPECT_NO_THROW(params::validateAll());  // the defaults (and the test presets)
}

TEST(Params, OutOfRangeValuesNameTheVariableAndTheRange) {
  {
    testing::ScopedEnv env("GFLOW_SOCKETS_PER_PEER", "1000");
    EXPECT_THROW(
        {
          try {
            params::validateAll();
          } catch (const Error& e) {
            EXPECT_THAT(e.what(), ::testing::HasSubstr("GFLOW_SOCKETS_PER_PEER='1000'"));
            EXPECT_THAT(e.what(), ::testing::HasSubstr("an integer in [1, 64]"));
            throw;
          }
        },
        Error);
  }
  {
    testing::ScopedEnv env("GFLOW_STRIPE_CHUNK", "1");
    EXPECT_THROW(params::validateAll(), Error);
  }
  {
    testing::ScopedEnv env("GFLOW_STRIPE_CHUNK", "0");  // off
    EXPECT_NO_THROW(params::validateAll());
  }
  {
    testing::ScopedEnv env("GFLOW_HOST_ID", std::string(5000, 'h').c_str());
    try {
      params::validateAll();
      ADD_FAILURE() << "a 5000-character value was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("at most 4096 characters"));
      EXPECT_LT(std::string(e.what()).size(), 300u);
    }
  }
}

// A secret's value reaches no message: an over-long job token is refused
// naming the variable, not showing the value, and every secret of the
// registry is shown only as set or unset.
TEST(Params, SecretsAreNeverShown) {
  const std::string token = "S3CRET" + std::string(5000, 'k');
  {
    testing::ScopedEnv env("GFLOW_JOB_TOKEN", token.c_str());
    try {
      params::validateAll();
      ADD_FAILURE() << "a 5000-character token was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("GFLOW_JOB_TOKEN (set, hidden) is not valid"));
      EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("S3CRET")));
      EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("kkkk")));
    }
  }
  int secrets = 0;
  for (const params::Param& p : params::all()) {
    if (!params::isSecret(p)) {
      EXPECT_EQ(params::shownValue(p, "visible"), "visible") << p.name;
      continue;
    }
    ++secrets;
    EXPECT_EQ(params::shownValue(p, "S3CRET"), "(set, hidden)") << p.name;
    EXPECT_EQ(params::shownValue(p, ""), "(unset)") << p.name;
    EXPECT_EQ(params::shownAssignment(p, "S3CRET"), std::string(p.name) + " (set, hidden)");
  }
  EXPECT_TRUE(params::isSecret(params::spec::jobToken));
  EXPECT_EQ(secrets, 1);
}

TEST(Params, ConfigurationDocListsEveryParameter) {
  std::ifstream f(GFLOW_TEST_SOURCE_DIR "/docs/configuration.md");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const params::Param& p : params::all()) {
    EXPECT_NE(doc.find(std::string("`") + p.name + "`"), std::string::npos)
        << p.name << " is missing from docs/configuration.md";
  }
}

using testing::ScopedEnv;

TEST(Params, TypedAccessorsReadTheTable) {
  ScopedEnv stripe("GFLOW_STRIPE_MIN", "64K");
  ScopedEnv spin("GFLOW_SPIN_US", "7");
  ScopedEnv rd("GFLOW_RD_MAX_BYTES", "auto");
  EXPECT_EQ(params::stripeMin(), 65536u);
  EXPECT_EQ(params::spinUs(), std::optional<int64_t>(7));
  EXPECT_EQ(params::rdMaxBytes(), std::nullopt);
  EXPECT_EQ(params::getBytes("GFLOW_STRIPE_MIN"), 65536u);  // the string-keyed lookup agrees
}

TEST(Params, AgreementCoversTheMarkedParameters) {
  EXPECT_EQ(params::agreementNames(),
            "GFLOW_ALGO, GFLOW_MODEL, GFLOW_DEVICE_BACKEND, GFLOW_NCCL_VERIFY, GFLOW_NCCL_P2P, "
            "GFLOW_REPRODUCIBLE, "
            "GFLOW_SHM, "
            "GFLOW_SHM_CHUNK, GFLOW_SHM_SINGLE_COPY, GFLOW_CONNECT, GFLOW_RENDEZVOUS, "
            "GFLOW_CODEC_PIECE, "
            "GFLOW_RD_MAX_BYTES, "
            "GFLOW_HD_MAX_BYTES");
  ScopedEnv shm("GFLOW_SHM", "0");
  ScopedEnv verify("GFLOW_NCCL_VERIFY", "1");
  const std::string in = params::agreementDigestInput({{&params::spec::algo, "ring"}});
  EXPECT_NE(in.find("GFLOW_SHM=0\n"), std::string::npos) << in;
  EXPECT_NE(in.find("GFLOW_ALGO=ring\n"), std::string::npos) << in;
  EXPECT_NE(in.find("GFLOW_NCCL_VERIFY=1\n"), std::string::npos) << in;
  EXPECT_EQ(in.find("GFLOW_TIMEOUT"), std::string::npos) << in;
}

}  // namespace
}  // namespace gflow
