#include "transport/tcp/inbound.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <utility>

#include "common/check.h"

namespace gflow::transport::tcp {
namespace {

// How often a rank waiting for others to connect at init looks for their
// failure reports in the store: after kSetupPoll, then at twice the
// interval each time up to kMaxSetupPoll (a few requests per rank however
// long the setup; a failure is seen within kMaxSetupPoll).
constexpr std::chrono::milliseconds kSetupPoll{100};
constexpr std::chrono::milliseconds kMaxSetupPoll{2000};

}  // namespace

Inbound::Inbound(const Identity& me, std::function<void()> onReady)
    : me_(me),
      onReady_(std::move(onReady)),
      expected_(static_cast<size_t>((me.size - 1 - me.rank) * me.socketsPerPeer)),
      seen_(me.size, std::vector<bool>(me.socketsPerPeer, false)),
      state_(me.size, State::kNone),
      arrived_(me.size, 0) {}

void Inbound::handshake(net::HandshakeAcceptor::Handshake& h) {
  const Deadline hd = h.deadline();
  Hello hello{};
  // Magic and version first: another version's hello may be shorter.
  constexpr size_t kHead = offsetof(Hello, rank);
  net::recvAll(h.fd(), &hello, kHead, hd);
  if (hello.magic == kHelloMagic && hello.version == kProtocolVersion) {
    net::recvAll(h.fd(), reinterpret_cast<char*>(&hello) + kHead, sizeof(hello) - kHead, hd);
  }
  std::string why;
  HelloReply reply{};
  reply.ok = claim(hello, &why);
  const bool agree = reply.ok == kAccepted && hello.socketIndex == 0;
  if (agree && me_.host.canConnect(hello.local)) {
    reply.local = me_.host.identityFor(hello.rank);
    reply.challenge = local::Host::newChallenge();
  }
  std::unique_ptr<local::Link> link;
  try {
    net::sendAll(h.fd(), &reply, sizeof(reply), hd);
    if (agree) {
      link = me_.host.agreeAsAcceptor(h.fd(), hello.rank, hello.local, reply.challenge, hd);
    }
  } catch (const Error&) {
    if (reply.ok == kAccepted) release(hello);
    throw;
  }
  if (reply.ok == kCrossed) return;  // the peer waits for this rank's dial
  if (reply.ok != kAccepted) throw Error(ErrorCode::kMismatch, why);
  if (tellFailure(h, hd)) return;
  net::Socket sock = h.take();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sock.valid()) {  // the acceptor stops
    seen_[hello.rank][hello.socketIndex] = false;
    return;
  }
  accepted_.push_back(Accepted{hello, std::move(sock), std::move(link)});
  if (!me_.lazy) {
    if (accepted_.size() >= expected_) done_.notify_all();
    return;
  }
  if (++arrived_[hello.rank] < me_.socketsPerPeer) return;
  ready_.store(true, std::memory_order_release);
  done_.notify_all();
  if (onReady_) onReady_();
}

bool Inbound::tellFailure(net::HandshakeAcceptor::Handshake& h, const Deadline& hd) {
  FrameHeader header{};
  std::vector<char> report;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (report_.empty()) return false;
    header = reportHeader_;
    report = report_;
  }
  net::sendAll(h.fd(), &header, sizeof(header), hd);
  net::sendAll(h.fd(), report.data(), report.size(), hd);
  return true;
}

void Inbound::refuseWith(const FrameHeader& header, std::vector<char> report) {
  std::lock_guard<std::mutex> lock(mutex_);
  reportHeader_ = header;
  report_ = std::move(report);
}

std::string Inbound::misfit(const Hello& h) const {
  if (h.magic != kHelloMagic || h.version != kProtocolVersion) return "bad hello magic/version";
  if (h.commId != me_.commId) return "belongs to another communicator";
  const bool fromAbove = me_.lazy ? h.rank != me_.rank : h.rank > me_.rank;
  if (h.size != me_.size || !fromAbove || h.rank < 0 || h.rank >= me_.size) {
    return "claims rank " + std::to_string(h.rank) + " of " + std::to_string(h.size);
  }
  if (h.socketsPerPeer != me_.socketsPerPeer || h.socketIndex < 0 ||
      h.socketIndex >= me_.socketsPerPeer) {
    return "uses " + std::to_string(h.socketsPerPeer) +
           " sockets per peer (GFLOW_SOCKETS_PER_PEER differs between ranks?)";
  }
  if ((h.lazy != 0) != me_.lazy) {
    return std::string("connects ") + (h.lazy ? "on demand" : "to every peer at init") +
           " (GFLOW_CONNECT differs between ranks?)";
  }
  return "";
}

uint8_t Inbound::claim(const Hello& h, std::string* why) {
  *why = misfit(h);
  if (!why->empty()) return kRefused;
  std::lock_guard<std::mutex> lock(mutex_);
  State& s = state_[h.rank];
  // A lower rank's dial that meets this rank's (in flight or done) is
  // crossed: this rank's wins, and the peer adopts it.
  const bool mine = s == State::kDialing || (s == State::kConnected && !seen_[h.rank][0]);
  if (me_.lazy && h.socketIndex == 0 && h.rank < me_.rank && mine) return kCrossed;
  const bool taken =
      me_.lazy && h.socketIndex == 0 && (s == State::kClaimed || s == State::kConnected);
  if (seen_[h.rank][h.socketIndex] || taken) {
    *why = "duplicate connection for rank " + std::to_string(h.rank);
    return kRefused;
  }
  if (me_.lazy) {
    if (h.socketIndex == 0) {
      s = State::kClaimed;
    } else if (s != State::kClaimed) {
      *why = "connection " + std::to_string(h.socketIndex) + " of rank " + std::to_string(h.rank) +
             " came without its connection 0";
      return kRefused;
    }
  }
  seen_[h.rank][h.socketIndex] = true;
  return kAccepted;
}

void Inbound::release(const Hello& h) {
  std::lock_guard<std::mutex> lock(mutex_);
  seen_[h.rank][h.socketIndex] = false;
  if (me_.lazy && h.socketIndex == 0 && state_[h.rank] == State::kClaimed) {
    state_[h.rank] = State::kNone;
  }
}

std::vector<int> Inbound::missingRanks() const {
  std::vector<int> out;
  for (int r = me_.rank + 1; r < me_.size; ++r) {
    if (std::find(seen_[r].begin(), seen_[r].end(), false) != seen_[r].end()) out.push_back(r);
  }
  return out;
}

std::vector<Accepted> Inbound::wait(const Deadline& deadline, const ErrorContext& ectx,
                                    const std::function<void(const std::vector<int>&)>& check) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto complete = [&] { return accepted_.size() >= expected_; };
  std::chrono::milliseconds pause = kSetupPoll;
  while (!complete() && !deadline.expired()) {
    done_.wait_until(lock, std::min(deadline.at(), Deadline::Clock::now() + pause), complete);
    if (complete()) break;
    pause = std::min(pause * 2, kMaxSetupPoll);
    const std::vector<int> missing = missingRanks();
    lock.unlock();
    check(missing);
    lock.lock();
  }
  if (!complete()) {
    std::string missing;
    for (int r : missingRanks()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    GFLOW_THROW(kTimeout, ectx) << "ranks " << missing
                                << " did not connect within the deadline (GFLOW_TIMEOUT)";
  }
  return std::move(accepted_);
}

bool Inbound::startDial(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_[peer] != State::kNone) return false;
  state_[peer] = State::kDialing;
  return true;
}

void Inbound::endDial(int peer, bool connected) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Crossed: the peer's hello may have been claimed meanwhile (a higher
  // peer's always is); else it is still to come.
  if (!connected) {
    if (state_[peer] == State::kDialing) state_[peer] = State::kNone;
    return;
  }
  // A hello claimed for a peer this rank has dialled came from an impostor
  // (the real peer, had it dialled too, would have crossed this dial): its
  // sockets go, and the slots stay taken.
  if (state_[peer] == State::kClaimed) {
    accepted_.erase(std::remove_if(accepted_.begin(), accepted_.end(),
                                   [&](const Accepted& a) { return a.hello.rank == peer; }),
                    accepted_.end());
    arrived_[peer] = 0;
  }
  state_[peer] = State::kConnected;
}

std::vector<Accepted> Inbound::takeReady() {
  std::vector<Accepted> out;
  std::lock_guard<std::mutex> lock(mutex_);
  ready_.store(false, std::memory_order_relaxed);
  std::vector<Accepted> rest;
  for (Accepted& a : accepted_) {
    const int r = a.hello.rank;
    (arrived_[r] == me_.socketsPerPeer ? out : rest).push_back(std::move(a));
  }
  accepted_ = std::move(rest);
  for (const Accepted& a : out) state_[a.hello.rank] = State::kConnected;
  std::sort(out.begin(), out.end(), [](const Accepted& x, const Accepted& y) {
    return std::make_pair(x.hello.rank, x.hello.socketIndex) <
           std::make_pair(y.hello.rank, y.hello.socketIndex);
  });
  return out;
}

void Inbound::waitReady(const Deadline& until) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait_until(lock, until.at(), [&] { return ready_.load(std::memory_order_relaxed); });
}

}  // namespace gflow::transport::tcp
