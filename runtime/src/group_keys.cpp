#include "group_keys.hpp"

#include <algorithm>
#include <tuple>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"

namespace ddprun::runtime {

std::shared_ptr<rendezvous::Store> next_group_store(const std::shared_ptr<rendezvous::Store>& store, int rank) {
  auto k = store->add("groups/rank_" + std::to_string(rank), 1);
  return std::make_shared<rendezvous::PrefixStore>("group_" + std::to_string(k), store);
}

std::optional<SplitPlan> agree_split(rendezvous::Store& store, int n, int rank, int size, int color, int key,
                                     std::chrono::milliseconds timeout) {
  const std::string base = "split_" + std::to_string(n);
  if (color < 0) color = -1;
  store.set(base + "/rank_" + std::to_string(rank), std::to_string(color) + " " + std::to_string(key));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(base + "/rank_" + std::to_string(r));
  store.wait(keys, timeout);
  auto values = store.multi_get(keys);
  std::vector<std::tuple<int, int>> members;  // (key, rank) of this rank's color
  for (int r = 0; r < size; ++r) {
    auto parts = split(values[static_cast<std::size_t>(r)], ' ');
    auto c = parts.size() == 2 ? parse_int(parts[0]) : std::nullopt;
    auto k = parts.size() == 2 ? parse_int(parts[1]) : std::nullopt;
    if (!c || !k) {
      throw ProtocolError("split: the entry of rank " + std::to_string(r) + " under '" + keys[static_cast<std::size_t>(r)] +
                          "' is malformed: '" + values[static_cast<std::size_t>(r)] + "'");
    }
    if (color >= 0 && *c == color) members.emplace_back(static_cast<int>(*k), r);
  }
  if (color < 0) return std::nullopt;
  std::sort(members.begin(), members.end());
  SplitPlan plan;
  plan.size = static_cast<int>(members.size());
  for (int i = 0; i < plan.size; ++i) {
    if (std::get<1>(members[static_cast<std::size_t>(i)]) == rank) plan.rank = i;
  }
  plan.prefix = base + "/color_" + std::to_string(color);
  return plan;
}

std::vector<int> checked_members(std::vector<int> ranks, int size) {
  if (ranks.empty()) throw UsageError("new_group: the list of ranks is empty");
  std::sort(ranks.begin(), ranks.end());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size) {
      throw UsageError("new_group: rank " + std::to_string(ranks[i]) + " is not a rank of a group of " +
                       std::to_string(size));
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      throw UsageError("new_group: rank " + std::to_string(ranks[i]) + " is listed twice");
    }
  }
  return ranks;
}

}  // namespace ddprun::runtime
