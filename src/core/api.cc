// The process-default communicator behind gflow::init() / gflow::allreduce().
#include <mutex>

#include "common/check.h"
#include "gflow/gflow.h"

namespace gflow {
namespace {
std::mutex& defaultMutex() {
  static std::mutex m;
  return m;
}
std::shared_ptr<Communicator>& defaultComm() {
  static std::shared_ptr<Communicator> c;
  return c;
}
}  // namespace

std::shared_ptr<Communicator> init(const Options& options) {
  std::lock_guard<std::mutex> lock(defaultMutex());
  if (!defaultComm()) defaultComm() = Communicator::create(options);
  return defaultComm();
}

std::shared_ptr<Communicator> defaultCommunicator() {
  std::lock_guard<std::mutex> lock(defaultMutex());
  if (!defaultComm()) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{"allreduce"})
        << "no default communicator: call gflow::init() first";
  }
  return defaultComm();
}

void finalize() {
  std::lock_guard<std::mutex> lock(defaultMutex());
  defaultComm().reset();
}

void allreduce(Tensor inout, ReduceOp op) {
  defaultCommunicator()->allreduce(inout, op);
}

Work allreduceAsync(Tensor inout, ReduceOp op) {
  return defaultCommunicator()->allreduceAsync(inout, op);
}

}  // namespace gflow
