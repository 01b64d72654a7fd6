#include "keys.hpp"

namespace ddprun::rounds {
namespace {

const char* name_of(Name n) {
  switch (n) {
    case Name::config: return "config";
    case Name::finished: return "finished";
    case Name::rc: return "rc";
    case Name::streak: return "streak";
    case Name::expect: return "expect";
    case Name::join: return "join";
    case Name::node: return "node";
    case Name::rank: return "rank";
    case Name::held: return "held";
    case Name::closed: return "closed";
    case Name::members: return "members";
    case Name::assign: return "assign";
    case Name::store: return "store";
    case Name::alive: return "alive";
    case Name::end: return "end";
    case Name::succeeded: return "succeeded";
    case Name::acked: return "acked";
    case Name::all_acked: return "all_acked";
    case Name::stop_acks: return "stop_acks";
    case Name::stop_seen: return "stop_seen";
  }
  return "?";
}

}  // namespace

std::string Key::family() const {
  std::string s = round >= 0 ? "r" + std::to_string(round) + "/" : "";
  return s + name_of(name) + "/";
}

std::string Key::text() const {
  if (index >= 0) return family() + std::to_string(index);
  return (round >= 0 ? "r" + std::to_string(round) + "/" : "") + name_of(name);
}

}  // namespace ddprun::rounds
