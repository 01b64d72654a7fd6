#include "observe/failure_report.hpp"

#include "ddprun/common/system.hpp"

#include <unistd.h>

#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddprun::agent {
namespace {

std::string format_time(std::chrono::system_clock::time_point t) {
  auto secs = std::chrono::system_clock::to_time_t(t);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof(out), "%s.%03d", buf, static_cast<int>(ms));
  return out;
}

void indent(std::ostringstream& os, const std::string& text, const char* pad) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) os << pad << line << "\n";
}

}  // namespace

bool parse_error_file(const std::string& text, std::string& message, std::string& traceback) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return false;
  const auto& m = j["message"];
  if (m.is_string()) {
    message = m.get<std::string>();
    return true;
  }
  if (!m.is_object()) return false;
  if (m.contains("message") && m["message"].is_string()) message = m["message"].get<std::string>();
  if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
    const auto& x = m["extraInfo"];
    if (x.contains("py_callstack") && x["py_callstack"].is_string()) traceback = x["py_callstack"].get<std::string>();
  }
  return true;
}

FailureRecord make_failure_record(int rank, int local_rank, pid_t pid, ExitStatus status,
                                  std::chrono::system_clock::time_point time, const std::string& error_file,
                                  std::deque<std::string> stderr_tail) {
  FailureRecord f;
  f.rank = rank;
  f.local_rank = local_rank;
  f.pid = pid;
  f.status = status;
  f.time = time;
  f.host = host_name();
  f.reason = status.describe();
  f.exit_code = status.shell_code();
  f.stderr_tail = std::move(stderr_tail);
  // The worker wrote it (or put something else there): a regular file only, its first 4 MiB.
  if (auto text = read_worker_file(error_file, 4u << 20); !text.empty()) {
    if (parse_error_file(text, f.message, f.traceback)) {
      f.error_file = error_file;
    } else {
      f.error_file = error_file + " (not PyTorch's error JSON)";
    }
  }
  return f;
}

std::string format_failure_report(const FailureRecord& root, const std::vector<FailureRecord>& others,
                                  const std::string& role, int attempt, int max_restarts,
                                  const std::vector<std::string>& notes, int exits_with) {
  std::ostringstream os;
  os << "\n==================== ddprun: job failed ====================\n";
  if (max_restarts > 0) {
    os << "attempt " << attempt << " (restarts used: " << attempt << " of " << max_restarts << ")\n";
  }
  os << "Root cause (first observed failure):\n";
  os << "  time       : " << format_time(root.time) << "\n";
  os << "  host       : " << root.host << "\n";
  os << "  rank       : " << root.rank << " (local_rank " << root.local_rank << ", role " << role << ")\n";
  os << "  pid        : " << root.pid << "\n";
  os << "  failure    : " << root.reason << "\n";
  if (!root.error_file.empty()) os << "  error file : " << root.error_file << "\n";
  if (!root.message.empty()) {
    os << "  message    :\n";
    indent(os, root.message, "    ");
  }
  if (!root.traceback.empty()) {
    os << "  traceback  :\n";
    indent(os, root.traceback, "    ");
  }
  if (!root.stderr_tail.empty()) {
    os << "  last " << root.stderr_tail.size() << " stderr line" << (root.stderr_tail.size() == 1 ? "" : "s") << ":\n";
    for (const auto& l : root.stderr_tail) os << "    " << l << "\n";
  }
  if (!others.empty()) {
    os << "Other failures:\n";
    for (const auto& f : others) {
      os << "  rank " << f.rank << " (local_rank " << f.local_rank << ", pid " << f.pid << ") at " << format_time(f.time)
         << ": " << f.reason << "\n";
    }
  }
  for (const auto& n : notes) os << n << "\n";
  os << "ddprun exits with " << (exits_with >= 0 ? exits_with : root.exit_code) << "\n";
  os << "=============================================================\n";
  return os.str();
}

}  // namespace ddprun::agent
