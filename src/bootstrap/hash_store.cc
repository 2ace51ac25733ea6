// In-process store for ranks that run as threads: a map under one mutex, with
// a condition variable that wakes waiters whenever a key is written.
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "bootstrap/store_protocol.h"
#include "common/check.h"
#include "gflow/store.h"

namespace gflow {
namespace {

namespace proto = bootstrap::proto;

const ErrorContext kStoreCtx = ErrorContext::forOp("store");

class HashStore : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    waitLocked(lock, {key}, timeout, "get");
    return data_.at(key);
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    waitLocked(lock, keys, timeout, "wait");
  }

  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    waitLocked(lock, keys, timeout, "multi-get");
    std::vector<std::vector<uint8_t>> values;
    values.reserve(keys.size());
    for (const auto& k : keys) values.push_back(data_.at(k));
    return values;
  }

  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override {
    GFLOW_ENFORCE(keys.size() == values.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
    }
    cv_.notify_all();
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      std::string error;
      if (!proto::applyAdd(key, it == data_.end() ? nullptr : &it->second, delta, &result,
                           &error)) {
        GFLOW_THROW(kInvalidArgument, kStoreCtx) << error;
      }
      std::string s = std::to_string(result);
      data_[key] = std::vector<uint8_t>(s.begin(), s.end());
    }
    cv_.notify_all();
    return result;
  }

 private:
  bool allPresent(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (data_.count(k) == 0) return false;
    }
    return true;
  }

  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  std::chrono::milliseconds timeout, const char* what) {
    auto ready = [&] { return allPresent(keys); };
    if (ready()) return;
    uint64_t ms = proto::toWireMs(timeout);
    if (ms >= proto::kNeverMs) {
      // wait_until(time_point::max()) overflows in some standard libraries.
      cv_.wait(lock, ready);
      return;
    }
    if (cv_.wait_until(lock, proto::deadlineAfterMs(ms).at(), ready)) return;
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (data_.count(k) == 0) missing.push_back(k);
    }
    GFLOW_THROW(kTimeout, kStoreCtx) << proto::describeTimeout(what, timeout, keys.size(), missing);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
};

}  // namespace

std::shared_ptr<Store> createHashStore() {
  return std::make_shared<HashStore>();
}

}  // namespace gflow
