#include "reducer_setup.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "ddprun/common/error.hpp"
#include "host_gather.hpp"

namespace ddprun::runtime {
namespace {

struct Summary {
  std::int64_t params = 0;
  std::int64_t elements = 0;
  std::int64_t hash = 0;  // of every (count, type), in order
  bool operator==(const Summary& o) const { return params == o.params && elements == o.elements && hash == o.hash; }
};

Summary summarize(const std::vector<ParameterSpec>& params) {
  Summary s;
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xFF)) * 1099511628211ull;
  };
  for (const auto& p : params) {
    mix(p.count);
    mix(static_cast<std::uint64_t>(p.type));
    s.elements += static_cast<std::int64_t>(p.count);
  }
  s.params = static_cast<std::int64_t>(params.size());
  s.hash = static_cast<std::int64_t>(h);
  return s;
}

std::string describe(const Summary& s) {
  return std::to_string(s.params) + " parameter" + (s.params == 1 ? "" : "s") + " of " + std::to_string(s.elements) +
         " elements";
}

}  // namespace

void agree_on_parameters(ProcessGroup& group, const std::vector<ParameterSpec>& params) {
  const int n = group.size();
  if (n == 1) return;
  Summary mine = summarize(params);
  const auto all = all_gather_on_host(group, {mine.params, mine.elements, mine.hash});
  std::vector<std::pair<Summary, std::string>> kinds;  // summary, its ranks
  for (int r = 0; r < n; ++r) {
    Summary s{all[3 * r], all[3 * r + 1], all[3 * r + 2]};
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == s; });
    if (it == kinds.end()) {
      kinds.push_back({s, std::to_string(r)});
    } else {
      it->second += "," + std::to_string(r);
    }
  }
  if (kinds.size() == 1) return;
  std::string text;
  for (const auto& [s, ranks] : kinds) {
    text += (text.empty() ? "" : "; ") + std::string(ranks.find(',') == std::string::npos ? "rank " : "ranks ") +
            ranks + ": " + describe(s);
  }
  bool same_totals = kinds[0].first.params == kinds[1].first.params && kinds[0].first.elements == kinds[1].first.elements;
  throw UsageError("Reducer: the ranks registered different parameters (" + text + ")" +
                   (same_totals ? ", the same totals but different sizes, types or order" : "") +
                   "; every rank must register the same parameters, in the same order");
}

void require_parameter_data(const std::vector<ParameterSpec>& params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].data) {
      throw UsageError("Reducer: parameter " + std::to_string(i) +
                       " has no data: set ParameterSpec::data so that rank 0's values reach every rank at "
                       "construction (as PyTorch's DDP does), or set ReducerOptions::broadcast_parameters = false "
                       "if the program makes the replicas identical itself");
    }
  }
}

void broadcast_parameters(ProcessGroup& group, const std::vector<ParameterSpec>& params) {
  require_parameter_data(params);
  for (const auto& p : params) group.broadcast(p.data, p.count, p.type, 0);
}

}  // namespace ddprun::runtime
