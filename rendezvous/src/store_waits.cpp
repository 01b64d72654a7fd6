// StoreCore: WAIT and WATCH_KEY registrations. A pending WAIT is owned by its session and listed
// under each key it still waits for; an entry knows its place in both, so a WAIT is answered,
// cancelled or dropped with its connection in time proportional to its own keys, and nothing
// of it stays behind (its memory is released when it is: the budget stays exact).

#include <algorithm>

#include "ddprun/common/text.hpp"
#include "store_core.hpp"

namespace ddprun::rendezvous {
namespace {

const Message& stop_waiting() {
  static const Message m(std::string(1, static_cast<char>(wire::kStopWaiting)));
  return m;
}

// Vectors whose size fell under a quarter of their capacity give the rest back, so that the
// flat per-entry charges cover them.
template <typename V>
void trim(V& v) {
  if (v.capacity() > 16 && v.size() * 4 < v.capacity()) v.shrink_to_fit();
}

std::size_t list_cost(std::string_view key) { return cost::kWaitList + cost::string_heap(key.size()); }

}  // namespace

void StoreCore::add_wait(Session& session, const std::vector<std::string>& keys, Message& out) {
  std::vector<HashedKey> missing;
  for (const auto& k : keys) {
    auto h = hashed(k);
    if (!exists(h)) missing.push_back(h);
  }
  // Duplicate keys in one WAIT must count once, or a single SET could never finish the wait.
  std::sort(missing.begin(), missing.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  missing.erase(std::unique(missing.begin(), missing.end(),
                            [](const auto& a, const auto& b) { return a.key == b.key; }),
                missing.end());
  if (missing.empty()) return wire::put_u8(out.text(), wire::kStopWaiting);
  if (session.wait_keys + missing.size() > limits_.max_waits_per_connection) {
    throw LimitError("WAIT on " + std::to_string(missing.size()) + " key(s) would make this connection wait on " +
                     std::to_string(session.wait_keys + missing.size()) + " keys, over --max_waits_per_connection=" +
                     std::to_string(limits_.max_waits_per_connection));
  }
  std::size_t waiter = cost::kWaiter + cost::malloc_bytes(missing.size() * sizeof(Waiter::Key)) +
                       missing.size() * cost::kWaitKey;
  std::size_t lists = 0;
  for (const auto& k : missing) lists += waiters_.contains(k) ? 0 : list_cost(k.key);
  require(waiter + lists, 0, "WAIT", missing.front().key);
  auto w = std::make_unique<Waiter>();
  w->session = &session;
  w->missing = missing.size();
  w->keys.reserve(missing.size());
  w->charged = waiter;
  charge(waiter);
  for (const auto& k : missing) {
    auto [e, fresh] = waiters_.try_emplace(k);
    auto& list = e->second;
    if (fresh) {
      list.charged = list_cost(k.key);
      charge(list.charged);
    }
    list.entries.push_back(WaitEntry{w.get(), w->keys.size()});
    w->keys.push_back(Waiter::Key{&e->first, k.hash, list.entries.size() - 1});
  }
  session.wait_keys += missing.size();
  w->slot = session.waits.size();
  session.waits.push_back(std::move(w));
}

std::unique_ptr<Waiter> StoreCore::take_waiter(Session& session, std::size_t slot) {
  auto w = std::move(session.waits[slot]);
  if (slot + 1 != session.waits.size()) {
    session.waits[slot] = std::move(session.waits.back());
    session.waits[slot]->slot = slot;
  }
  session.waits.pop_back();
  trim(session.waits);
  release(w->charged);
  return w;
}

void StoreCore::wake(const HashedKey& k) {
  auto* e = waiters_.find(k);
  if (!e) return;
  auto entries = std::move(e->second.entries);
  release(e->second.charged);
  waiters_.erase(k);
  // First settle every waiter, then deliver: delivering may close a connection, which drops its
  // session's waits from the lists.
  std::vector<std::weak_ptr<Peer>> woken;
  for (const auto& entry : entries) {
    Waiter* w = entry.waiter;
    w->keys[entry.key].index = Waiter::kWoken;
    Session& s = *w->session;
    --s.wait_keys;
    if (--w->missing > 0) continue;
    woken.push_back(s.peer);
    take_waiter(s, w->slot);  // every key it waited for is set: no list holds it any more
  }
  woken_ += woken.size();
  for (auto& p : woken) {
    if (auto peer = p.lock()) peer->deliver(stop_waiting());
  }
}

// Removes one key's entry of a waiter from that key's list.
void StoreCore::unlist(const Waiter::Key& k) {
  if (k.index == Waiter::kWoken) return;
  HashedKey key{*k.name, k.hash};
  auto* e = waiters_.find(key);
  auto& entries = e->second.entries;
  entries[k.index] = entries.back();
  entries[k.index].waiter->keys[entries[k.index].key].index = k.index;
  entries.pop_back();
  if (entries.empty()) {
    release(e->second.charged);
    waiters_.erase(key);
  } else {
    trim(entries);
  }
}

void StoreCore::cancel_waits(Session& session) {
  for (auto& w : session.waits) {
    for (const auto& k : w->keys) unlist(k);
    release(w->charged);
  }
  std::vector<std::unique_ptr<Waiter>>().swap(session.waits);
  session.wait_keys = 0;
}

std::size_t StoreCore::drop_some(Session& session, std::size_t max_waits) {
  // Most recent first: their memory is the last malloc handed out, so freeing it in that order
  // lets malloc return it to the system as it goes.
  for (std::size_t n = 0; n < max_waits && !session.waits.empty(); ++n) {
    auto& w = session.waits.back();
    for (const auto& k : w->keys) unlist(k);
    session.wait_keys -= w->missing;
    release(w->charged);
    session.waits.pop_back();
  }
  if (!session.waits.empty()) return session.waits.size();
  std::vector<std::unique_ptr<Waiter>>().swap(session.waits);
  session.wait_keys = 0;
  unwatch(session);
  return 0;
}

void StoreCore::watch_key(Session& session, const HashedKey& h, Message& out) {
  if (session.watches.size() >= limits_.max_watches_per_connection) {
    throw LimitError("WATCH_KEY on '" + escape_for_log(h.key) + "': this connection already has " +
                     std::to_string(session.watches.size()) + " watches, the limit of --max_watches_per_connection");
  }
  auto* e = watchers_.find(h);
  std::size_t one = cost::kWatch + cost::string_heap(h.key.size());
  require(one + (e ? 0 : list_cost(h.key)), 0, "WATCH_KEY", h.key);
  if (!e) {
    e = watchers_.try_emplace(h).first;
    charge(list_cost(h.key));
  }
  charge(one);
  session.watches.emplace_back(h.key);
  e->second.push_back(&session);
  wire::put_u8(out.text(), wire::kKeyCallbackRegistered);
}

void StoreCore::unwatch(Session& session) {
  for (const auto& key : session.watches) {
    release(cost::kWatch + cost::string_heap(key.size()));
    auto h = hashed(key);
    auto* e = watchers_.find(h);
    if (!e) continue;
    auto& list = e->second;
    auto pos = std::find(list.begin(), list.end(), &session);
    if (pos != list.end()) {
      *pos = list.back();
      list.pop_back();
    }
    if (list.empty()) {
      release(list_cost(key));
      watchers_.erase(h);
    } else {
      trim(list);
    }
  }
  std::vector<std::string>().swap(session.watches);
}

// One event, built once: values by reference, so each watcher queues a few bytes of its own.
// A watcher that cannot take it (its unsent output or the budget) is closed by deliver().
void StoreCore::notify_watchers(const HashedKey& k, std::uint8_t type, const StoredValue& old_value,
                                const StoredValue& new_value) {
  auto* e = watchers_.find(k);
  if (!e) return;
  Message m;
  wire::put_u8(m.text(), type);
  wire::put_str(m.text(), k.key);
  for (const auto* v : {&old_value, &new_value}) {
    if (v->large) {
      m.put_value(v->large);
    } else {
      wire::put_str(m.text(), v->small);
    }
  }
  // Copy the peers first: delivering may close a connection, which drops its watches.
  std::vector<std::shared_ptr<Peer>> peers;
  peers.reserve(e->second.size());
  for (auto* s : e->second) {
    if (auto p = s->peer.lock()) peers.push_back(std::move(p));
  }
  for (auto& p : peers) p->deliver(m);
}

}  // namespace ddprun::rendezvous
