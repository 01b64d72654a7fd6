#pragma once
// The failure summary: which worker failed first (the root cause) and how, what it reported,
// its last stderr lines; then the other failures, one line each.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "ddprun/common/exit_status.hpp"
#include "ddprun/rounds/records.hpp"

namespace ddprun::agent {

// A failed worker, as every node of the job reports it (ddprun::rounds carries it to the others).
using rounds::FailureRecord;

// Fills a record, reading the worker's error file (PyTorch's @record JSON) when it exists.
FailureRecord make_failure_record(int rank, int local_rank, pid_t pid, ExitStatus status,
                                  std::chrono::system_clock::time_point time, const std::string& error_file,
                                  std::deque<std::string> stderr_tail);

// Parses PyTorch's error-file JSON: {"message": {"message": M, "extraInfo": {"py_callstack": T}}}
// or {"message": M}. Returns false when the text is not such JSON.
bool parse_error_file(const std::string& text, std::string& message, std::string& traceback);

std::string format_failure_report(const FailureRecord& root, const std::vector<FailureRecord>& others,
                                  const std::string& role, int attempt, int max_restarts,
                                  const std::vector<std::string>& notes = {}, int exits_with = -1);

}  // namespace ddprun::agent
