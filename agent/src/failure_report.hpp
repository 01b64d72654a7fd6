#pragma once
// The failure summary: which worker failed first (the root cause) and how, what it reported,
// its last stderr lines; then the other failures, one line each.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "ddprun/agent/exit_status.hpp"

namespace ddprun::agent {

struct FailureRecord {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  ExitStatus status;
  std::chrono::system_clock::time_point time;
  std::string host;
  std::string reason;     // "exit code 3", "no heartbeat for 2.0 s", ...
  int exit_code = 1;      // what ddprun exits with if this is the root cause
  bool hang = false;      // it missed its heartbeats (then every node dumps its workers' stacks)
  std::string error_file;  // TORCHELASTIC_ERROR_FILE, if the worker wrote it
  std::string message;     // from the error file
  std::string traceback;   // from the error file
  std::deque<std::string> stderr_tail;
};

// Fills a record, reading the worker's error file (PyTorch's @record JSON) when it exists.
FailureRecord make_failure_record(int rank, int local_rank, pid_t pid, ExitStatus status,
                                  std::chrono::system_clock::time_point time, const std::string& error_file,
                                  std::deque<std::string> stderr_tail);

// Parses PyTorch's error-file JSON: {"message": {"message": M, "extraInfo": {"py_callstack": T}}}
// or {"message": M}. Returns false when the text is not such JSON.
bool parse_error_file(const std::string& text, std::string& message, std::string& traceback);

std::string format_failure_report(const FailureRecord& root, const std::vector<FailureRecord>& others,
                                  const std::string& role, int attempt, int max_restarts);

}  // namespace ddprun::agent
