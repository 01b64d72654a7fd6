#include "handshake_queue.hpp"

#include <algorithm>

namespace ddprun::rendezvous {

std::vector<Connection*> HandshakeQueue::add(Connection* c, const std::string& address, TimePoint since) {
  all_.push_back(Entry{c, address, since});
  auto entry = std::prev(all_.end());
  auto& mine = by_address_[address];
  mine.push_back(entry);
  where_[c] = Where{entry, std::prev(mine.end())};
  std::vector<Connection*> evict;
  // `mine` and `all_` list `c` last, so the fronts are older connections, never `c` itself.
  for (auto it = mine.begin(); mine.size() - evict.size() > max_per_address_; ++it) evict.push_back((*it)->conn);
  std::size_t total = all_.size() - evict.size();
  for (auto it = all_.begin(); total > max_total_ && it->conn != c; ++it) {
    if (std::find(evict.begin(), evict.end(), it->conn) != evict.end()) continue;
    evict.push_back(it->conn);
    --total;
  }
  return evict;
}

void HandshakeQueue::remove(Connection* c) {
  auto w = where_.find(c);
  if (w == where_.end()) return;
  auto a = by_address_.find(w->second.in_all->address);
  a->second.erase(w->second.in_address);
  if (a->second.empty()) by_address_.erase(a);
  all_.erase(w->second.in_all);
  where_.erase(w);
}

std::vector<Connection*> HandshakeQueue::older_than(TimePoint cutoff) const {
  std::vector<Connection*> out;
  for (auto it = all_.begin(); it != all_.end() && it->since < cutoff; ++it) out.push_back(it->conn);
  return out;
}

}  // namespace ddprun::rendezvous
