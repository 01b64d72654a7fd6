#include "workers/state_areas.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/common/system.hpp"

namespace ddprun::agent {
namespace {

std::uint64_t mem_total() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  return 0;
}

// The agent's cgroup v2 memory.max ("max": none), or 0.
std::uint64_t cgroup_limit() {
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::ifstream max("/sys/fs/cgroup" + line.substr(3) + "/memory.max");
    std::string v;
    if (max >> v && v != "max") return std::strtoull(v.c_str(), nullptr, 10);
  }
  return 0;
}

}  // namespace

std::uint64_t usable_memory_bytes() {
  std::uint64_t total = mem_total(), limit = cgroup_limit();
  if (total == 0) return limit;
  return limit > 0 && limit < total ? limit : total;
}

StateAreas::StateAreas(int nproc, std::uint64_t budget_bytes) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  per_rank_ = nproc > 0 ? budget_bytes / static_cast<std::uint64_t>(nproc) / page * page : 0;
  for (int r = 0; r < nproc && per_rank_ > 0; ++r) {
    const std::string name = fmt::format("ddprun-state-{}", r);
    int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
      release();
      throw Error(fmt::format("cannot make local rank {}'s state area (memfd_create: {}); run with --no_state",
                              r, std::strerror(errno)));
    }
    fds_.push_back(fd);
    // Sized once, then sealed: the size is the rank's hard bound, and F_SEAL_SEAL keeps a worker
    // from adding F_SEAL_WRITE, which would leave the next attempt an area it cannot write.
    if (::ftruncate(fd, static_cast<off_t>(per_rank_)) != 0 ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
      const int e = errno;
      release();
      errno = e;
      throw Error(fmt::format("cannot size local rank {}'s state area to {} bytes ({}); lower --state_memory",
                              r, per_rank_, std::strerror(errno)));
    }
  }
}

StateAreas::~StateAreas() { release(); }

void StateAreas::release() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

void StateAreas::begin_course(int round) const {
  if (round <= 0 || round >= (1 << 22)) return;
  const std::uint64_t floor = static_cast<std::uint64_t>(round) << state_layout::kCourseShift;
  for (int i = 0; i < ranks(); ++i) {
    const int fd = fds_[static_cast<std::size_t>(i)];
    unsigned char word[8];
    if (const int e = pread_full(fd, word, 8, state_layout::kLatestAt)) {
      spdlog::warn("ddprun: round {}: local rank {}'s state area cannot be read ({}): its saves keep the last "
                   "round's course", round, i, std::strerror(e));
      continue;
    }
    const auto latest = state_layout::read_at<std::uint64_t>(word);
    if ((latest >> 1) >= floor) continue;
    state_layout::write_at(word, floor << 1 | (latest & 1));
    if (const int e = pwrite_full(fd, word, 8, state_layout::kLatestAt)) {
      spdlog::warn("ddprun: round {}: local rank {}'s state area cannot be written ({}): its saves keep the last "
                   "round's course", round, i, std::strerror(e));
    }
  }
}

int StateAreas::fd(int local_rank) const {
  return local_rank >= 0 && local_rank < ranks() ? fds_[static_cast<std::size_t>(local_rank)] : -1;
}

std::uint64_t StateAreas::resident_bytes() const {
  std::uint64_t sum = 0;
  for (int fd : fds_) {
    struct stat st{};
    if (::fstat(fd, &st) == 0) sum += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return sum;
}

}  // namespace ddprun::agent
