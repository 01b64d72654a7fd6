#pragma once
// The keys of an in-memory backend, kept as a store and etcd keep them: a put overwrites, a create
// keeps the first writer's value, an add counts from 0, and clear_run deletes every key but the
// run's `finished` markers. Two backends hold them: FakeWorld (fake_backend.hpp: the rules'
// nodes as threads, on real time) and the simulator's World (sim_world.hpp: nodes as fibers on
// virtual time, every call a step of its schedule). `Meta` is what a backend keeps beside a
// value (the simulator: its lifetime, its writer, when a marker expires).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "ddprun/common/text.hpp"

namespace ddprun::rounds::testing {

template <class Meta = std::monostate>
class MemoryKeys {
 public:
  struct Entry {
    std::string value;
    Meta meta{};
  };

  const Entry* find(const std::string& k) const {
    auto it = keys_.find(k);
    return it == keys_.end() ? nullptr : &it->second;
  }
  std::optional<std::string> get(const std::string& k) const {
    const Entry* e = find(k);
    return e ? std::optional(e->value) : std::nullopt;
  }
  bool has(const std::string& k) const { return keys_.count(k) > 0; }
  const Entry& put(const std::string& k, Entry e) { return keys_[k] = std::move(e); }
  // The entry that stands, and whether it is this one (the key was free).
  std::pair<const Entry&, bool> create(const std::string& k, Entry e) {
    auto [it, made] = keys_.emplace(k, std::move(e));
    return {it->second, made};
  }
  std::int64_t add(const std::string& k, std::int64_t d) {
    auto& v = keys_[k].value;
    const std::int64_t n = (v.empty() ? 0 : parse_int(v).value_or(0)) + d;
    v = std::to_string(n);
    return n;
  }
  void erase(const std::string& k) { keys_.erase(k); }
  template <class Gone>
  void erase_if(Gone gone) {
    for (auto it = keys_.begin(); it != keys_.end();) it = gone(it->first, it->second) ? keys_.erase(it) : std::next(it);
  }
  void clear_run() {
    erase_if([](const std::string& k, const Entry&) { return k != "finished"; });
  }

 private:
  std::map<std::string, Entry> keys_;
};

}  // namespace ddprun::rounds::testing
