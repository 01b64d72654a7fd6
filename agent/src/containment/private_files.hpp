#pragma once
// Files and directories nobody else can touch (README: Security). Under a directory others can
// write to (a shared --log_dir, /tmp), another user may have created the names ddprun is about
// to use: a directory or file open to everyone, or a link to somewhere else. So every directory
// ddprun uses below the base is opened with openat(O_NOFOLLOW | O_DIRECTORY) and created 0700
// when missing; one that exists must be this user's and not writable by group or others. Files
// are opened O_NOFOLLOW and, when they existed, must pass the same check. Anything else is
// refused with an error naming the path, the owner and the mode, and nothing is written.

#include <sys/types.h>

#include <string>

namespace ddprun::agent {

// An open descriptor, closed when this goes.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

// The directory `name` (one component) inside `parent`: created 0700 when missing, else checked.
// `shown` is its path in messages. Throws ddprun::Error.
Fd open_private_dir(int parent, const std::string& name, const std::string& shown);

// Opens `path` for writing (flags added to O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW), 0600
// when created; an existing file must be a regular file of this user's, not writable by group
// or others. Throws ddprun::Error.
Fd open_private_file(const std::string& path, int flags);

// Throws `what` about a log directory that could not be made: UsageError where no run could
// use the path (ENOTDIR, ELOOP, EACCES, EPERM, EROFS, ENAMETOOLONG, ENOENT), else Error (a full
// disk, a quota, an I/O error).
[[noreturn]] void throw_log_dir_error(int err, const std::string& what);

// Throws unless the open object `fd` (found at `shown`) is this user's and not writable by group
// or others (and, with `want_dir`, a directory; else a regular file).
void check_private(int fd, const std::string& shown, bool want_dir);

// Removes `name` in the directory `parent` (AT_FDCWD: a path) and everything below it, following
// no link and crossing no mount point; errors are ignored (what cannot be removed stays).
void remove_tree(int parent, const char* name);

}  // namespace ddprun::agent
