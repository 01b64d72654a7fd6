#include "containment/safe_path.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::agent {
namespace {

// Throws when the link `name` in the directory `parent` (found at `shown`) is one the kernel's
// protected_symlinks rule would refuse to follow.
void check_link(int parent, const std::string& name, const std::string& shown) {
  struct stat dir{}, link{};
  if (::fstat(parent, &dir) != 0 || ::fstatat(parent, name.c_str(), &link, AT_SYMLINK_NOFOLLOW) != 0) {
    throw Error("cannot inspect '" + shown + "': " + std::strerror(errno));
  }
  const bool shared = (dir.st_mode & S_ISVTX) && (dir.st_mode & S_IWOTH);
  if (!shared || link.st_uid == ::geteuid() || link.st_uid == dir.st_uid) return;
  throw Error("'" + shown + "' is a symbolic link of uid " + std::to_string(link.st_uid) +
              " in a sticky directory anyone can write to (owned by uid " + std::to_string(dir.st_uid) +
              "): refusing to follow it, as the kernel's fs.protected_symlinks would (it could send this job's logs "
              "anywhere); give the link's target as --log_dir, or remove the link");
}

}  // namespace

Fd open_dir_refusing_planted_links(const std::string& path) {
  if (path.empty()) throw UsageError("the log directory is empty (give --log_dir a path)");
  Fd at(::open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (at.get() < 0) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  std::string shown = path[0] == '/' ? "" : ".";
  for (const auto& name : split(path, '/')) {
    if (name.empty() || name == ".") continue;
    shown += "/" + name;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      fd = ::openat(at.get(), name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) break;
      if (errno == ENOTDIR || errno == ELOOP) {  // a link (or not a directory at all)
        struct stat st{};
        if (::fstatat(at.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
          check_link(at.get(), name, shown);
          fd = ::openat(at.get(), name.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
          if (fd < 0) throw Error("cannot open the log directory '" + shown + "': " + std::strerror(errno));
          break;
        }
        throw UsageError("cannot use '" + shown + "' as a log directory: not a directory");
      }
      if (errno != ENOENT) throw Error("cannot open the log directory '" + shown + "': " + std::strerror(errno));
      if (::mkdirat(at.get(), name.c_str(), 0700) != 0 && errno != EEXIST) {
        const int e = errno;
        throw_log_dir_error(e, "cannot create log directory '" + shown + "': " + std::strerror(e) +
                                   " (choose another --log_dir)");
      }
    }
    if (fd < 0) throw Error("cannot open the log directory '" + shown + "': it keeps changing");
    at = Fd(fd);
  }
  return at;
}

}  // namespace ddprun::agent
