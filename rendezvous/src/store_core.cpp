#include "store_core.hpp"

#include <algorithm>
#include <charconv>

#include "ddprun/rendezvous/error.hpp"

namespace ddprun::rendezvous {
namespace {

using wire::Op;

std::int64_t parse_counter(const std::string& key, const std::string& value) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
    throw ProtocolError("ADD on key '" + key + "' whose value is not a decimal integer (" +
                        std::to_string(value.size()) + " bytes)");
  }
  return v;
}

}  // namespace

bool StoreCore::exists(const std::string& key) const {
  if (data_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreCore::put(const std::string& key, std::string value) {
  auto it = data_.find(key);
  if (!watchers_.empty()) {
    bool created = it == data_.end();
    notify_watchers(key, created ? wire::kKeyCreated : wire::kKeyUpdated,
                    created ? std::string_view() : std::string_view(it->second), value);
  }
  if (it == data_.end()) {
    data_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  wake(key);
}

void StoreCore::wake(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  // Move the list out first: delivering may close a connection, which must not touch this list.
  auto list = std::move(it->second);
  waiters_.erase(it);
  static constexpr char kStop[1] = {static_cast<char>(wire::kStopWaiting)};
  for (auto& w : list) {
    if (!w->active || --w->missing > 0) continue;
    w->active = false;
    if (auto peer = w->peer.lock()) peer->deliver(std::string_view(kStop, 1));
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
  auto list = it->second;  // copy: delivering may close connections
  for (auto& weak : list) {
    if (auto peer = weak.lock()) peer->deliver(msg);
  }
  auto& live = watchers_[key];
  std::erase_if(live, [](const auto& w) { return w.expired(); });
  if (live.empty()) watchers_.erase(key);
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
  auto w = std::make_shared<Waiter>();
  w->peer = session.peer;
  w->missing = missing.size();
  std::erase_if(session.waits, [](const auto& x) { return !x->active; });
  session.waits.push_back(w);
  for (const auto* k : missing) {
    auto& list = waiters_[*k];
    // Cancelled waiters stay in lists until their key is set; compact now and then so that a
    // client cancelling waits on a key nobody sets cannot grow the list without bound.
    if (list.size() >= 64 && (list.size() & (list.size() - 1)) == 0) {
      std::erase_if(list, [](const auto& x) { return !x->active; });
    }
    list.push_back(w);
  }
}

void StoreCore::drop(Session& session) {
  for (auto& w : session.waits) w->active = false;
  session.waits.clear();
}

void StoreCore::handle(Session& session, const Request& req, std::string& out) {
  switch (req.op) {
    case Op::kValidate:  // the parser checked the magic; no reply
      return;
    case Op::kPing:
      wire::put_u32(out, req.u32);
      return;
    case Op::kSet:
      put(req.keys[0], req.values[0]);
      return;
    case Op::kCompareSet: {
      const auto& key = req.keys[0];
      const auto& expected = req.values[0];
      const auto& desired = req.values[1];
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (expected.empty()) {
          put(key, desired);
          wire::put_str(out, desired);
        } else {
          wire::put_str(out, expected);
        }
        return;
      }
      if (it->second == expected) {
        put(key, desired);
        wire::put_str(out, desired);
      } else {
        wire::put_str(out, it->second);
      }
      return;
    }
    case Op::kGet: {
      auto it = data_.find(req.keys[0]);
      wire::put_str(out, it == data_.end() ? std::string_view() : std::string_view(it->second));
      return;
    }
    case Op::kAdd: {
      const auto& key = req.keys[0];
      auto it = data_.find(key);
      std::int64_t current = it == data_.end() ? 0 : parse_counter(key, it->second);
      std::int64_t next;
      if (__builtin_add_overflow(current, req.delta, &next)) {
        throw ProtocolError("ADD on key '" + key + "' overflows a 64-bit counter");
      }
      put(key, std::to_string(next));
      wire::put_i64(out, next);
      return;
    }
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
      watchers_[req.keys[0]].push_back(session.peer);
      wire::put_u8(out, wire::kKeyCallbackRegistered);
      return;
    case Op::kDeleteKey: {
      auto it = data_.find(req.keys[0]);
      bool found = it != data_.end();
      if (found) {
        if (!watchers_.empty()) notify_watchers(req.keys[0], wire::kKeyDeleted, it->second, {});
        data_.erase(req.keys[0]);
      }
      wire::put_i64(out, found ? 1 : 0);
      return;
    }
    case Op::kAppend: {
      auto it = data_.find(req.keys[0]);
      put(req.keys[0], it == data_.end() ? req.values[0] : it->second + req.values[0]);
      return;
    }
    case Op::kMultiGet:
      for (const auto& k : req.keys) {
        auto it = data_.find(k);
        wire::put_str(out, it == data_.end() ? std::string_view() : std::string_view(it->second));
      }
      return;
    case Op::kMultiSet:
      for (std::size_t i = 0; i < req.keys.size(); ++i) put(req.keys[i], req.values[i]);
      return;
    case Op::kCancelWait:
      drop(session);
      wire::put_u8(out, wire::kWaitCanceled);
      return;
    case Op::kQueuePush:
      queues_[req.keys[0]].push_back(req.values[0]);
      wake(req.keys[0]);
      return;
    case Op::kQueuePop: {
      auto it = queues_.find(req.keys[0]);
      std::int64_t size = it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size());
      wire::put_i64(out, size);
      if (size > 0) {
        wire::put_str(out, it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      return;
    }
    case Op::kQueueLen: {
      auto it = queues_.find(req.keys[0]);
      wire::put_i64(out, it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size()));
      return;
    }
  }
}

}  // namespace ddprun::rendezvous
