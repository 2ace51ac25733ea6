#include "gflow/store.h"

#include <algorithm>

#include "common/check.h"
#include "common/deadline.h"

namespace gflow {

Store::~Store() = default;

void Store::setString(const std::string& key, const std::string& value) {
  set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::vector<std::vector<uint8_t>> Store::multiGet(const std::vector<std::string>& keys,
                                                  std::chrono::milliseconds timeout) {
  const Deadline deadline = Deadline::after(timeout);
  wait(keys, timeout);
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  for (const auto& k : keys) {
    values.push_back(get(k, std::chrono::milliseconds(std::max(deadline.remainingMs(), 1))));
  }
  return values;
}

void Store::multiSet(const std::vector<std::string>& keys,
                     const std::vector<std::vector<uint8_t>>& values) {
  GFLOW_ENFORCE(keys.size() == values.size());
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

std::string Store::getString(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<uint8_t> v = get(key, timeout);
  return std::string(v.begin(), v.end());
}

}  // namespace gflow
