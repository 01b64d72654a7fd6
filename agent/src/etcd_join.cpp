// Joining a round of the etcd rendezvous: arrival, closing (full, or the last call over),
// the members' descriptions, the workers' store of group rank 0.
#include "etcd_rendezvous_core.hpp"

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using json = nlohmann::json;

void EtcdRendezvous::Core::throw_if_stopped(int round) {
  auto end = etcd->get(key(round, "end"));
  if (!end) return;
  auto e = parse_round_end(key(round, "end"), end->value);
  if (e.kind == RoundEnd::Kind::stopped) throw JobStopped(e.signal > 0 ? e.signal : SIGTERM, e.host);
}

std::vector<std::string> EtcdRendezvous::Core::wait_closed(int round, Clock::time_point deadline) {
  std::optional<Clock::time_point> last_call;
  for (;;) {
    throw_if_stopped(round);
    if (auto closed = etcd->get(key(round, "closed"))) {
      auto j = json::parse(closed->value, nullptr, false);
      if (!j.is_array()) throw ProtocolError("rendezvous: malformed value at key '" + key(round, "closed") + "'");
      return j.get<std::vector<std::string>>();
    }
    auto joins = etcd->get_prefix(key(round, "join/"));
    auto rev = etcd->revision();
    int n = static_cast<int>(joins.size()), expect = opt.max_nodes;
    if (auto e = etcd->get(key(round, "expect"))) expect = std::clamp(static_cast<int>(parse_int(e->value).value_or(expect)), 1, opt.max_nodes);
    auto now = Clock::now();
    if (n >= opt.min_nodes && !last_call) last_call = now + opt.last_call_timeout;
    bool full = n >= opt.max_nodes || (n >= opt.min_nodes && n >= expect);
    if (full || (last_call && now >= *last_call)) {
      json members = json::array();
      for (int i = 0; i < std::min(n, opt.max_nodes); ++i) members.push_back(joins[i].key.substr(joins[i].key.rfind('/') + 1));
      etcd->create(key(round, "closed"), members.dump());
      continue;
    }
    if (!last_call && now >= deadline) {
      throw TimeoutError("rendezvous: only " + std::to_string(n) + " of the " + std::to_string(opt.min_nodes) +
                         " nodes needed joined round " + std::to_string(round) + " on etcd at " + where() +
                         " within " + duration_text(opt.join_timeout) + " (join_timeout); start the other nodes, or lower --nnodes");
    }
    auto until = last_call ? *last_call : deadline;
    etcd->watch(key(round, ""), true, rev + 1, std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(until - now), 1ms, 1000ms));
  }
}

RoundInfo EtcdRendezvous::Core::read_round(int round, const std::vector<std::string>& members, int rc) {
  RoundInfo info;
  info.round = round;
  info.world_size = 0;
  info.group_world = static_cast<int>(members.size());
  for (int g = 0; g < info.group_world; ++g) {
    auto kv = etcd->get(key(round, "join/" + members[g]));
    NodeInfo n;
    if (kv) {
      n = parse_node(kv->key, kv->value);
    } else {  // gone already: the round ends at once
      n.host = "?";
      etcd->create(key(round, "end"), round_end_json(RoundEnd::of_node_lost(g, "?", 0)));
    }
    if (members[g] == node_id) info.group_rank = g;
    info.nodes.push_back(n);
  }
  for (int g = 0; g < info.group_world; ++g) {
    if (g < info.group_rank) info.rank_offset += info.nodes[g].nproc;
    info.world_size += info.nodes[g].nproc;
  }
  auto stored_rc = etcd->get(key(round, "rc"));
  info.restart_count = rc >= 0 ? rc : stored_rc ? static_cast<int>(parse_int(stored_rc->value).value_or(0)) : 0;
  publish_store(info);
  return info;
}

void EtcdRendezvous::Core::publish_store(RoundInfo& info) {
  const std::string k = key(info.round, "store");
  if (info.group_rank == 0) {
    if (!worker_store) {
      rendezvous::StoreServerOptions so;
      so.host = "";
      so.port = 0;
      so.same_user = true;
      so.allow = std::vector<std::string>{};
      worker_store = std::make_unique<rendezvous::StoreServer>(so);
      worker_store->start();
    }
    std::vector<std::string> allowed;
    for (const auto& n : info.nodes) allowed.insert(allowed.end(), n.addrs.begin(), n.addrs.end());
    worker_store->set_allow(allowed);
    worker_store->reset();
    std::string host = opt.local_addr.empty() ? host_name() : opt.local_addr;
    etcd->put(k, format_address(host, worker_store->port()));
  }
  const auto deadline = Clock::now() + opt.read_timeout;
  for (;;) {
    throw_if_stopped(info.round);
    if (auto v = etcd->get(k)) {
      auto colon = v->value.rfind(':');
      info.store_host = v->value.substr(0, colon);
      if (!info.store_host.empty() && info.store_host.front() == '[') info.store_host = info.store_host.substr(1, info.store_host.size() - 2);
      info.store_port = static_cast<std::uint16_t>(parse_int(v->value.substr(colon + 1), 0, 65535).value_or(0));
      return;
    }
    if (Clock::now() >= deadline) throw TimeoutError("rendezvous: group rank 0 did not publish the workers' store of round " + std::to_string(info.round));
    etcd->watch(k, false, etcd->revision() + 1, 500ms);
  }
}

void EtcdRendezvous::Core::do_join(int round, int rc) {
  try {
    if (!etcd) {
      etcd = client();
      if (etcd->get(prefix + "/finished")) {
        throw Error("rendezvous: run id '" + prefix.substr(prefix.rfind('/') + 1) + "' already finished on etcd at " +
                    where() + "; give this job a new --rdzv_id");
      }
      start_lease();
    }
    NodeInfo me;
    me.host = opt.local_addr.empty() ? host_name() : opt.local_addr;
    me.addr = opt.local_addr;
    me.nproc = nproc;
    const auto deadline = Clock::now() + opt.join_timeout;
    for (;;) {
      if (rc < 0) {
        if (auto r = etcd->get(prefix + "/round")) round = std::max(round, static_cast<int>(parse_int(r->value).value_or(0)));
      }
      etcd->put(prefix + "/round", std::to_string(round));
      if (rc >= 0) etcd->put(key(round, "rc"), std::to_string(rc));
      etcd->put(key(round, "join/" + node_id), node_json(me), lease);
      auto members = wait_closed(round, deadline);
      if (std::find(members.begin(), members.end(), node_id) != members.end()) {
        current_round = round;
        auto info = read_round(round, members, rc);
        group_world = info.group_world;
        post([l = listener, info] { l->on_round_ready(info); });
        watch(info, members);
        return;
      }
      // The round runs without us: ask it to restart with us in, if it has room.
      if (static_cast<int>(members.size()) < opt.max_nodes) {
        etcd->put(key(round + 1, "expect"), std::to_string(members.size() + 1));
        etcd->create(key(round, "end"), round_end_json(RoundEnd::of_membership(me.host)));
      }
      spdlog::info("ddprun: round {} is full or closed ({} nodes); waiting for the next one", round, members.size());
      rc = -1;
      ++round;
    }
  } catch (const JobStopped& e) {
    std::string msg = "the job was stopped by " + signal_name(e.signal) + " on host " + e.host + " during the rendezvous";
    post([l = listener, msg, code = 128 + e.signal] { l->on_rendezvous_failed(msg, code); });
  } catch (const std::exception& e) {
    post([l = listener, msg = std::string(e.what()), code = exit_code_for(e)] { l->on_rendezvous_failed(msg, code); });
  }
}
}  // namespace ddprun::agent
