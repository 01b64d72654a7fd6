// The fake's communicators: cliques that ranks join by unique id, rounds where the ranks' n-th
// collectives meet, splits (see fake_nccl.hpp).

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fake_fabric.hpp"

namespace ddprun::runtime::nccl::fake {
namespace {

bool integer(DataType t) { return t == DataType::kInt32 || t == DataType::kInt64; }

// Element i reduced over the ranks' inputs, from element `first` of each.
double reduce(const std::vector<std::shared_ptr<Collective>>& parts, std::size_t first, std::size_t i) {
  const auto& c0 = *parts[0];
  double acc = load(c0.type, c0.in, first + i);
  for (std::size_t r = 1; r < parts.size(); ++r) {
    double v = load(c0.type, parts[r]->in, first + i);
    if (c0.op == ReduceOp::kSum || c0.op == ReduceOp::kAvg) acc += v;
    if (c0.op == ReduceOp::kMin) acc = std::min(acc, v);
    if (c0.op == ReduceOp::kMax) acc = std::max(acc, v);
  }
  if (c0.op == ReduceOp::kAvg) {
    acc /= static_cast<double>(parts.size());
    if (integer(c0.type)) acc = std::trunc(acc);
  }
  return acc;
}

}  // namespace

double load(DataType t, const void* p, std::size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kFloat16: return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DataType::kBFloat16: return bfloat16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DataType::kInt32: return static_cast<const std::int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
  }
  return 0;
}

void store(DataType t, void* p, std::size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DataType::kFloat16: static_cast<std::uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DataType::kBFloat16: static_cast<std::uint16_t*>(p)[i] = float_to_bfloat16(static_cast<float>(v)); break;
    case DataType::kInt32: static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v); break;
    case DataType::kInt64: static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v); break;
  }
}

void execute(const std::vector<std::shared_ptr<Collective>>& parts) {
  const auto& c0 = *parts[0];
  const std::size_t n = parts.size(), esize = element_size(c0.type);
  switch (c0.kind) {
    case Collective::kAllReduce: {
      std::vector<double> out(c0.count);
      for (std::size_t i = 0; i < c0.count; ++i) out[i] = reduce(parts, 0, i);
      for (auto& p : parts) {
        for (std::size_t i = 0; i < c0.count; ++i) store(c0.type, p->out, i, out[i]);
      }
      break;
    }
    case Collective::kBroadcast: {
      std::vector<char> root(static_cast<const char*>(parts[c0.root]->in),
                             static_cast<const char*>(parts[c0.root]->in) + c0.count * esize);
      for (auto& p : parts) std::memcpy(p->out, root.data(), root.size());
      break;
    }
    case Collective::kAllGather: {
      std::vector<char> all(n * c0.count * esize);
      for (std::size_t r = 0; r < n; ++r) std::memcpy(all.data() + r * c0.count * esize, parts[r]->in, c0.count * esize);
      for (auto& p : parts) std::memcpy(p->out, all.data(), all.size());
      break;
    }
    case Collective::kReduceScatter: {
      std::vector<std::vector<double>> blocks(n, std::vector<double>(c0.count));
      for (std::size_t r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < c0.count; ++i) blocks[r][i] = reduce(parts, r * c0.count, i);
      }
      for (std::size_t r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < c0.count; ++i) store(c0.type, parts[r]->out, i, blocks[r][i]);
      }
      break;
    }
  }
}

bool Fabric::start(const std::shared_ptr<Collective>& coll) {
  auto& c = *coll;
  c.arrived = true;
  if (c.fate == Fate::kPeerDies) c.comm->peer_died = true;
  if (c.fate == Fate::kHang || c.fate == Fate::kPeerDies) return false;  // only an abort ends it
  auto& clique = *c.comm->clique;
  auto& round = clique.rounds[c.seq];
  round.resize(static_cast<std::size_t>(clique.size));
  round[static_cast<std::size_t>(c.comm->rank)] = coll;
  bool all = std::all_of(round.begin(), round.end(), [](const auto& p) { return p != nullptr; });
  if (all) finish_round(clique, c.seq);
  return all;
}

void Fabric::finish_round(Clique& clique, int seq) {
  auto parts = std::move(clique.rounds[seq]);
  clique.rounds.erase(seq);
  execute(parts);
  for (auto& p : parts) p->done = true;
}

void Fabric::abort(Comm* comm) {
  comm->aborted = true;  // its queued collectives are dropped by the streams (kernels exit)
  pump();
}

Status Fabric::join(Comm** out, int size, const std::string& id, int rank, int device,
                    std::unique_lock<std::mutex>& lock) {
  auto& clique = cliques[id];
  if (!clique) {
    clique = std::make_shared<Clique>();
    clique->id = id;
    clique->size = size;
  }
  if (clique->size != size || rank < 0 || rank >= size || clique->members.count(rank)) {
    return Status::error("fake: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                         " cannot join communicator '" + id.substr(0, 16) + "...' (taken, or of another size: a stale unique id?)");
  }
  comms.push_back(std::make_unique<Comm>());
  Comm* c = comms.back().get();
  c->clique = clique;
  c->rank = rank;
  c->device = device;
  clique->members[rank] = c;
  cv.notify_all();
  auto cl = clique;
  auto s = wait(lock, [&] { return static_cast<int>(cl->members.size()) == cl->size; }, "communicator init");
  if (!s.is_ok()) return s;
  *out = c;
  return Status::ok();
}

Status Fabric::split(Comm* parent, int color, int key, Comm** child, std::unique_lock<std::mutex>& lock) {
  auto clique = parent->clique;
  int n = parent->next_split++;
  auto& round = clique->splits[n];
  round.asks[parent->rank] = {color, key};
  if (static_cast<int>(round.asks.size()) == clique->size) {
    std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, parent rank)
    for (auto& [r, ck] : round.asks) {
      if (ck.first >= 0) by_color[ck.first].push_back({ck.second, r});
    }
    for (auto& [col, members] : by_color) {
      std::sort(members.begin(), members.end());
      auto sub = std::make_shared<Clique>();
      sub->id = clique->id + "/split" + std::to_string(n) + "/" + std::to_string(col);
      sub->size = static_cast<int>(members.size());
      for (std::size_t i = 0; i < members.size(); ++i) {
        comms.push_back(std::make_unique<Comm>());
        Comm* c = comms.back().get();
        c->clique = sub;
        c->rank = static_cast<int>(i);
        c->device = clique->members[members[i].second]->device;
        sub->members[c->rank] = c;
        round.children[members[i].second] = c;
      }
      cliques[sub->id] = sub;
    }
    round.done = true;
    cv.notify_all();
  }
  auto s = wait(lock, [&] { return clique->splits[n].done || parent->aborted; }, "communicator split");
  if (!s.is_ok()) return s;
  if (parent->aborted) return Status::error("fake: the parent communicator was aborted during the split");
  auto it = clique->splits[n].children.find(parent->rank);
  *child = it == clique->splits[n].children.end() ? nullptr : it->second;
  return Status::ok();
}

}  // namespace ddprun::runtime::nccl::fake
