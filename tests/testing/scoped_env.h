// ScopedEnv: sets one GFLOW_* variable for a test and restores the previous
// value (the test binary presets some, tests/testing/test_env.cc), forgetting
// the parameter cache both times so the registry reads the new value.
#pragma once

#include <cstdlib>
#include <string>

#include "common/params.h"

namespace gflow::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    hadOld_ = old != nullptr;
    setenv(name, value, 1);
    params::resetCacheForTesting();
  }
  ~ScopedEnv() {
    if (hadOld_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
    params::resetCacheForTesting();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool hadOld_ = false;
};

}  // namespace gflow::testing
