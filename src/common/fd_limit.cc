#include "common/fd_limit.h"

#include <dirent.h>
#include <sys/resource.h>

#include "common/logging.h"

namespace gflow::fdlimit {

namespace {

rlimit current() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) r.rlim_cur = r.rlim_max = RLIM_INFINITY;
  return r;
}

std::string text(rlim_t v) {
  return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
}

}  // namespace

uint64_t raiseToHard() {
  rlimit r = current();
  if (r.rlim_cur == r.rlim_max) return r.rlim_cur;
  const rlim_t before = r.rlim_cur;
  r.rlim_cur = r.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &r) != 0) return before;
  GFLOW_LOG(INFO) << "raised the open-file limit (RLIMIT_NOFILE soft limit) from " << text(before)
                  << " to its hard limit " << text(r.rlim_max);
  return r.rlim_cur;
}

size_t openNow() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return 0;
  size_t n = 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n > 0 ? n - 1 : 0;  // the directory's own descriptor
}

void require(size_t more, const std::string& what, const ErrorContext& ctx) {
  const uint64_t soft = raiseToHard();
  if (soft == RLIM_INFINITY) return;
  const size_t open = openNow();
  if (open + more <= soft) return;
  const rlimit r = current();
  throw Error(ErrorCode::kInternal,
              what + " needs " + std::to_string(more) + " more file descriptors (" +
                  std::to_string(open + more) + " with the " + std::to_string(open) +
                  " open), but the open-file limit is " + text(r.rlim_cur) + " (hard limit " +
                  text(r.rlim_max) + "): raise it, e.g. `ulimit -n " +
                  std::to_string(open + more + 64) +
                  "` (a hard limit needs root, /etc/security/limits.conf or the launcher's "
                  "setting)",
              ctx);
}

}  // namespace gflow::fdlimit
