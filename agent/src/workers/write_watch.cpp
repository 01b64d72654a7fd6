#include "workers/write_watch.hpp"

#include "observe/stack_dump.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

namespace ddprun::agent {

std::optional<std::uint64_t> storage_written(pid_t pid, const std::string& proc_root) {
  std::ifstream io(proc_root + "/" + std::to_string(pid) + "/io");
  std::string key;
  std::uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "write_bytes:") return value;
  }
  return std::nullopt;
}

std::vector<pid_t> with_descendants(pid_t pid, const std::string& proc_root) {
  std::vector<pid_t> out{pid};
  for (std::size_t i = 0; i < out.size() && out.size() < 4096; ++i) {
    std::error_code ec;
    const std::string tasks = proc_root + "/" + std::to_string(out[i]) + "/task";
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream children(task.path() / "children");
      pid_t child = 0;
      while (children >> child) {
        if (child > 0 && std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
      }
    }
  }
  return out;
}

std::optional<std::uint64_t> storage_written_below(pid_t pid, const std::string& proc_root) {
  const auto own = storage_written(pid, proc_root);
  if (!own) return std::nullopt;
  std::uint64_t sum = *own;
  const auto all = with_descendants(pid, proc_root);
  for (std::size_t i = 1; i < all.size(); ++i) sum += storage_written(all[i], proc_root).value_or(0);
  return sum;
}

void WriteWatch::look(pid_t pid, Clock::time_point last_step, bool still, bool torch_save,
                      Clock::time_point now) {
  const auto bytes = storage_written_below(pid);
  if (!bytes || pid != pid_ || *bytes < bytes_) {
    if (pid != pid_) rates_.clear(), tentative_.clear(), wrote_ = {};  // another process: nothing of the last one's
    pid_ = bytes ? pid : -1;
    bytes_ = bytes.value_or(0);
    since_ = now;
    return;
  }
  const auto elapsed = now - since_;
  const double secs = std::chrono::duration<double>(elapsed).count();
  const double wrote = static_cast<double>(*bytes - bytes_);
  // A window a step was seen after (strictly: a step is seen at a look, and the window that ends
  // at that look may hold what followed the step) is the pace's.
  while (!tentative_.empty() && tentative_.front().end < last_step) {
    rates_.push_back(tentative_.front());
    tentative_.pop_front();
    if (rates_.size() > kWritingPaceWindows) rates_.pop_front();
  }
  if (!still && !torch_save && paused_) {
    // Stepping again after a save (still, or torch.save): what it wrote since is the save's tail.
    paused_ = false;
    bytes_ = *bytes;
    since_ = now;
    return;
  }
  paused_ = still || torch_save;
  if (!still) {
    if (elapsed < kWritingPaceWindow) return;
    if (!torch_save) {  // while it steps: its own pace, once a step follows
      tentative_.push_back({now, wrote / secs});
      if (tentative_.size() > kWritingPaceWindows) tentative_.pop_front();
    }
  } else {
    tentative_.clear();  // its silence turned into stillness: what it wrote in it is no pace
    double pace = 0;  // bytes a second
    for (const auto& r : rates_) pace = std::max(pace, r.bytes_per_s);
    if (wrote >= static_cast<double>(kWritingBytes) && wrote >= kWritingOverPace * pace * secs) {
      wrote_ = now;  // well above its pace: a save
    } else if (elapsed < kWritingWindow) {
      return;
    }
  }
  bytes_ = *bytes;
  since_ = now;
}

bool WriteWatch::wrote_lately(Clock::time_point now) const {
  return wrote_ != Clock::time_point{} && now - wrote_ < kFlushGrace;
}

bool WriteWatch::saving(Clock::time_point now) const {
  if (pid_ <= 0 || !wrote_lately(now)) return false;
  if (now - wrote_ < kWritingWindow) return true;
  for (pid_t p : with_descendants(pid_)) {
    if (waits_on_disk(p)) return true;
  }
  return false;
}

}  // namespace ddprun::agent
