// The congestion control of gflow's data sockets (GFLOW_TCP_CONGESTION,
// Options::tcp.congestion).
//
// Why gflow chooses it: collective traffic comes in bursts separated by
// compute, so TCP sees an application-limited flow. BBR paces every send at
// its model of the path's bandwidth, and that model is built from the
// delivery rates of earlier, application-limited bursts: after a phase of
// smaller messages it paces the next large ones at the lower rate, and on
// loopback a whole sweep stays 2-3x slower depending on what ran before it
// (docs/performance.md, "Congestion control"). Loss-based control (cubic,
// reno) sends a burst at once and is what MPI's and Gloo's users get on a
// default Linux kernel.
//
// The choice must be in force before the TCP handshake: a connection that
// was established under BBR keeps the kernel's internal pacing (BBR asks for
// it when it starts) after a switch to cubic, and then paces at cubic's
// rate. So it is set on the listening socket (accepted sockets inherit it)
// and on a dialing socket before connect().
#pragma once

#include <string>

namespace gflow::transport::tcp {

// Resolved once per context from `spec`:
//   "auto"   (default) keep the system's choice unless it paces by a model
//            (bbr*), then use cubic, else reno (always permitted);
//   "system" keep the system's choice;
//   a name   that algorithm (kInvalidArgument naming the parameter when the
//            kernel refuses it: not loaded, or not in
//            net.ipv4.tcp_allowed_congestion_control for an unprivileged process).
class CongestionChoice {
 public:
  explicit CongestionChoice(std::string spec) : spec_(std::move(spec)) {}

  // Applies the choice to a TCP socket (listening, or not yet connected; a
  // socket that already has it is left alone); the first call decides (from
  // that socket's current algorithm) what "auto" means for the rest.
  void apply(int fd, int rank);

  // The algorithm applied ("" while none was, or with "system").
  const std::string& chosen() const { return chosen_; }

 private:
  std::string spec_;
  bool decided_ = false;
  std::string chosen_;
};

// The socket's congestion control algorithm ("" if it cannot be read).
std::string congestionOf(int fd);

}  // namespace gflow::transport::tcp
