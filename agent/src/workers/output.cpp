#include "workers/output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <spdlog/spdlog.h>

#include "ddprun/common/thread.hpp"

namespace ddprun::agent {

std::size_t write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return data.size();  // a full disk, a closed console: the caller decides what that means
    }
  }
  return 0;
}

void LineSplitter::feed(std::string_view data, const Sink& sink) {
  auto emit_pieces = [&](bool all) {
    // Pieces of kMaxLine; with `all`, the remainder too (the line ended).
    std::size_t pos = 0;
    while (partial_.size() - pos > kMaxLine) {
      sink(std::string_view(partial_).substr(pos, kMaxLine));
      pos += kMaxLine;
    }
    if (all) {
      sink(std::string_view(partial_).substr(pos));
      partial_.clear();
    } else {
      partial_.erase(0, pos);
    }
  };
  while (!data.empty()) {
    auto nl = data.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(data);
      emit_pieces(false);
      return;
    }
    if (partial_.empty() && nl <= kMaxLine) {
      sink(data.substr(0, nl));  // the common case: no copy
    } else {
      partial_.append(data.substr(0, nl));
      emit_pieces(true);
    }
    data.remove_prefix(nl + 1);
  }
}

void LineSplitter::finish(const Sink& sink) {
  std::size_t pos = 0;
  while (partial_.size() - pos > kMaxLine) {
    sink(std::string_view(partial_).substr(pos, kMaxLine));
    pos += kMaxLine;
  }
  if (pos < partial_.size()) sink(std::string_view(partial_).substr(pos));
  partial_.clear();
}

StreamOutput::StreamOutput(StreamRoute route) : route_(std::move(route)) {
  if (!route_.file.empty()) {
    // 0600: what workers print may be private; O_NOFOLLOW: a link planted there is not followed.
    file_ = ::open(route_.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  }
  if (!route_.duplicate_filters.empty() && !route_.duplicate_file.empty()) {
    duplicate_ = ::open(route_.duplicate_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  }
}

StreamOutput::~StreamOutput() {
  if (file_ >= 0) ::close(file_);
  if (duplicate_ >= 0) ::close(duplicate_);
}

void StreamOutput::write(std::string_view data) {
  if (loss_) {
    loss_->bytes_lost += data.size();
  } else if (file_ >= 0) {
    if (std::size_t missed = write_fully(file_, data); missed > 0) {
      loss_ = FileLoss{route_.file, errno, missed};
      spdlog::warn("ddprun: writing '{}' failed: {}; what follows is not in that file (the console still shows it)",
                   route_.file, std::strerror(loss_->error));
    }
  }
  if (route_.console_fd < 0 && !route_.keep_tail && !capturing_ && duplicate_ < 0) return;
  splitter_.feed(data, [this](std::string_view l) { line(l); });
}

void StreamOutput::finish() {
  splitter_.finish([this](std::string_view l) { line(l); });
}

void StreamOutput::line(std::string_view l) {
  bool duplicate = duplicate_ >= 0 && std::any_of(route_.duplicate_filters.begin(), route_.duplicate_filters.end(),
                                                  [&](const std::string& f) { return l.find(f) != std::string_view::npos; });
  if (route_.console_fd >= 0 || duplicate) {
    // One write per line: the console sees whole lines, never pieces of two workers' lines.
    scratch_.assign(route_.prefix);
    scratch_.append(l);
    scratch_.push_back('\n');
    if (route_.console_fd >= 0) Console::for_fd(route_.console_fd).write(scratch_);
    if (duplicate) write_fully(duplicate_, scratch_);
  }
  if (capturing_ && captured_.size() < kCaptureBytes) {
    captured_.append(l);
    captured_.push_back('\n');
  }
  if (route_.keep_tail) {
    // At most 1 KiB, cut before a character rather than inside one (records carry it as JSON).
    std::size_t cut = std::min<std::size_t>(l.size(), 1024);
    while (cut < l.size() && cut > 0 && (static_cast<unsigned char>(l[cut]) & 0xC0) == 0x80) --cut;
    tail_.emplace_back(l.substr(0, cut));
    if (tail_.size() > kTailLines) tail_.pop_front();
  }
}

struct Console::State {
  int fd;
  std::mutex mu;
  std::condition_variable wake, idle, space;
  std::deque<std::string> queue;
  std::size_t bytes = 0;
  std::size_t dropped = 0;
  std::uint64_t written = 0;  // bytes the console has taken so far: its progress
  bool writing = false;
  bool started = false;
  bool stalled = false;       // took nothing for kStall with the queue full: drop, don't wait

  void run() {
    for (;;) {
      std::string chunk;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [this] { return !queue.empty(); });
        // Coalesce queued lines into one write of up to 64 KiB (whole lines only).
        while (!queue.empty() && (chunk.empty() || chunk.size() + queue.front().size() <= 64 * 1024)) {
          chunk += queue.front();
          bytes -= queue.front().size();
          queue.pop_front();
        }
        writing = true;
      }
      write_fully(fd, chunk);  // may block for as long as the console does not read
      {
        std::lock_guard<std::mutex> lock(mu);
        writing = false;
        written += chunk.size();
        if (stalled && bytes < kCapacity / 2) stalled = false;  // it reads again
      }
      idle.notify_all();
      space.notify_all();
    }
  }
};

Console::Console(int fd) : s_(new State) { s_->fd = fd; }

Console& Console::for_fd(int fd) {
  static Console* out = new Console(STDOUT_FILENO);
  static Console* err = new Console(STDERR_FILENO);
  return fd == STDERR_FILENO ? *err : *out;
}

// A console that reads, however slowly, gets every line: the caller waits for room (the
// workers then wait on their pipes, as with a plain blocking write). One that takes nothing for
// kStall is stalled: its lines are dropped and counted, without waiting, until it reads again.
void Console::write(std::string_view line) {
  std::unique_lock<std::mutex> lock(s_->mu);
  while (s_->bytes + line.size() > kCapacity) {
    if (s_->stalled) {
      ++s_->dropped;
      return;
    }
    auto progress = s_->written;
    s_->space.wait_for(lock, kStall, [&] { return s_->bytes + line.size() <= kCapacity || s_->written != progress; });
    if (s_->written == progress && s_->bytes + line.size() > kCapacity) s_->stalled = true;
  }
  if (!s_->started) {
    start_thread("a console writer thread", [s = s_] { s->run(); }).detach();
    s_->started = true;
  }
  s_->queue.emplace_back(line);
  s_->bytes += line.size();
  s_->wake.notify_one();
}

std::size_t Console::dropped_lines() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->dropped;
}

bool Console::drain(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(s_->mu);
  return s_->idle.wait_for(lock, limit, [this] { return s_->queue.empty() && !s_->writing; });
}

std::size_t console_dropped_lines() {
  return Console::for_fd(STDOUT_FILENO).dropped_lines() + Console::for_fd(STDERR_FILENO).dropped_lines();
}

void write_to_console(const std::string& text) {
  Console::for_fd(STDOUT_FILENO).drain(std::chrono::milliseconds(500));
  Console::for_fd(STDERR_FILENO).drain(std::chrono::milliseconds(500));
  Console::for_fd(STDERR_FILENO).write(text);
}

void flush_console(bool logs_complete) {
  Console::for_fd(STDOUT_FILENO).drain(std::chrono::seconds(2));
  Console::for_fd(STDERR_FILENO).drain(std::chrono::seconds(1));
  std::size_t dropped = console_dropped_lines();
  if (dropped == 0) return;
  write_to_console("ddprun: " + std::to_string(dropped) + " line(s) dropped from the console, which did not keep up" +
                   (logs_complete ? "; the log files are complete\n" : "; --tee 3 keeps complete per-rank log files\n"));
  Console::for_fd(STDERR_FILENO).drain(std::chrono::seconds(1));
}

}  // namespace ddprun::agent
