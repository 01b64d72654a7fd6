#include "ddprun/common/text.hpp"
#include "store_core.hpp"

#include <algorithm>
#include <charconv>
#include <unordered_set>

namespace ddprun::rendezvous {
namespace {

using wire::Op;

std::int64_t parse_counter(const std::string& key, const std::string& value) {
  auto v = parse_int(value);
  if (!v) {
    throw ProtocolError("ADD on key '" + key + "' whose value is not a decimal integer (" +
                        std::to_string(value.size()) + " bytes)");
  }
  return *v;
}

std::string shown(const std::string& key) { return key.size() <= 64 ? key : key.substr(0, 64) + "..."; }

}  // namespace

bool StoreCore::exists(const std::string& key) const {
  if (data_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

std::size_t StoreCore::held(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? 0 : key.size() + it->second.size();
}

void StoreCore::check_quota(std::size_t grow, std::size_t shrink, const char* op, const std::string& key) const {
  if (grow <= shrink) return;
  std::size_t after = bytes_ - shrink + grow;
  if (after > limits_.max_store_bytes) {
    throw LimitError(std::string(op) + " on key '" + shown(key) + "' would make the store hold " +
                     std::to_string(after) + " bytes, over --max_store_bytes=" +
                     std::to_string(limits_.max_store_bytes) + "; nothing was changed");
  }
}

void StoreCore::check_value(std::size_t size, const char* op, const std::string& key) const {
  if (size > limits_.max_value_bytes) {
    throw LimitError(std::string(op) + " would make key '" + shown(key) + "' " + std::to_string(size) +
                     " bytes long, over --max_value_bytes=" + std::to_string(limits_.max_value_bytes));
  }
}

void StoreCore::put(const std::string& key, std::string value) {
  auto it = data_.find(key);
  if (!watchers_.empty()) {
    bool created = it == data_.end();
    notify_watchers(key, created ? wire::kKeyCreated : wire::kKeyUpdated,
                    created ? std::string_view() : std::string_view(it->second), value);
    it = data_.find(key);
  }
  if (it == data_.end()) {
    bytes_ += key.size() + value.size();
    data_.emplace(key, std::move(value));
  } else {
    bytes_ = bytes_ - it->second.size() + value.size();
    it->second = std::move(value);
  }
  wake(key);
}

void StoreCore::wake(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  // Move the list out first: delivering may close a connection, which must not touch this list.
  auto list = std::move(it->second.entries);
  waiters_.erase(it);
  static constexpr char kStop[1] = {static_cast<char>(wire::kStopWaiting)};
  for (auto& w : list) {
    if (!w->active) continue;
    --w->session->wait_keys;
    if (--w->missing > 0) continue;
    w->active = false;
    --w->session->active_waits;
    if (auto peer = w->session->peer.lock()) peer->deliver(std::string_view(kStop, 1));
  }
}

void StoreCore::notify_watchers(const std::string& key, std::uint8_t type, std::string_view old_value,
                                std::string_view new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  std::string msg;
  wire::put_u8(msg, type);
  wire::put_str(msg, key);
  wire::put_str(msg, old_value);
  wire::put_str(msg, new_value);
  // Copy the peers first: delivering may close a connection, which drops its watches.
  std::vector<std::shared_ptr<Peer>> peers;
  peers.reserve(it->second.size());
  for (auto* s : it->second) {
    if (auto p = s->peer.lock()) peers.push_back(std::move(p));
  }
  for (auto& p : peers) p->deliver(msg);
}

void StoreCore::add_wait(Session& session, const std::vector<std::string>& keys, std::string& out) {
  std::vector<const std::string*> missing;
  for (const auto& k : keys) {
    if (!exists(k)) missing.push_back(&k);
  }
  // Duplicate keys in one WAIT must count once, or a single SET could never finish the wait.
  std::sort(missing.begin(), missing.end(), [](auto* a, auto* b) { return *a < *b; });
  missing.erase(std::unique(missing.begin(), missing.end(), [](auto* a, auto* b) { return *a == *b; }),
                missing.end());
  if (missing.empty()) {
    wire::put_u8(out, wire::kStopWaiting);
    return;
  }
  if (session.wait_keys + missing.size() > limits_.max_waits_per_connection) {
    throw LimitError("WAIT on " + std::to_string(missing.size()) + " key(s) would make this connection wait on " +
                     std::to_string(session.wait_keys + missing.size()) + " keys, over --max_waits_per_connection=" +
                     std::to_string(limits_.max_waits_per_connection));
  }
  auto w = std::make_shared<Waiter>();
  w->session = &session;
  w->missing = missing.size();
  w->keys.reserve(missing.size());
  // Inactive entries are pruned once they outnumber the active ones: amortised O(1) per WAIT.
  if (session.waits.size() >= 16 && session.waits.size() > 2 * session.active_waits) {
    std::erase_if(session.waits, [](const auto& x) { return !x->active; });
  }
  session.waits.push_back(w);
  ++session.active_waits;
  session.wait_keys += missing.size();
  for (const auto* k : missing) {
    auto [it, fresh] = waiters_.try_emplace(*k);
    auto& list = it->second;
    if (fresh) list.generation = next_generation_++;
    list.entries.push_back(w);
    ++list.live;
    w->keys.emplace_back(*k, list.generation);
  }
}

void StoreCore::cancel_waits(Session& session) {
  for (auto& w : session.waits) {
    if (!w->active) continue;
    w->active = false;
    for (const auto& [key, generation] : w->keys) {
      auto it = waiters_.find(key);
      if (it == waiters_.end() || it->second.generation != generation) continue;  // set since
      auto& list = it->second;
      if (--list.live == 0) {
        waiters_.erase(it);
      } else if (list.entries.size() > 2 * list.live + 8) {
        std::erase_if(list.entries, [](const auto& x) { return !x->active; });
      }
    }
    w->keys.clear();
    w->session = nullptr;
  }
  session.waits.clear();
  session.active_waits = 0;
  session.wait_keys = 0;
}

void StoreCore::drop(Session& session) {
  cancel_waits(session);
  for (const auto& key : session.watches) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) continue;
    auto& list = it->second;
    auto pos = std::find(list.begin(), list.end(), &session);
    if (pos != list.end()) {
      *pos = list.back();
      list.pop_back();
    }
    if (list.empty()) watchers_.erase(it);
  }
  session.watches.clear();
}

StoreStats StoreCore::stats() const {
  StoreStats s;
  s.keys = data_.size();
  s.store_bytes = bytes_;
  s.wait_lists = waiters_.size();
  for (const auto& [k, l] : waiters_) s.wait_entries += l.entries.size();
  for (const auto& [k, l] : watchers_) s.watch_entries += l.size();
  return s;
}

void StoreCore::handle(Session& session, const Request& req, std::string& out) {
  switch (req.op) {
    case Op::kValidate:  // the parser checked the magic; no reply
      return;
    case Op::kPing:
      wire::put_u32(out, req.u32);
      return;
    case Op::kSet: {
      const auto& key = req.keys[0];
      check_quota(key.size() + req.values[0].size(), held(key), "SET", key);
      put(key, req.values[0]);
      return;
    }
    case Op::kCompareSet:
      return compare_set(req, out);
    case Op::kGet: {
      auto it = data_.find(req.keys[0]);
      wire::put_str(out, it == data_.end() ? std::string_view() : std::string_view(it->second));
      return;
    }
    case Op::kAdd:
      return add(req, out);
    case Op::kCheck: {
      bool ready = std::all_of(req.keys.begin(), req.keys.end(), [&](const auto& k) { return exists(k); });
      wire::put_u8(out, ready ? wire::kReady : wire::kNotReady);
      return;
    }
    case Op::kWait:
      add_wait(session, req.keys, out);
      return;
    case Op::kGetNumKeys:
      wire::put_i64(out, static_cast<std::int64_t>(data_.size()));
      return;
    case Op::kWatchKey:
      return watch_key(session, req, out);
    case Op::kDeleteKey:
      return delete_key(req, out);
    case Op::kAppend:
      return append(req, out);
    case Op::kMultiGet:
      return multi_get(req, out);
    case Op::kMultiSet:
      return multi_set(req, out);
    case Op::kCancelWait:
      cancel_waits(session);
      wire::put_u8(out, wire::kWaitCanceled);
      return;
    case Op::kQueuePush:
      return queue_push(req, out);
    case Op::kQueuePop:
      return queue_pop(req, out);
    case Op::kQueueLen: {
      auto it = queues_.find(req.keys[0]);
      wire::put_i64(out, it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size()));
      return;
    }
  }
}


void StoreCore::compare_set(const Request& req, std::string& out) {
  const auto& key = req.keys[0];
  const auto& expected = req.values[0];
  const auto& desired = req.values[1];
  auto it = data_.find(key);
  bool store = it == data_.end() ? expected.empty() : it->second == expected;
  if (store) {
    check_quota(key.size() + desired.size(), held(key), "COMPARE_SET", key);
    put(key, desired);
    wire::put_str(out, desired);
  } else {
    wire::put_str(out, it == data_.end() ? expected : it->second);
  }
}

void StoreCore::add(const Request& req, std::string& out) {
  const auto& key = req.keys[0];
  auto it = data_.find(key);
  std::int64_t current = it == data_.end() ? 0 : parse_counter(key, it->second);
  std::int64_t next;
  if (__builtin_add_overflow(current, req.delta, &next)) {
    throw ProtocolError("ADD on key '" + shown(key) + "' overflows a 64-bit counter");
  }
  auto text = std::to_string(next);
  check_quota(key.size() + text.size(), held(key), "ADD", key);
  put(key, std::move(text));
  wire::put_i64(out, next);
}

void StoreCore::delete_key(const Request& req, std::string& out) {
  const auto& key = req.keys[0];
  auto it = data_.find(key);
  bool found = it != data_.end();
  if (found) {
    if (!watchers_.empty()) notify_watchers(key, wire::kKeyDeleted, it->second, {});
    bytes_ -= held(key);
    data_.erase(key);
  }
  wire::put_i64(out, found ? 1 : 0);
}

void StoreCore::append(const Request& req, std::string& out) {
  const auto& key = req.keys[0];
  auto it = data_.find(key);
  std::size_t old = it == data_.end() ? 0 : it->second.size();
  check_value(old + req.values[0].size(), "APPEND", key);
  check_quota(req.values[0].size() + (it == data_.end() ? key.size() : 0), 0, "APPEND", key);
  put(key, it == data_.end() ? req.values[0] : it->second + req.values[0]);
}

void StoreCore::multi_get(const Request& req, std::string& out) {
  std::size_t reply = 0;
  for (const auto& k : req.keys) {
    auto it = data_.find(k);
    reply += 8 + (it == data_.end() ? 0 : it->second.size());
  }
  if (reply > limits_.max_reply_bytes) {
    throw LimitError("MULTI_GET of " + std::to_string(req.keys.size()) + " keys would reply " +
                     std::to_string(reply) + " bytes, over --max_reply_bytes=" +
                     std::to_string(limits_.max_reply_bytes));
  }
  out.reserve(out.size() + reply);
  for (const auto& k : req.keys) {
    auto it = data_.find(k);
    wire::put_str(out, it == data_.end() ? std::string_view() : std::string_view(it->second));
  }
}

void StoreCore::multi_set(const Request& req, std::string& out) {
  // The exact growth, counting a key named twice once (its last value wins).
  std::unordered_map<std::string_view, std::size_t> last;
  for (std::size_t i = 0; i < req.keys.size(); ++i) last[req.keys[i]] = req.keys[i].size() + req.values[i].size();
  std::size_t grow = 0, shrink = 0;
  for (const auto& [k, size] : last) {
    grow += size;
    shrink += held(std::string(k));
  }
  check_quota(grow, shrink, "MULTI_SET", req.keys.empty() ? std::string() : req.keys[0]);
  for (std::size_t i = 0; i < req.keys.size(); ++i) put(req.keys[i], req.values[i]);
}

void StoreCore::queue_push(const Request& req, std::string& out) {
  const auto& key = req.keys[0];
  auto& q = queues_[key];
  if (q.size() >= limits_.max_queue_length) {
    throw LimitError("QUEUE_PUSH on '" + shown(key) + "': the queue already holds " + std::to_string(q.size()) +
                     " items, the limit of --max_queue_length");
  }
  try {
    check_quota(key.size() + req.values[0].size(), 0, "QUEUE_PUSH", key);
  } catch (...) {
    if (q.empty()) queues_.erase(key);
    throw;
  }
  q.push_back(req.values[0]);
  bytes_ += key.size() + req.values[0].size();
  wake(key);
}

void StoreCore::queue_pop(const Request& req, std::string& out) {
  const auto& key = req.keys[0];
  auto it = queues_.find(key);
  std::int64_t size = it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size());
  wire::put_i64(out, size);
  if (size > 0) {
    wire::put_str(out, it->second.front());
    bytes_ -= key.size() + it->second.front().size();
    it->second.pop_front();
    if (it->second.empty()) queues_.erase(it);
  }
}

void StoreCore::watch_key(Session& session, const Request& req, std::string& out) {
  if (session.watches.size() >= limits_.max_watches_per_connection) {
    throw LimitError("WATCH_KEY on '" + shown(req.keys[0]) + "': this connection already has " +
                     std::to_string(session.watches.size()) + " watches, the limit of --max_watches_per_connection");
  }
  session.watches.push_back(req.keys[0]);
  watchers_[req.keys[0]].push_back(&session);
  wire::put_u8(out, wire::kKeyCallbackRegistered);
}

}  // namespace ddprun::rendezvous
