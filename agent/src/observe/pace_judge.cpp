#include "observe/pace_judge.hpp"

#include <algorithm>

namespace ddprun::agent {

std::vector<PaceJudge::Named> PaceJudge::window(const std::map<int, double>& busy) {
  std::map<int, int> slow = slow_;
  std::vector<Named> named;
  if (busy.size() < 2) return named;
  // The median of the others, as others[others.size() / 2] of the others sorted: from the rank's
  // place among all the shares sorted, once (a window of thousands of ranks stays cheap).
  std::vector<double> sorted;
  for (const auto& [rank, share] : busy) sorted.push_back(share);
  std::sort(sorted.begin(), sorted.end());
  const std::size_t m = (sorted.size() - 1) / 2;
  for (const auto& [rank, share] : busy) {
    const auto at = static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), share) - sorted.begin());
    const double median = m < at ? sorted[m] : sorted[m + 1];
    const bool slow_now = share > kSlowFactor * median && share - median >= kSlowMargin;
    slow[rank] = slow_now ? slow[rank] + 1 : 0;
    if (slow[rank] == kSlowWindows) named.push_back({rank, share, median});
  }
  slow_ = std::move(slow);
  return named;
}

bool PaceJudge::straggler(int rank) const {
  auto it = slow_.find(rank);
  return it != slow_.end() && it->second >= kSlowWindows;
}

}  // namespace ddprun::agent
