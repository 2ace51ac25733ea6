// Every GFLOW_* parameter of the registry, driven with hostile values
// (negative, zero, huge, NaN, garbage, very long): two ranks (threads) then
// either run a small and a striped-size allreduce and a broadcast with exact
// results, or fail at creation with a gflow::Error that names the variable.
// Nothing may hang: the ranks' deadline is 10 s and the whole run must end
// well inside the test's limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/params.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;

std::vector<std::string> hostileValues() {
  return {"-1",  "0",     "1",     "99999999999999999999999", "nan",
          "inf", "1e308", "-0x10", "garbage value!",          std::string(100000, '7'),
          "auto"};
}

std::vector<std::string> parameterNames() {
  std::vector<std::string> names;
  for (const params::Param& p : params::all()) names.push_back(p.name);
  return names;
}

// rank r's element i, and the exact sum over 2 ranks.
int32_t valueAt(int r, size_t i) {
  return (r + 1) * static_cast<int32_t>(i % 13 + 1);
}

void exactOps(Communicator& c) {
  for (size_t n : {size_t(1000), size_t(1) << 19}) {  // 4 KiB and 2 MiB (striped)
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = valueAt(c.rank(), i);
    c.allreduce(tensor(v.data(), n));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(v[i], valueAt(0, i) + valueAt(1, i)) << "allreduce element " << i;
    }
    for (size_t i = 0; i < n; ++i) v[i] = c.rank() == 1 ? valueAt(1, i) : 0;
    c.broadcast(tensor(v.data(), n), 1);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], valueAt(1, i)) << "broadcast element " << i;
  }
}

class HostileParam : public ::testing::TestWithParam<std::string> {};

TEST_P(HostileParam, EachValueRunsExactlyOrFailsNamingTheVariable) {
  const std::string name = GetParam();
  for (const std::string& value : hostileValues()) {
    SCOPED_TRACE(name + "=" + value.substr(0, 40));
    testing::ScopedEnv env(name.c_str(), value.c_str());
    Options o;
    o.timeout = milliseconds(10000);
    const auto t0 = std::chrono::steady_clock::now();
    auto errors = testing::runRanksCollect(2, exactOps, o);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
    for (int r = 0; r < 2; ++r) {
      if (!errors[r]) continue;
      try {
        std::rethrow_exception(errors[r]);
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr(name)) << "rank " << r;
        EXPECT_LT(std::string(e.what()).size(), 2000u) << "rank " << r;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": not a gflow::Error: " << e.what();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, HostileParam, ::testing::ValuesIn(parameterNames()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace gflow
