// The argument checks the collectives' front doors share (collectives.cc,
// rooted_collectives.cc). Each raises through CommunicatorImpl::invalid, so
// a bad argument names the op, the argument and this rank, and no peer
// waits for this rank (the op is rejected, or the communicator fails).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/communicator_impl.h"

namespace gflow::opcheck {

// The names of the point-to-point calls (point_to_point.cc and the front
// ends): outside the collectives' op order, so a bad argument fails the
// communicator instead of rejecting an op number.
constexpr const char* kSend = "send";
constexpr const char* kRecv = "recv";
constexpr const char* kSendRecv = "sendRecv";
inline bool isPointToPointCall(const std::string& op) {
  return op == kSend || op == kRecv || op == kSendRecv;
}

// A tensor argument and its name in messages.
struct Named {
  const Tensor& tensor;
  const char* name;
};

inline bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && pa < pb + bn && pb < pa + an;
}

// The same tensor passed twice (an in-place call): what validating one
// checked holds for the other.
inline bool sameTensor(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.count == b.count && a.dtype == b.dtype &&
         a.device.type == b.device.type && a.device.index == b.device.index && a.stream == b.stream;
}

// Block `index` (of `block.nbytes()` bytes) of `big`.
inline const char* blockOf(const Tensor& big, const Tensor& block, int index) {
  return static_cast<const char*>(big.data) + static_cast<size_t>(index) * block.nbytes();
}

// `big` holds size() blocks of `small.count` elements of small's dtype.
inline void checkBlocks(CommunicatorImpl& I, const char* name, const Tensor& small,
                        const char* smallName, const Tensor& big, const char* bigName) {
  I.validateTensor(name, smallName, small);
  I.validateTensor(name, bigName, big);
  if (small.dtype != big.dtype) {
    I.invalid(name, std::string(smallName) + " is " + toString(small.dtype) + " but " + bigName +
                        " is " + toString(big.dtype));
  }
  if (big.count != small.count * static_cast<size_t>(I.commSize())) {
    I.invalid(name, std::string(bigName) + ".count (" + std::to_string(big.count) + ") must be " +
                        smallName + ".count (" + std::to_string(small.count) + ") x world size (" +
                        std::to_string(I.commSize()) + ")");
  }
}

inline void checkRoot(CommunicatorImpl& I, const char* name, int root) {
  if (root < 0 || root >= I.commSize()) {
    I.invalid(name, "root " + std::to_string(root) + " is outside [0, " +
                        std::to_string(I.commSize()) + ")");
  }
}

inline void finish(const std::shared_ptr<WorkState>& w) {
  w->wait(std::chrono::milliseconds(0));
}

}  // namespace gflow::opcheck
