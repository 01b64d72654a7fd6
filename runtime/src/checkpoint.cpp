#include "ddprun/runtime/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ddprun/rendezvous/error.hpp"
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

void save_checkpoint(const std::string& path, std::string_view data) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("checkpoint: cannot create '" + tmp + "': " + std::strerror(errno));
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
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("checkpoint: cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(e));
  }
  // Make the rename itself durable.
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::optional<std::string> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (::access(path.c_str(), F_OK) != 0) return std::nullopt;
    throw Error("checkpoint: cannot read '" + path + "'");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
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
  std::string data = all.substr(header, size);
  if (fnv1a(data) != sum) throw Error("checkpoint: '" + path + "' is damaged (checksum mismatch)");
  return data;
}

void save_checkpoint_on_rank0(ProcessGroup& group, const std::string& path, std::string_view data) {
  if (group.rank() == 0) save_checkpoint(path, data);
  group.barrier();
}

}  // namespace ddprun::runtime
