#pragma once
// Stragglers (README: Hangs, stragglers): a rank whose main thread was busier than kSlowFactor x
// the median of the other ranks, and by at least kSlowMargin of a core, for kSlowWindows windows
// in a row, while every one of them made steps. Under DDP every rank steps at the straggler's
// pace; the others sleep in the gradient all-reduce, waiting for it, so its busy share stands out.
// The same rule judges a node's ranks (WorkerGroup) and, on the node of group rank 0, every rank
// of the job from each node's window (PaceExchange).

#include <map>
#include <vector>

namespace ddprun::agent {

class PaceJudge {
 public:
  static constexpr double kSlowFactor = 1.5, kSlowMargin = 0.25;
  static constexpr int kSlowWindows = 3;

  struct Named {
    int rank = -1;
    double busy = 0, others = 0;  // its share of a core, and the median of the others'
  };
  // One window: the busy share of each rank that made steps in it. Returns the ranks named now:
  // once per run of slow windows, at its kSlowWindows-th. A rank missing from a window (its share
  // unknown) keeps its run as it was.
  std::vector<Named> window(const std::map<int, double>& busy);
  // Whether `rank` is named now (slow in its last kSlowWindows windows or more).
  bool straggler(int rank) const;

 private:
  std::map<int, int> slow_;  // rank -> slow windows in a row
};

}  // namespace ddprun::agent
