#include "observe/pace_judge.hpp"

#include <algorithm>

namespace ddprun::agent {

std::vector<PaceJudge::Named> PaceJudge::window(const std::map<int, double>& busy) {
  std::map<int, int> slow = slow_;
  std::vector<Named> named;
  for (const auto& [rank, share] : busy) {
    std::vector<double> others;
    for (const auto& [o, s] : busy) {
      if (o != rank) others.push_back(s);
    }
    if (others.empty()) continue;
    std::nth_element(others.begin(), others.begin() + static_cast<long>(others.size() / 2), others.end());
    const double median = others[others.size() / 2];
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
