#pragma once
// Worker output: split into lines, prefixed, written to the console one whole line per write()
// so lines of different workers never interleave; copied raw to per-rank log files; the last
// stderr lines kept for the failure summary.

#include <chrono>
#include <cstddef>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

// Splits a byte stream into lines. A line longer than kMaxLine is cut into pieces of that size,
// so a writer that never sends a newline cannot make the agent buffer without bound.
class LineSplitter {
 public:
  static constexpr std::size_t kMaxLine = 64 * 1024;
  using Sink = std::function<void(std::string_view line)>;  // without the newline

  void feed(std::string_view data, const Sink& sink);
  void finish(const Sink& sink);  // end of stream: the unterminated tail, if any

 private:
  std::string partial_;
};

// Where one stream (stdout or stderr) of one worker goes.
struct StreamRoute {
  int console_fd = -1;   // 1 or 2; -1 = not on the console
  std::string prefix;    // "[default0]:"
  std::string file;      // raw copy; empty = none
  bool keep_tail = false;  // remember the last lines (stderr, for the failure summary)
  // Lines holding any of these substrings are also appended, prefixed, to duplicate_file
  // (several workers append to one file: one write per line keeps lines whole).
  std::vector<std::string> duplicate_filters;
  std::string duplicate_file;
};

class StreamOutput {
 public:
  static constexpr std::size_t kTailLines = 20;

  explicit StreamOutput(StreamRoute route);
  ~StreamOutput();
  StreamOutput(const StreamOutput&) = delete;
  StreamOutput& operator=(const StreamOutput&) = delete;
  void write(std::string_view data);
  void finish();
  const std::deque<std::string>& tail() const { return tail_; }
  // From now on, lines are also kept (up to kCaptureBytes): a Python worker's traceback.
  void start_capture() { capturing_ = true; }
  const std::string& captured() const { return captured_; }
  // A log file that could not take everything (ENOSPC, EIO): from the first failed write on,
  // nothing more is written to it and what it missed is counted. The console is unaffected.
  struct FileLoss {
    std::string file;
    int error = 0;  // errno of the first failed write
    std::uint64_t bytes_lost = 0;
  };
  const std::optional<FileLoss>& file_loss() const { return loss_; }
  static constexpr std::size_t kCaptureBytes = 1 << 20;
  bool has_file() const { return file_ >= 0; }

 private:
  void line(std::string_view l);

  StreamRoute route_;
  LineSplitter splitter_;
  int file_ = -1;  // the raw copy (route_.file), written unbuffered
  int duplicate_ = -1;  // route_.duplicate_file, opened for appending
  std::optional<FileLoss> loss_;
  std::deque<std::string> tail_;
  std::string scratch_;
  bool capturing_ = false;
  std::string captured_;
};

// Writes all of `data` to fd, retrying on EINTR and short writes. Returns how many bytes it
// could not write (0: all of them; errno tells why).
std::size_t write_fully(int fd, std::string_view data);

// The console (stdout or stderr of ddprun) as workers' lines reach it. A thread of its own
// writes what is queued (up to kCapacity). A console that reads, however slowly, gets every line
// (write() waits for room, as a blocking write did); one that takes nothing for kStall (a
// terminal on hold, a pipe nobody reads) no longer holds the agent: further lines are dropped
// and counted until it reads again, while supervision (crash detection, restarts, SIGKILL) goes
// on. The console's file status flags are not touched: they are shared with the shell.
class Console {
 public:
  static constexpr std::size_t kCapacity = 4 * 1024 * 1024;
  static constexpr std::chrono::milliseconds kStall{1000};
  static Console& for_fd(int fd);  // 1 or 2; lives for the whole process

  void write(std::string_view line);          // one whole line (with its newline)
  std::size_t dropped_lines() const;
  // Waits until what is queued is written, or `limit` passes; false on time-out.
  bool drain(std::chrono::milliseconds limit);

 private:
  explicit Console(int fd);
  struct State;
  State* s_;  // never freed: its thread may be blocked in write() when the process exits
};

// Lines dropped on both consoles so far.
std::size_t console_dropped_lines();

// ddprun's own block of text (the failure summary) after the workers' last lines, through the
// console queue: a console that does not read must not block the agent.
void write_to_console(const std::string& text);
// At the end: what is queued for the console gets a bounded chance to go out; lines the console
// did not take are reported (`logs_complete`: per-rank log files hold everything).
void flush_console(bool logs_complete);

}  // namespace ddprun::agent
