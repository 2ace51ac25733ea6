#include "common/shared_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <utility>

#include "common/check.h"
#include "common/resource_counts.h"

namespace gflow {

Mapping::~Mapping() {
  if (data_) ::munmap(data_, size_);
  if (data_ && created_) resources::sharedMapped(-static_cast<int64_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

Mapping::Mapping(Mapping&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      created_(std::exchange(o.created_, false)),
      fd_(std::exchange(o.fd_, -1)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    Mapping tmp(std::move(*this));
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    created_ = std::exchange(o.created_, false);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

Mapping Mapping::create(size_t size) {
  Mapping m;
  int fd =
      static_cast<int>(::syscall(SYS_memfd_create, "gflow-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  GFLOW_SYSCHECK(fd, "memfd_create");
  m.fd_ = fd;
  GFLOW_SYSCHECK(::ftruncate(fd, static_cast<off_t>(size)), "ftruncate of a shared segment");
  // Sealed at its size: nobody holding the fd can shrink it under our
  // mappings (SIGBUS), and openers can check they got a sealed memfd.
  GFLOW_SYSCHECK(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                 "sealing a shared segment");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    GFLOW_THROW(kInternal, ErrorContext{})
        << "mmap of a " << size << "-byte shared segment failed: " << std::strerror(errno);
  }
  m.data_ = p;
  m.size_ = size;
  m.created_ = true;
  resources::sharedMapped(static_cast<int64_t>(size));
  return m;
}

Mapping Mapping::open(pid_t pid, int fd, size_t size, std::string* why, bool readOnly) {
  Mapping m;
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // Non-blocking: an fd that is no memfd (a FIFO) must not block the open;
  // the seals below refuse it.
  int f = ::open(path.c_str(), (readOnly ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f < 0) {
    *why = "open(" + path + "): " + std::strerror(errno);
    return m;
  }
  struct stat st {};
  const int seals = ::fcntl(f, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || ::fstat(f, &st) != 0 ||
      static_cast<size_t>(st.st_size) < size) {
    *why = path + " is not a sealed segment of " + std::to_string(size) + " bytes";
    ::close(f);
    return m;
  }
  void* p = ::mmap(nullptr, size, readOnly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  ::close(f);
  if (p == MAP_FAILED) {
    *why = "mmap(" + path + "): " + std::strerror(errno);
    return m;
  }
  m.data_ = p;
  m.size_ = size;
  return m;
}

void Mapping::closeFd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

ProcessWatch::ProcessWatch(pid_t pid) : pid_(pid) {
#ifdef SYS_pidfd_open
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

ProcessWatch::ProcessWatch(ProcessWatch&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), pidfd_(std::exchange(o.pidfd_, -1)) {}

ProcessWatch& ProcessWatch::operator=(ProcessWatch&& o) noexcept {
  if (this != &o) {
    if (pidfd_ >= 0) ::close(pidfd_);
    pid_ = std::exchange(o.pid_, -1);
    pidfd_ = std::exchange(o.pidfd_, -1);
  }
  return *this;
}

bool ProcessWatch::exited() const {
  if (pid_ <= 0) return false;
  if (pidfd_ >= 0) {
    struct pollfd p {
      pidfd_, POLLIN, 0
    };
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  return ::kill(pid_, 0) != 0 && errno == ESRCH;
}

void futexWake(uint32_t* word) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void futexWait(uint32_t* word, uint32_t expected, int64_t timeoutUs) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeoutUs / 1000000);
  ts.tv_nsec = static_cast<long>((timeoutUs % 1000000) * 1000);
  ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace gflow
