#include "containment/private_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <new>
#include <cstdio>
#include <cstring>

#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"

namespace ddprun::agent {

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

void check_private(int fd, const std::string& shown, bool want_dir) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw Error("cannot inspect '" + shown + "': " + std::strerror(errno));
  const char* kind = want_dir ? "directory" : "file";
  if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    throw Error("'" + shown + "' is not a " + kind + ": refusing to use it for this job's logs");
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error("the " + std::string(kind) + " '" + shown + "' belongs to uid " + std::to_string(st.st_uid) +
                " with mode " + mode + ": another user could read or change this job's logs through it; remove it, "
                "or choose another --log_dir or --rdzv_id");
  }
}

void throw_log_dir_error(int err, const std::string& what) {
  // A path no run can use (bad usage: exit 2), or a disk full, a quota, an I/O error (exit 1:
  // a restart elsewhere may do).
  if (err == ENOTDIR || err == ELOOP || err == EACCES || err == EPERM || err == EROFS || err == ENAMETOOLONG ||
      err == ENOENT) {
    throw UsageError(what);
  }
  throw Error(what);
}

Fd open_private_dir(int parent, const std::string& name, const std::string& shown) {
  if (::mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) {
    const int e = errno;
    throw_log_dir_error(e, "cannot create the log directory '" + shown + "': " + std::strerror(e) +
                               " (choose another --log_dir)");
  }
  Fd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    int e = errno;
    if (e == ELOOP || e == ENOTDIR) {
      throw UsageError("'" + shown + "' is a link or not a directory: refusing to write this job's logs through it; remove "
                  "it, or choose another --log_dir or --rdzv_id");
    }
    throw_log_dir_error(e, "cannot open the log directory '" + shown + "': " + std::strerror(e) +
                               " (choose another --log_dir)");
  }
  check_private(fd.get(), shown, true);
  return fd;
}

Fd open_private_file(const std::string& path, int flags) {
  // Never waited on as a FIFO's other end; anything but a regular file is bad input (exit 2).
  Fd fd(open_regular(path, O_WRONLY | O_CREAT | O_NOFOLLOW | flags));
  if (fd.get() < 0) {
    int e = errno;
    if (e == ENXIO) throw UsageError("'" + path + "' is not a file (a FIFO or socket with no reader, or a device without one): choose a file's path");
    if (e == EINVAL) throw UsageError("'" + path + "' is not a file: choose a file's path");
    struct stat st{};
    // ELOOP, or EACCES where the kernel protects links in sticky directories (fs.protected_symlinks).
    if (e == ELOOP || (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))) {
      throw Error("'" + path + "' is a link: refusing to write through it; remove it or choose another path");
    }
    throw Error("cannot open '" + path + "': " + std::strerror(e));
  }
  check_private(fd.get(), path, false);
  return fd;
}

namespace {

// remove_tree below the directory `parent`, on the file system `dev` only. The entries are read
// with getdents64 (fdopendir added two fcntl, a stat and a 32 KiB allocation per directory),
// into a buffer on the heap: one on the stack would overflow it in a tree a few thousand levels
// deep, which a worker can make. A directory found not empty at the end (an entry skipped
// while others went) is read again, at most twice.
void remove_below(int parent, const char* name, dev_t dev) {
  int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_dev != dev) {  // a mount point: what is mounted stays
    ::close(fd);
    return;
  }
  constexpr std::size_t kBuf = 4096;
  std::unique_ptr<char[]> buf(new (std::nothrow) char[kBuf]);
  if (!buf) {
    ::close(fd);
    return;
  }
  for (int pass = 0; pass < 3; ++pass) {
    if (pass > 0 && ::lseek(fd, 0, SEEK_SET) != 0) break;
    for (;;) {
      ssize_t n = ::getdents64(fd, buf.get(), kBuf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        auto* e = reinterpret_cast<struct dirent64*>(buf.get() + off);
        off += e->d_reclen;
        const char* entry = e->d_name;
        if (entry[0] == '.' && (entry[1] == '\0' || (entry[1] == '.' && entry[2] == '\0'))) continue;
        if (e->d_type == DT_DIR) {
          remove_below(fd, entry, dev);
        } else if (::unlinkat(fd, entry, 0) != 0 && (errno == EISDIR || errno == EPERM)) {
          remove_below(fd, entry, dev);  // a directory the file system did not type
        }
      }
    }
    if (::unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY) break;
  }
  ::close(fd);
}

}  // namespace

// Each directory opened once (std::filesystem::remove_all opened each twice, with a stat and two
// fcntl each time: half of a one-worker job's teardown). unlinkat never follows a link, a
// directory is opened without following one, and nothing is removed across a mount point (a
// worker running as root may mount something in its directory).
void remove_tree(int parent, const char* name) {
  if (::unlinkat(parent, name, 0) == 0 || (errno != EISDIR && errno != EPERM)) return;
  struct stat top{};
  if (::fstatat(parent, name, &top, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(top.st_mode)) return;
  remove_below(parent, name, top.st_dev);
}

}  // namespace ddprun::agent
