// ByteRanges: the byte ranges of one message that its fragments have
// claimed. A wire that assembles a message from fragments (TCP: several per
// message when it is striped over connections, in any order) claims each
// fragment's range before writing it; a range that overlaps one already
// claimed (a repeat, or fragments that overlap and would leave a hole with
// the right total) is refused, so a message completes only when every byte
// arrived exactly once.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace gflow::transport {

class ByteRanges {
 public:
  // Claims [offset, offset + len) of a message of `total` bytes (the caller
  // has checked that the range lies inside it). Returns "" or why the range
  // cannot be taken, for the wire's protocol error.
  std::string claim(uint64_t offset, uint64_t len, uint64_t total);
  // Bytes claimed so far; equal to the total exactly when every byte is.
  uint64_t claimed() const { return claimed_; }

 private:
  uint64_t claimed_ = 0;
  bool whole_ = false;                   // one fragment took the whole message
  std::map<uint64_t, uint64_t> ranges_;  // start -> end, disjoint, merged when adjacent
};

}  // namespace gflow::transport
