#include "ddprun/common/system.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ddprun/common/error.hpp"
#include "ddprun/common/thread.hpp"

extern char** environ;

namespace ddprun {

std::map<std::string, std::string> environment_map() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::string host_name() {
  char buf[256] = "?";
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  buf[sizeof(buf) - 1] = '\0';
  return buf;
}

std::string read_file(const std::string& path) {
  // Plain read(2): the files read at start-up (/proc, cgroup files) are small, and a stream's
  // buffer, locale and per-character copy cost more than the kernel's work.
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

int open_regular(const std::string& path, int flags, unsigned mode) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NONBLOCK, static_cast<mode_t>(mode));
  if (fd < 0) return -1;
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    errno = EINVAL;
    return -1;
  }
  if (!(flags & O_NONBLOCK)) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_worker_file(const std::string& path, std::size_t max_bytes, std::uint64_t offset) {
  std::string out;
  const int fd = open_regular(path, O_RDONLY | O_NOCTTY);
  if (fd < 0) return out;
  struct stat st{};
  if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) > offset) {
    out.resize(std::min<std::uint64_t>(max_bytes, static_cast<std::uint64_t>(st.st_size) - offset));
    std::size_t got = 0;
    while (got < out.size()) {
      ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    out.resize(got);
  }
  ::close(fd);
  return out;
}

bool read_exactly(int fd, char* out, std::size_t n) {
  for (std::size_t got = 0; got < n;) {
    ssize_t r = ::read(fd, out + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

int pread_full(int fd, void* out, std::size_t n, std::uint64_t at) noexcept {
  auto* p = static_cast<char*>(out);
  for (std::size_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? errno : EIO;
    done += static_cast<std::size_t>(r);
  }
  return 0;
}

int pwrite_full(int fd, const void* in, std::size_t n, std::uint64_t at) noexcept {
  const auto* p = static_cast<const char*>(in);
  for (std::size_t done = 0; done < n;) {
    const ssize_t r = ::pwrite(fd, p + done, n - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return EIO;
    done += static_cast<std::size_t>(r);
  }
  return 0;
}

namespace {

// Where a seccomp profile refuses getrandom (ENOSYS, EPERM): the same generator's device.
void urandom(char* out, std::size_t n) {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(std::string("cannot draw random bytes (getrandom refused, /dev/urandom: ") + std::strerror(errno) + ")");
  const bool ok = read_exactly(fd, out, n);
  ::close(fd);
  if (!ok) throw Error("cannot draw random bytes (reading /dev/urandom failed)");
}

}  // namespace

std::string random_bytes(std::size_t n) {
  std::string bytes(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(bytes.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == ENOSYS || errno == EPERM)) {
      urandom(bytes.data() + got, n - got);
      break;
    }
    if (r <= 0) throw Error(std::string("cannot draw random bytes (getrandom: ") + std::strerror(errno) + ")");
    got += static_cast<std::size_t>(r);
  }
  return bytes;
}

std::string random_hex(std::size_t digits) {
  std::string out;
  for (char c : random_bytes((digits + 1) / 2)) {
    auto b = static_cast<unsigned char>(c);
    out += "0123456789abcdef"[b >> 4];
    out += "0123456789abcdef"[b & 15];
  }
  out.resize(digits);
  return out;
}

}  // namespace ddprun

namespace ddprun {

std::string task_refused(const std::string& what, int err) {
  std::string s = "cannot start " + what + ": " + std::strerror(err);
  if (err == EAGAIN) {
    s += " (the kernel refused a new thread or process: raise RLIMIT_NPROC, ulimit -u or LimitNPROC=, which counts "
         "every thread of this user; or the cgroup's pids.max, or kernel.threads-max)";
  }
  return s;
}

void throw_task_refused(const std::string& what, int err) { throw Error(task_refused(what, err)); }

}  // namespace ddprun
