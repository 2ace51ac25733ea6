#include "transport/tcp/pair.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace gflow::transport::tcp {

size_t Conn::takeAhead(char* dst, size_t n) {
  const size_t k = std::min(n, aheadLen - aheadPos);
  std::memcpy(dst, ahead.get() + aheadPos, k);
  aheadPos += k;
  return k;
}

Conn::Read Conn::readHeader(ByteSource& source) {
  while (hdrGot < sizeof(FrameHeader)) {
    if (hasAhead()) {
      hdrGot += takeAhead(reinterpret_cast<char*>(&hdr) + hdrGot, sizeof(FrameHeader) - hdrGot);
      continue;
    }
    if (drained) return Read::kWouldBlock;
    aheadPos = aheadLen = 0;
    // A stream gives the header alone: its payload is copied once, into place.
    const size_t want = stream ? sizeof(FrameHeader) - hdrGot : kReadAhead;
    switch (source.fill(*this, ahead.get(), want, &aheadLen)) {
      case Fill::kData: break;
      case Fill::kWouldBlock: return Read::kWouldBlock;
      case Fill::kClosed: return Read::kClosed;
    }
  }
  return Read::kDone;
}

// The current fragment's payload: what the read-ahead holds, then straight
// from the socket (a large rest) or through the read-ahead (a small one).
Conn::Read Conn::readPayload(ByteSource& source, std::vector<char>& scratch) {
  if (discard && scratch.empty()) scratch.resize(kReadAhead);
  // Dropped bytes are read in bounded rounds, so a peer that streams
  // without end cannot keep awaitReports past its deadline.
  int rounds = 0;
  while (left > 0) {
    // A dropped payload goes to the same scratch bytes over and over.
    char* into = discard ? scratch.data() : dst;
    const uint64_t room = discard ? std::min<uint64_t>(left, scratch.size()) : left;
    if (hasAhead()) {
      const size_t k = takeAhead(into, room);
      if (!discard) dst += k;
      left -= k;
      continue;
    }
    if (drained || (discard && ++rounds > 64)) return Read::kWouldBlock;
    const bool direct = room >= kReadAhead || stream;
    size_t got = 0;
    aheadPos = aheadLen = 0;
    const Fill f = direct ? source.fill(*this, into, room, &got)
                          : source.fill(*this, ahead.get(), kReadAhead, &got);
    if (f == Fill::kWouldBlock) return Read::kWouldBlock;
    if (f == Fill::kClosed) return Read::kClosed;
    if (direct) {
      if (!discard) dst += got;
      left -= got;
    } else {
      aheadLen = got;
    }
  }
  return Read::kDone;
}

// While a large fragment is arriving, ask the kernel to report the socket
// readable only once a good part of it is there: each wake-up of a sleeping
// waiter costs tens of microseconds, more than copying 64 KiB. Back to 1 byte
// between frames so a small message is never held back.
void Conn::tuneLowat() {
  if (stream) return;
  constexpr uint64_t kMinLowat = 64 << 10, kMaxLowat = 512 << 10;
  int want = 1;
  if (inPayload && left >= kMinLowat) want = static_cast<int>(std::min(left, kMaxLowat));
  if (want == lowat) return;
  if (setsockopt(sock.fd(), SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) lowat = want;
}

uint64_t Conn::backlog() const {
  uint64_t bytes = 0;
  for (const SendItem& it : sendq) bytes += sizeof(FrameHeader) + it.payloadLen - it.written;
  return bytes;
}

Conn* Pair::controlConn() {
  for (auto& c : conns) {
    if (c && !c->closed) return c.get();
  }
  return nullptr;
}

bool Pair::socketsClosed() const {
  for (const auto& s : sockets) {
    if (s && !s->closed) return false;
  }
  return true;
}

bool Pair::sending() const {
  if (!pending.empty() || !held.empty()) return true;
  for (const auto& c : conns) {
    if (c && !c->sendq.empty()) return true;
  }
  return false;
}

void Pair::updateClosed() {
  for (const auto& c : conns) {
    if (c && !c->closed) return;
  }
  closed = true;
}

}  // namespace gflow::transport::tcp
