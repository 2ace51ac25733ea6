#include "transport/tcp/congestion.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"

namespace gflow::transport::tcp {
namespace {

bool trySet(int fd, const std::string& name) {
  return ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                      static_cast<socklen_t>(name.size())) == 0;
}

}  // namespace

std::string congestionOf(int fd) {
  char name[32] = {};  // TCP_CA_NAME_MAX is 16
  socklen_t len = sizeof(name) - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

void CongestionChoice::apply(int fd, int rank) {
  if (!decided_) {
    decided_ = true;
    const std::string current = congestionOf(fd);
    if (spec_ == "system") return;
    if (spec_ == "auto") {
      if (current.rfind("bbr", 0) != 0) return;  // loss-based already
      for (const char* alt : {"cubic", "reno"}) {
        if (trySet(fd, alt)) {
          chosen_ = alt;
          GFLOW_LOG(INFO) << "rank " << rank << ": data sockets use " << alt << " instead of "
                          << current << " (GFLOW_TCP_CONGESTION=auto)";
          return;
        }
      }
      return;  // nothing else permitted: keep the system's
    }
    chosen_ = spec_;
  }
  if (chosen_.empty() || congestionOf(fd) == chosen_) return;
  if (!trySet(fd, chosen_)) {
    const int err = errno;
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init").withRank(rank))
        << "GFLOW_TCP_CONGESTION / Options::tcp.congestion '" << chosen_
        << "': the kernel refused it (" << std::strerror(err)
        << "); see net.ipv4.tcp_available_congestion_control, and for unprivileged processes "
           "net.ipv4.tcp_allowed_congestion_control, or use auto or system";
  }
}

}  // namespace gflow::transport::tcp
