#include "common/thread_priority.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gflow::thread_priority {

int niceAbove(int startNice, int levels) {
  return std::clamp(startNice - levels, -20, 19);
}

// PRIO_PROCESS with a thread id addresses that one thread on Linux.
int currentNice() {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  return errno == 0 ? nice : 0;
}

std::string setCurrentNice(int nice) {
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), nice) == 0) return "";
  const int err = errno;
  std::string why = std::strerror(err);
  if (err == EPERM || err == EACCES) {
    why +=
        " (raising a thread's priority needs CAP_SYS_NICE or a RLIMIT_NICE, ulimit -e, of at "
        "least " +
        std::to_string(20 - nice) + ")";
  }
  return why;
}

}  // namespace gflow::thread_priority
