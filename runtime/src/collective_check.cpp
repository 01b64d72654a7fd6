#include "collective_check.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/store.hpp"

namespace ddprun::runtime {
namespace {

constexpr std::size_t kBytes = 24;

const char* kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "?";
}

std::string key_of(std::uint64_t seq, int rank) {
  return "collective_check/" + std::to_string(seq) + "/rank_" + std::to_string(rank);
}

}  // namespace

Fingerprint Fingerprint::of(CollectiveKind kind, std::size_t count, DataType type, ReduceOp op, int root) {
  Fingerprint f;
  f.kind = kind;
  f.count = count;
  f.has_type = kind == CollectiveKind::kBarrier ? 0 : 1;
  f.type = f.has_type ? type : DataType::kFloat32;
  const bool reduces = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
  f.op = reduces ? op : ReduceOp::kSum;
  f.root = kind == CollectiveKind::kBroadcast ? root : -1;
  return f;
}

bool Fingerprint::same_call(const Fingerprint& o) const {
  return kind == o.kind && count == o.count && type == o.type && op == o.op && has_type == o.has_type &&
         root == o.root;
}

std::uint16_t Fingerprint::hash() const {
  // FNV-1a over everything but the sequence number, folded to 16 bits.
  std::string b = bytes().substr(8);
  std::uint32_t h = 2166136261u;
  for (unsigned char c : b) h = (h ^ c) * 16777619u;
  auto folded = static_cast<std::uint16_t>((h >> 16) ^ (h & 0xFFFF));
  return folded == 0 ? 1 : folded;
}

std::string Fingerprint::describe() const {
  std::string s = kind_name(kind);
  if (kind == CollectiveKind::kBarrier) return s + "()";
  s += "(count " + std::to_string(count) + ", " + name(type);
  if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter) s += std::string(", ") + name(op);
  if (kind == CollectiveKind::kBroadcast) s += ", root " + std::to_string(root);
  return s + ")";
}

std::string Fingerprint::bytes() const {
  std::string b(kBytes, '\0');
  std::memcpy(b.data(), &seq, 8);
  std::memcpy(b.data() + 8, &count, 8);
  b[16] = static_cast<char>(kind);
  b[17] = static_cast<char>(type);
  b[18] = static_cast<char>(op);
  b[19] = static_cast<char>(has_type);
  std::memcpy(b.data() + 20, &root, 4);
  return b;
}

std::optional<Fingerprint> Fingerprint::from_bytes(const std::string& b) {
  if (b.size() != kBytes) return std::nullopt;
  Fingerprint f;
  std::memcpy(&f.seq, b.data(), 8);
  std::memcpy(&f.count, b.data() + 8, 8);
  f.kind = static_cast<CollectiveKind>(b[16]);
  f.type = static_cast<DataType>(b[17]);
  f.op = static_cast<ReduceOp>(b[18]);
  f.has_type = static_cast<std::uint8_t>(b[19]);
  std::memcpy(&f.root, b.data() + 20, 4);
  return f;
}

std::uint32_t collective_tag(const Fingerprint& fp) {
  return (static_cast<std::uint32_t>(fp.hash()) << 16) | static_cast<std::uint32_t>(fp.seq & 0xFFFF);
}

std::uint32_t check_tag(std::uint64_t seq) { return static_cast<std::uint32_t>(seq & 0xFFFF); }

namespace {

// Ranks grouped by the call they made, in order of each call's lowest rank; empty when they all
// made the same call.
std::string grouped_text(const std::vector<std::pair<int, Fingerprint>>& calls_by_rank) {
  std::vector<std::pair<Fingerprint, std::vector<int>>> calls;
  for (const auto& [rank, fp] : calls_by_rank) {
    auto it = std::find_if(calls.begin(), calls.end(), [&](const auto& c) { return c.first.same_call(fp); });
    if (it == calls.end()) {
      calls.push_back({fp, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  if (calls.size() <= 1) return {};
  std::string text;
  for (const auto& [fp, ranks] : calls) {
    std::string who;
    for (std::size_t k = 0; k < ranks.size() && k < 8; ++k) who += (k ? "," : "") + std::to_string(ranks[k]);
    if (ranks.size() > 8) who += " and " + std::to_string(ranks.size() - 8) + " more";
    text += (text.empty() ? "" : "; ") + std::string(ranks.size() == 1 ? "rank " : "ranks ") + who + " called " +
            fp.describe();
  }
  return text;
}

}  // namespace

std::string mismatch_text(const std::vector<Fingerprint>& by_rank) {
  std::vector<std::pair<int, Fingerprint>> calls;
  for (std::size_t r = 0; r < by_rank.size(); ++r) calls.push_back({static_cast<int>(r), by_rank[r]});
  return grouped_text(calls);
}

std::string compare_through_store(rendezvous::Store& store, const Fingerprint& mine, int rank, int size,
                                  std::chrono::milliseconds grace) {
  try {
    store.set(key_of(mine.seq, rank), mine.bytes());
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key_of(mine.seq, r));
    try {
      store.wait(keys, grace);
    } catch (const TimeoutError&) {
      // Compare with the ranks that answered: one that is elsewhere says nothing.
    }
    std::vector<std::pair<int, Fingerprint>> answered;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) continue;
      if (auto fp = Fingerprint::from_bytes(store.get(keys[r]))) answered.push_back({r, *fp});
    }
    return grouped_text(answered);
  } catch (...) {
    return {};
  }
}

std::string mismatch_message(const char* what, const Fingerprint& fp, int rank, int size,
                             const std::string& timed_out_after, const std::string& diff) {
  return std::string("gloo: ") + what + " #" + std::to_string(fp.seq) + " on rank " + std::to_string(rank) + " of " +
         std::to_string(size) + (timed_out_after.empty() ? "" : " timed out after " + timed_out_after) +
         ": the ranks called different collectives: " + diff +
         ". Every rank must call the same collectives in the same order, with the same count, type, reduction and "
         "root" +
         (timed_out_after.empty() ? "" : " (DDPRUN_DISTRIBUTED_DEBUG=detail finds this before the time-out)");
}

bool distributed_debug_from_env() {
  const char* v = std::getenv("DDPRUN_DISTRIBUTED_DEBUG");
  if (!v) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s.empty() || s == "off") return false;
  if (s == "detail") return true;
  throw UsageError("DDPRUN_DISTRIBUTED_DEBUG=" + std::string(v) +
                   " is not one of off, detail (detail checks before each collective that every rank calls the same "
                   "one)");
}

}  // namespace ddprun::runtime
