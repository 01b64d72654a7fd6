#pragma once
// Failures attempt after attempt: the same rank failing the same way (a crash loop, which
// restarting will not mend), and the same host causing the restarts (a bad node). Every node
// sees the same root causes, so every node counts the same streaks.

#include <string>

#include "observe/failure_report.hpp"

namespace ddprun::agent {

class FailureStreaks {
 public:
  // The root cause of an attempt that failed.
  void record(const FailureRecord& f) {
    const Signature s{f.rank, f.hang, f.status.signal, f.status.code};
    same_ = seen_any_ && s == last_ ? same_ + 1 : 1;
    host_streak_ = seen_any_ && f.host == host_ ? host_streak_ + 1 : 1;
    last_ = s;
    host_ = f.host;
    seen_any_ = true;
  }
  int same_failure() const { return same_; }  // consecutive attempts ending with the last failure
  int host_streak() const { return host_streak_; }  // consecutive failures on the last one's host
  const std::string& host() const { return host_; }

 private:
  struct Signature {
    int rank;
    bool hang;
    int signal, code;
    bool operator==(const Signature& o) const {
      return rank == o.rank && hang == o.hang && signal == o.signal && code == o.code;
    }
  };
  bool seen_any_ = false;
  Signature last_{};
  int same_ = 0, host_streak_ = 0;
  std::string host_;
};

}  // namespace ddprun::agent
