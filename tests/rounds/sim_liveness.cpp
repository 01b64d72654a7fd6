// The simulator's liveness check: once the faults stop, which nodes must have settled, and how
// (sim_world.hpp).
#include <algorithm>
#include <sstream>

#include "sim_world.hpp"

namespace ddprun::rounds::sim {
namespace {

// Told that its job finished (a node of a finished job ends so; "done": it succeeded while the
// node waited outside it for a place).
bool told(const Node* n) {
  return n->state == Node::State::failed && (n->why.rfind("finished", 0) == 0 || n->why.rfind("done", 0) == 0);
}

}  // namespace

// Once the job finished (or a node was told so: the one that finished it may have crashed
// before saying so), every node of it has ended: done, told, crashed, or cut off by a failed
// connection (a fault before the quiet time: nothing restarts a node of a finished job). A
// timeout, a rank in use or any other failure is no way for a node of a finished job to end.
// Nodes whose first look came close_timeout after the end are a relaunch (nothing tells them
// apart from one): they settle as a job of their own, in one closed round, or, fewer than MIN,
// wait and end at join_timeout (to be started again by a restart policy, and wait again).
bool World::settled_after_finish() {
  for (const Node* n : current_nodes_) {
    if (told(n) && refused_relaunch(*n)) return false;
  }
  auto cut = [](const Node* n) { return n->state == Node::State::failed && n->why.rfind("simulated:", 0) == 0; };
  std::vector<const Node*> relaunch;
  for (const Node* n : current_nodes_) {
    if (n->state == Node::State::done || told(n) || cut(n) || (!n->alive && n->state != Node::State::failed)) continue;
    auto end = finished_at_.find(n->launch);
    if (!launch_finished_[n->launch] || end == finished_at_.end() || !n->first_look ||
        *n->first_look < end->second + s_.opt.close_timeout) return false;
    relaunch.push_back(n);
  }
  const int k = static_cast<int>(relaunch.size());
  if (k + static_cast<int>(restarts_.size()) < s_.min_nodes) {
    // Too few to close a round: they wait, end at join_timeout, and are started again (a restart
    // policy); nothing else.
    return std::all_of(relaunch.begin(), relaunch.end(), [](const Node* n) {
      return n->state == Node::State::joining || n->state == Node::State::starting ||
             (n->state == Node::State::failed && n->why.rfind("timeout", 0) == 0);
    });
  }
  if (!restarts_.empty()) return false;
  return std::all_of(relaunch.begin(), relaunch.end(), [&](const Node* n) {
    return n->state == Node::State::running && n->round == relaunch[0]->round && n->epoch == relaunch[0]->epoch &&
           n->group_world == k;
  });
}

// A node of a job that has not finished, told "finished" although its first look at the run came
// close_timeout after every marker of an earlier job: a relaunch refused (etcd's marker refused it
// for ten minutes before: "a relaunch must not wait 10 minutes").
bool World::refused_relaunch(const Node& n) {
  if (launch_finished_[n.launch] || !n.first_look) return false;
  std::optional<Time> last;
  for (const auto& [launch, at] : last_marked_) {
    if (launch < n.launch) last = std::max(last.value_or(at), at);
  }
  return last && *n.first_look >= *last + s_.opt.close_timeout;
}

bool World::settled() {
  if (launch_finished_[launch_] || std::any_of(current_nodes_.begin(), current_nodes_.end(), told)) return settled_after_finish();
  const Node* first = current_nodes_[0];
  for (const Node* n : current_nodes_) {
    if (!n->alive || n->state != Node::State::running || n->round != first->round || n->epoch != first->epoch ||
        n->group_world != s_.nodes) return false;
  }
  return true;
}

std::string World::check_quiet_liveness() {
  std::ostringstream o;
  o << "liveness: " << std::chrono::duration_cast<std::chrono::seconds>(kQuietBound).count()
    << " s after the faults stopped, not every node is in one closed round (or done):";
  for (const Node* n : current_nodes_) {
    o << " " << n->id << "=";
    switch (n->state) {
      case Node::State::starting: o << "starting"; break;
      case Node::State::joining: o << "joining"; break;
      case Node::State::running: o << "running r" << n->round << "/" << n->group_world; break;
      case Node::State::done: o << "done"; break;
      case Node::State::failed: o << "failed(" << n->why << ")"; break;
      case Node::State::crashed: o << "crashed"; break;
    }
  }
  return o.str();
}

}  // namespace ddprun::rounds::sim
