// Pieces both network transports (tcp/, verbs/) share: tag hashing, op
// ordering, staging accounting, and the error
// texts of the contract (mismatch, timeout, a peer's error report), so that
// a failure reads the same whatever carried it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gflow/error.h"
#include "transport/transport.h"

namespace gflow::transport {

struct TagHash {
  size_t operator()(const Tag& t) const { return t.group * 0x9E3779B97F4A7C15ull ^ t.index; }
};

// Bookkeeping charged per staged (unexpected) message on top of its payload,
// so a flood of tiny messages is bounded by GFLOW_UNEXPECTED_LIMIT too.
constexpr uint64_t kStagedOverhead = 256;

// Op numbers wrap: is `group` before `current`?
inline bool isPast(uint64_t group, uint64_t current) {
  return static_cast<int64_t>(group - current) < 0;
}

// Point-to-point messages (Communicator::send/recv) carry this bit in their
// tag group: they are matched by (peer, tag, order), outside the collectives'
// op order, so the running op's envelope and stale-op checks skip them.
constexpr uint64_t kPointToPointGroup = uint64_t(1) << 63;
inline bool isPointToPoint(uint64_t group) {
  return (group & kPointToPointGroup) != 0;
}
// A collective's message for an op this rank has passed (never a
// point-to-point one).
inline bool isStale(uint64_t group, uint64_t current) {
  return !isPointToPoint(group) && isPast(group, current);
}

// Peer-supplied text made safe to print (non-printable bytes become '?').
std::string printable(const char* p, size_t n);

// A peer called another op than this rank (same op number).
Error envelopeMismatch(int rank, uint64_t group, int peer, const std::string& theirs,
                       const std::string& mine);
// A peer sent data for an op this rank has passed without receiving it.
Error unexpectedOp(int rank, uint64_t group, int peer, uint64_t theirGroup,
                   const std::string& theirs);
// The peer's message and this rank's receive differ in size.
Error sizeMismatch(int rank, uint64_t group, int peer, uint64_t sent, uint64_t expected,
                   const std::string& op);
// `req` did not finish by its deadline; `alive`: the peer answered a probe
// from inside gflow. `via`: " over verbs" or "".
Error requestTimeout(int rank, uint64_t group, const Request& req, bool alive, const char* via);
// The error report a failing rank sends its peers: the code (1 byte), the
// culprit (4 bytes, little-endian: the rank `error` blames, else the rank
// raising it), the op it failed (8 bytes, error.seq()), both in the
// communicator's numbering, then at most `maxText` bytes of text.
std::vector<char> errorReportPayload(const Error& error, size_t maxText);
constexpr size_t kReportHeaderBytes = 13;  // errorReportPayload's code, culprit and op
// A peer's error report (errorReportPayload) as this rank's error: peer is
// the reporting `peer`; culprit and reportedSeq are what the report says.
Error peerReport(int rank, uint64_t group, int peer, const char* payload, size_t n);
// `peer`'s notice (Context::reject) that it will not run op `group`; the
// payload is its reason. kMismatch: the ranks called op `group` differently.
Error rejectionReport(int rank, uint64_t group, int peer, const char* payload, size_t n);

}  // namespace gflow::transport
