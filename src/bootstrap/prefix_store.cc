// A namespaced view of another store: sub-communicators share their parent's
// store without their keys colliding.
#include "common/check.h"
#include "gflow/store.h"

namespace gflow {
namespace {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    base_->set(prefix_ + key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_->get(prefix_ + key, timeout);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    base_->wait(prefixed(keys), timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_->add(prefix_ + key, delta);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout) override {
    return base_->multiGet(prefixed(keys), timeout);
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override {
    base_->multiSet(prefixed(keys), values);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return full;
  }

  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

}  // namespace

// Keys become "<prefix>/<key>", so prefixes "a" and "ab" cannot collide.
std::shared_ptr<Store> createPrefixStore(const std::string& prefix, std::shared_ptr<Store> base) {
  if (!base) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("store"))
        << "createPrefixStore('" << prefix << "'): the base store is null";
  }
  return std::make_shared<PrefixStore>(prefix, std::move(base));
}

}  // namespace gflow
