#include "transport/byte_ranges.h"

#include <iterator>

namespace gflow::transport {

namespace {

std::string range(uint64_t a, uint64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

}  // namespace

std::string ByteRanges::claim(uint64_t offset, uint64_t len, uint64_t total) {
  const uint64_t end = offset + len;
  if (len == 0) return "";
  if (whole_) return "fragment " + range(offset, end) + " repeats bytes of the whole message";
  if (claimed_ == 0 && offset == 0 && len == total) {  // the common case: one fragment
    whole_ = true;
    claimed_ = len;
    return "";
  }
  auto next = ranges_.lower_bound(offset);  // first range starting at or after offset
  if (next != ranges_.end() && next->first < end) {
    return "fragment " + range(offset, end) + " overlaps " + range(next->first, next->second) +
           ", received before";
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second > offset) {
      return "fragment " + range(offset, end) + " overlaps " + range(prev->first, prev->second) +
             ", received before";
    }
    if (prev->second == offset) {  // merge with the range before
      offset = prev->first;
      ranges_.erase(prev);
    }
  }
  uint64_t merged = end;
  if (next != ranges_.end() && next->first == end) {  // merge with the range after
    merged = next->second;
    ranges_.erase(next);
  }
  ranges_[offset] = merged;
  claimed_ += len;
  return "";
}

}  // namespace gflow::transport
