#include "output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <unistd.h>

#include <cerrno>

namespace ddprun::agent {

void write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;  // the console is gone (closed pipe): drop output rather than fail the job
    }
  }
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
    // 0600: what workers print may be private. Created before std::ofstream opens it (which
    // would use 0666 & umask).
    int fd = ::open(route_.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) ::close(fd);
    file_ = std::make_unique<std::ofstream>(route_.file, std::ios::binary | std::ios::trunc);
  }
}

void StreamOutput::write(std::string_view data) {
  if (file_) {
    file_->write(data.data(), static_cast<std::streamsize>(data.size()));
    file_->flush();
  }
  if (route_.console_fd < 0 && !route_.keep_tail) return;
  splitter_.feed(data, [this](std::string_view l) { line(l); });
}

void StreamOutput::finish() {
  splitter_.finish([this](std::string_view l) { line(l); });
  if (file_) file_->flush();
}

void StreamOutput::line(std::string_view l) {
  if (route_.console_fd >= 0) {
    // One write per line: the console sees whole lines, never pieces of two workers' lines.
    scratch_.assign(route_.prefix);
    scratch_.append(l);
    scratch_.push_back('\n');
    write_fully(route_.console_fd, scratch_);
  }
  if (route_.keep_tail) {
    tail_.emplace_back(l.substr(0, 1024));
    if (tail_.size() > kTailLines) tail_.pop_front();
  }
}

}  // namespace ddprun::agent
