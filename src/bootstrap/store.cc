#include "gflow/store.h"

namespace gflow {

Store::~Store() = default;

void Store::setString(const std::string& key, const std::string& value) {
  set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::getString(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<uint8_t> v = get(key, timeout);
  return std::string(v.begin(), v.end());
}

}  // namespace gflow
