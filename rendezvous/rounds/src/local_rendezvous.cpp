#include "local_rendezvous.hpp"

#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "workers_store.hpp"

namespace ddprun::rounds {

LocalRendezvous::LocalRendezvous(const RendezvousOptions& opt, Post post, WhenReadable when_readable)
    : host_(opt.store_host), nproc_(opt.nproc),
      node_name_(opt.local_addr.empty() ? host_name() : opt.local_addr), post_(std::move(post)),
      when_readable_(std::move(when_readable)) {
  rendezvous::StoreServerOptions so;
  so.host = opt.store_host;
  so.port = opt.store_port;
  // One node: every worker is a process of this user on this host.
  so.same_user = true;
  so.allow = std::vector<std::string>{};
  so.reserved_fds = 64 + 8 * static_cast<std::size_t>(opt.nproc);
  try {
    store_ = std::make_unique<rendezvous::StoreServer>(so);
  } catch (const AddressInUseError&) {
    throw Error("cannot host the rendezvous store on " + opt.store_host + ":" + std::to_string(opt.store_port) +
                ": the address is already in use (another job?). Use --standalone to pick a free port, or another "
                "port in " + opt.endpoint_port_setting + ".");
  }
  // The workers get the numeric address the store listens on, as with several nodes: a name
  // given as --master_addr (localhost, this host's) is resolved once, here, by the bind (a
  // worker's resolver might answer ::1 first for localhost, where the store does not listen).
  const auto bound = bound_address(store_->listen_fd());
  if (!bound.empty() && bound != "0.0.0.0" && bound != "::") host_ = bound;
  // Listening from here on; its thread starts when the first client connects (join()): a
  // launch whose workers never use the store (not PyTorch) neither starts nor stops one. A
  // client waits in the listen queue meanwhile.
}

LocalRendezvous::~LocalRendezvous() { shutdown(); }

void LocalRendezvous::join(int round, int restart_count, const Streak& streak, const StateOffer&) {
  if (round > 0) store_->reset();  // a restarted group does not see the previous one's keys
  RoundInfo info;
  info.round = round;
  info.restart_count = std::max(restart_count, 0);
  info.streak = streak;
  info.world_size = nproc_;
  info.store_host = host_;
  info.store_port = store_->port();
  NodeInfo me;
  me.host = node_name_;
  me.nproc = nproc_;
  me.node_rank = 0;
  info.nodes = {me};
  post_([l = listener_, info] { l->on_round_ready(info); });
  if (serving_) return;
  serving_ = true;
  auto* s = store_.get();  // (the waits below end with the agent's loop, before the store goes)
  if (when_readable_) {
    when_readable_(s->listen_fd(), [s] { s->start(); });
  } else {
    post_([s] { s->start(); });  // after on_round_ready has started the workers
  }
}

void LocalRendezvous::over(int round, RoundEnd why) {
  if (!ended_.insert(round).second) return;  // the first end of a round wins, as on several nodes
  post_([l = listener_, o = RoundOutcome{round, std::move(why), {}}] { l->on_round_over(o); });
}

void LocalRendezvous::end_round(int round, const RoundEnd& why, int) { over(round, why); }
void LocalRendezvous::report_success(int round) { over(round, RoundEnd::of_success()); }
void LocalRendezvous::finish(int, Ack) {
  post_([l = listener_] { l->on_finished(); });
}
void LocalRendezvous::leave(int, int) {
  post_([l = listener_] { l->on_finished(); });
}

std::vector<HostedStore> LocalRendezvous::hosted_stores() const { return {observe_store("workers", *store_)}; }

void LocalRendezvous::shutdown() {
  if (store_) store_->stop();
}

}  // namespace ddprun::rounds
