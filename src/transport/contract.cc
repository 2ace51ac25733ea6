#include "transport/contract.h"

#include <algorithm>

namespace gflow::transport {

std::string printable(const char* p, size_t n) {
  std::string s;
  s.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    unsigned char ch = static_cast<unsigned char>(p[i]);
    s.push_back(ch >= 0x20 && ch < 0x7f ? static_cast<char>(ch) : '?');
  }
  return s;
}

Error envelopeMismatch(int rank, uint64_t group, int peer, const std::string& theirs,
                       const std::string& mine) {
  return Error(
      ErrorCode::kMismatch,
      "rank " + std::to_string(peer) + " called " + theirs + " while this rank called " + mine,
      ErrorContext().withSeq(group).withRank(rank).withPeer(peer));
}

Error unexpectedOp(int rank, uint64_t group, int peer, uint64_t theirGroup,
                   const std::string& theirs) {
  return Error(ErrorCode::kMismatch,
               "rank " + std::to_string(peer) + " sent data for op #" + std::to_string(theirGroup) +
                   " (" + theirs +
                   ") that this rank never expected; ranks called different collectives",
               ErrorContext().withSeq(group).withRank(rank).withPeer(peer));
}

Error sizeMismatch(int rank, uint64_t group, int peer, uint64_t sent, uint64_t expected,
                   const std::string& op) {
  return Error(ErrorCode::kMismatch,
               "rank " + std::to_string(peer) + " sent " + std::to_string(sent) +
                   " bytes where this rank expects " + std::to_string(expected) + " (" + op + ")",
               ErrorContext().withSeq(group).withRank(rank).withPeer(peer));
}

Error requestTimeout(int rank, uint64_t group, const Request& req, bool alive, const char* via) {
  const int peer = req.peer();
  // "Timed out " as torch's tests (and log scrapers) recognise a timeout.
  std::string what = std::string("Timed out ") + (req.isSend() ? "sending " : "receiving ") +
                     std::to_string(req.bytes()) + " bytes " + (req.isSend() ? "to" : "from") +
                     " rank " + std::to_string(peer) + via +
                     " (it did not finish within the deadline, GFLOW_TIMEOUT); ";
  if (alive) {
    what += "rank " + std::to_string(peer) +
            " is alive but waiting itself: the stalled rank is further along the chain";
  } else {
    what += "rank " + std::to_string(peer) + " is not responding (stopped, hung or not calling " +
            "this collective)";
  }
  return Error(ErrorCode::kTimeout, what,
               ErrorContext().withSeq(group).withRank(rank).withPeer(peer));
}

namespace {

void putLE(char* at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t getLE(const char* at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(at[i])) << (8 * i);
  return v;
}

}  // namespace

std::vector<char> errorReportPayload(const Error& error, size_t maxText) {
  const std::string text = error.what();
  const size_t n = std::min(text.size(), maxText);
  const int32_t culprit = error.peer() >= 0 ? error.peer() : error.rank();
  std::vector<char> payload(kReportHeaderBytes + n);
  payload[0] = static_cast<char>(error.code());
  putLE(&payload[1], static_cast<uint32_t>(culprit), 4);
  putLE(&payload[5], error.seq(), 8);
  std::copy(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n),
            payload.begin() + kReportHeaderBytes);
  return payload;
}

Error peerReport(int rank, uint64_t group, int peer, const char* payload, size_t n) {
  ErrorCode code = ErrorCode::kPeerLost;
  std::string text;
  int culprit = -1;
  uint64_t seq = 0;
  if (n >= kReportHeaderBytes) {
    const uint8_t raw = static_cast<uint8_t>(payload[0]);
    if (raw <= static_cast<uint8_t>(ErrorCode::kInternal)) code = static_cast<ErrorCode>(raw);
    // The communicator checks both against its size and op count.
    const int32_t c = static_cast<int32_t>(static_cast<uint32_t>(getLE(payload + 1, 4)));
    culprit = c >= 0 ? c : -1;
    seq = getLE(payload + 5, 8);
    text = printable(payload + kReportHeaderBytes, n - kReportHeaderBytes);
  } else {
    text = printable(payload, n);
  }
  // A peer that aborted or failed locally is, for this rank, a lost peer.
  if (code == ErrorCode::kAborted || code == ErrorCode::kInvalidArgument ||
      code == ErrorCode::kInternal) {
    code = ErrorCode::kPeerLost;
  }
  return Error(
      code, "rank " + std::to_string(peer) + " failed: " + text,
      ErrorContext().withSeq(group).withRank(rank).withPeer(peer).withCulprit(culprit, seq));
}

Error rejectionReport(int rank, uint64_t group, int peer, const char* payload, size_t n) {
  return Error(ErrorCode::kMismatch,
               "rank " + std::to_string(peer) + " rejected its call of op #" +
                   std::to_string(group) + " (" + printable(payload, std::min<size_t>(n, 512)) +
                   "), so this rank's op #" + std::to_string(group) + " cannot complete",
               ErrorContext().withSeq(group).withRank(rank).withPeer(peer));
}

}  // namespace gflow::transport
