#pragma once
// Connections of a store with a secret that have not authenticated yet, oldest first, in all
// and per source address. Anyone who can reach the port can open such connections, so they are
// capped, and the oldest makes room for a newcomer: a flood of idle clients without the secret
// cannot keep out a node that has it (a node authenticates within one round trip, while an idle
// connection only ages). Owned by the server; used on its I/O thread only.

#include <chrono>
#include <cstddef>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddprun::rendezvous {

class Connection;

class HandshakeQueue {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  HandshakeQueue(std::size_t max_total, std::size_t max_per_address)
      : max_total_(max_total), max_per_address_(max_per_address) {}

  // Adds `c`, accepted from `address` at `since`, and returns the connections to close to stay
  // within the caps: the oldest of that address first, then the oldest of all (never `c`).
  std::vector<Connection*> add(Connection* c, const std::string& address, TimePoint since);
  // Forgets `c` (it authenticated or closed); no-op when not queued.
  void remove(Connection* c);
  // The oldest connection still authenticating; nullptr when none.
  Connection* oldest() const { return all_.empty() ? nullptr : all_.front().conn; }
  // Connections queued since before `cutoff`, oldest first.
  std::vector<Connection*> older_than(TimePoint cutoff) const;
  std::size_t size() const { return all_.size(); }

 private:
  struct Entry {
    Connection* conn;
    std::string address;
    TimePoint since;
  };
  using EntryList = std::list<Entry>;
  struct Where {
    EntryList::iterator in_all;
    std::list<EntryList::iterator>::iterator in_address;
  };

  std::size_t max_total_;
  std::size_t max_per_address_;
  EntryList all_;  // arrival order
  std::unordered_map<std::string, std::list<EntryList::iterator>> by_address_;
  std::unordered_map<Connection*, Where> where_;
};

}  // namespace ddprun::rendezvous
