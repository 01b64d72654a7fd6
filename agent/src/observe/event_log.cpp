#include "observe/event_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include "ddprun/common/text.hpp"
#include <spdlog/spdlog.h>

#include "containment/containment.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "containment/private_files.hpp"

namespace ddprun::agent {
namespace {

std::string utc_now() {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(ms));
  return buf;
}

}  // namespace

void EventLog::open(const std::string& path, std::string host, std::string run_id) {
  host_ = std::move(host);
  run_id_ = std::move(run_id);
  if (path.empty()) return;
  // Events name the job's command line: a file another user created, or can write, is refused.
  try {
    fd_ = open_private_file(path, O_APPEND).release();
  } catch (const UsageError& e) {  // (a path no run can use: exit 2)
    throw UsageError(std::string("the events file: ") + e.what());
  } catch (const Error& e) {
    throw Error(std::string("the events file: ") + e.what());
  }
}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

void EventLog::emit(const std::string& event, nlohmann::json fields) {
  if (fd_ < 0) return;
  nlohmann::json j = {{"event", event}, {"ts", utc_now()}, {"host", host_}, {"run_id", run_id_}};
  for (auto& [k, v] : fields.items()) j[k] = v;
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(fd_, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      spdlog::warn("ddprun: writing the events file failed ({}); no further events are written", std::strerror(errno));
      ::close(fd_);
      fd_ = -1;
      return;
    }
    off += static_cast<std::size_t>(n);
  }
}

std::optional<long long> cgroup_oom_kills() {
  // The agent's cgroup: its memory.events counts the workers' cgroup below.
  std::string why;
  const std::string dir = own_cgroup_dir(why);
  if (dir.empty()) return std::nullopt;
  for (const auto& line : split(read_file(dir + "/memory.events"), '\n')) {  // "KEY VALUE" lines
    if (line.rfind("oom_kill ", 0) == 0) return parse_int(trim(line.substr(9)));
  }
  return std::nullopt;
}

}  // namespace ddprun::agent
