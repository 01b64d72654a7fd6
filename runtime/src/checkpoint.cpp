#include "ddprun/runtime/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/process_group.hpp"

namespace ddprun::runtime {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'R', 'C', 'K', 'P', '1'};

std::uint64_t fnv1a(std::string_view data) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void write_all(int fd, const void* p, std::size_t n, const std::string& path) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error("checkpoint: cannot write '" + path + "': " + std::strerror(errno));
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

// Creates the temporary file: O_EXCL so an existing file (a stale one from a crashed writer with
// the same pid, or anything planted there) is never written through, O_NOFOLLOW so a symbolic
// link is never followed. A stale file is removed (unlink removes a link itself, not its target)
// and creation retried once.
int create_temporary(const std::string& tmp) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0) fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0) throw Error("checkpoint: cannot create '" + tmp + "': " + std::strerror(errno));
  return fd;
}

void save_checkpoint(const std::string& path, std::string_view data) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = create_temporary(tmp);
  try {
    std::uint64_t size = data.size(), sum = fnv1a(data);
    write_all(fd, kMagic, sizeof(kMagic), tmp);
    write_all(fd, &size, sizeof(size), tmp);
    write_all(fd, data.data(), data.size(), tmp);
    write_all(fd, &sum, sizeof(sum), tmp);
    if (::fsync(fd) != 0) throw Error("checkpoint: cannot sync '" + tmp + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // close() can report a write error that fsync() did not (NFS, quotas): the data is not safe.
  if (::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("checkpoint: writing '" + tmp + "' failed on close: " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("checkpoint: cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(e));
  }
  // Make the rename itself durable; until then a crash may bring back the previous checkpoint.
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    throw Error("checkpoint: '" + path + "' is written, but its directory '" + dir + "' cannot be opened to sync it: " +
                std::strerror(errno) + " (a crash now may bring back the previous checkpoint)");
  }
  int rc = ::fsync(dfd);
  int e = errno;
  ::close(dfd);
  if (rc != 0 && e != EINVAL && e != EROFS) {  // EINVAL/EROFS: the file system cannot sync directories
    throw Error("checkpoint: '" + path + "' is written, but syncing its directory '" + dir + "' failed: " +
                std::strerror(e) + " (a crash now may bring back the previous checkpoint)");
  }
}

// One read into one buffer of the file's size; the payload is moved to the front in place.
std::optional<std::string> load_checkpoint(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw Error("checkpoint: cannot read '" + path + "': " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("checkpoint: '" + path + "' is not a regular file");
  }
  std::string all(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t have = 0;
  while (have < all.size()) {
    ssize_t n = ::read(fd, all.data() + have, all.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      throw Error("checkpoint: cannot read '" + path + "': " + std::strerror(e));
    }
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  ::close(fd);
  all.resize(have);
  const std::size_t header = sizeof(kMagic) + 8;
  if (all.size() < header + 8 || std::memcmp(all.data(), kMagic, sizeof(kMagic)) != 0) {
    throw Error("checkpoint: '" + path + "' is not a ddprun checkpoint (bad header); delete it to start afresh");
  }
  std::uint64_t size, sum;
  std::memcpy(&size, all.data() + sizeof(kMagic), 8);
  if (size != all.size() - header - 8) {
    throw Error("checkpoint: '" + path + "' is truncated or damaged (" + std::to_string(all.size()) + " bytes)");
  }
  std::memcpy(&sum, all.data() + header + size, 8);
  if (fnv1a(std::string_view(all).substr(header, size)) != sum) {
    throw Error("checkpoint: '" + path + "' is damaged (checksum mismatch)");
  }
  all.erase(0, header);
  all.resize(size);
  return all;
}

// Every rank confirms first (a barrier: it got here, so its step, gradient sync included,
// succeeded): a rank whose collective failed never reaches it, the barrier fails on every rank,
// and rank 0 writes nothing. Then rank 0 writes, and a second barrier keeps every rank from
// racing ahead of a checkpoint it may later need.
void save_checkpoint_on_rank0(ProcessGroup& group, const std::string& path, std::string_view data) {
  group.barrier();
  if (group.rank() == 0) save_checkpoint(path, data);
  group.barrier();
}

}  // namespace ddprun::runtime
