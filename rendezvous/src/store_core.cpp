#include "store_core.hpp"

#include <algorithm>
#include <unordered_set>

#include "ddprun/common/text.hpp"

namespace ddprun::rendezvous {
namespace {

using wire::Op;

std::int64_t parse_counter(std::string_view key, std::string_view value) {
  auto v = parse_int(value);
  if (!v) {
    throw ProtocolError("ADD on key '" + escape_for_log(key) + "' whose value is not a decimal integer (" +
                        std::to_string(value.size()) + " bytes)");
  }
  return *v;
}

// A key's node in a map (the key is copied there: its capacity is its size).
std::size_t key_cost(std::string_view key) { return cost::kKey + cost::string_heap(key.size()); }
std::size_t value_cost(const std::string& v) { return shared_cost(v.size(), v.capacity()); }
bool is_small(std::size_t size) { return size < Message::kShareFrom; }

// The capacity of a string of capacity `cap` once `size` bytes are assigned or appended to it
// (libstdc++ doubles it when it must grow, or takes `size` when that is more).
std::size_t grown_capacity(std::size_t cap, std::size_t size) { return size <= cap ? cap : std::max(size, 2 * cap); }

void reply_value(Message& out, const StoredValue* v) {
  if (!v) return wire::put_str(out.text(), {});
  if (v->large) return out.put_value(v->large);
  wire::put_str(out.text(), v->small);
}

}  // namespace

StoreCore::StoreCore(StoreLimits limits, MemoryBudget* budget) : limits_(limits), budget_(budget) {
  if (!budget_) {
    own_budget_ = std::make_unique<MemoryBudget>(limits.max_store_bytes);
    budget_ = own_budget_.get();
  }
}

StoreCore::~StoreCore() { clear(); }

void StoreCore::clear() {
  data_.clear();
  queues_.clear();
  waiters_.clear();
  watchers_.clear();
  release(charged_);
  bytes_ = 0;
}

void StoreCore::charge(std::size_t n) {
  charged_ += n;
  budget_->charge(n);
}

void StoreCore::release(std::size_t n) {
  charged_ -= n;
  budget_->release(n);
}

bool StoreCore::exists(const HashedKey& k) const {
  if (data_.contains(k)) return true;
  const auto* q = queues_.find(k);
  return q && !q->second.empty();
}

void StoreCore::require(std::size_t grow, std::size_t shrink, const char* op, std::string_view key) const {
  // The last sixteenth of the budget is kept for the clients' buffers, so that a store full of
  // data still serves reads.
  if (budget_->fits(grow + budget_->limit() / 16, shrink)) return;
  throw LimitError(std::string(op) + " on key '" + escape_for_log(key) + "' would make the store hold " +
                   std::to_string(budget_->used() - std::min(shrink, budget_->used()) + grow) +
                   " bytes, over --max_store_bytes=" + std::to_string(budget_->limit()) +
                   "; nothing was changed (the budget counts keys, values, queues, waits, watches and the "
                   "clients' buffers, with their overhead; its last sixteenth is kept for the clients' buffers)");
}

void StoreCore::check_value(std::size_t size, const char* op, std::string_view key) const {
  if (size > limits_.max_value_bytes) {
    throw LimitError(std::string(op) + " would make key '" + escape_for_log(key) + "' " + std::to_string(size) +
                     " bytes long, over --max_value_bytes=" + std::to_string(limits_.max_value_bytes));
  }
}

void StoreCore::put(const HashedKey& k, std::string_view small, SharedBytes large) {
  auto [e, created] = data_.try_emplace(k);
  auto& v = e->second;
  if (created) {
    charge(key_cost(k.key));
    bytes_ += k.key.size();
  }
  StoredValue old;  // what the watch event carries: the large value kept alive, a small one copied
  bool watched = !watchers_.empty() && watchers_.contains(k);
  if (watched) old.small = v.small;
  old.large = std::move(v.large);
  bytes_ = bytes_ - (old.large ? old.large->size() : v.small.size()) + (large ? large->size() : small.size());
  release(cost::string_heap(v.small));
  if (large) {
    std::string().swap(v.small);
    v.large = std::move(large);
  } else {
    v.small.assign(small);
  }
  charge(cost::string_heap(v.small));
  if (watched) notify_watchers(k, created ? wire::kKeyCreated : wire::kKeyUpdated, old, v);
  wake(k);
}

// Stores `value` under `k` within the budget: a small one copied into the key's own string (the
// request keeps its buffer for the next one), a large one taken as a shared buffer.
void StoreCore::set_value(const HashedKey& k, std::string&& value, const char* op) {
  auto* e = data_.find(k);
  std::size_t grow = e ? 0 : key_cost(k.key), shrink = e ? e->second.freed_by_drop() : 0;
  std::size_t cap = e && !e->second.large ? e->second.small.capacity() : 15;
  grow += is_small(value.size()) ? cost::string_heap(grown_capacity(cap, value.size())) : value_cost(value);
  require(grow, shrink, op, k.key);
  if (is_small(value.size())) return put(k, value, nullptr);
  put(k, {}, share(*budget_, std::move(value)));
}

void StoreCore::handle(Session& session, Request& req, Message& out) {
  auto& text = out.text();
  HashedKey h = req.keys.empty() ? HashedKey{} : hashed(req.keys[0]);
  switch (req.op) {
    case Op::kValidate:  // the parser checked the magic; no reply
      return;
    case Op::kPing:
      return wire::put_u32(text, req.u32);
    case Op::kSet:
      return set_value(h, std::move(req.values[0]), "SET");
    case Op::kCompareSet:
      return compare_set(req, h, out);
    case Op::kGet: {
      auto* e = data_.find(h);
      return reply_value(out, e ? &e->second : nullptr);
    }
    case Op::kAdd:
      return add(req, h, out);
    case Op::kCheck: {
      bool ready = std::all_of(req.keys.begin(), req.keys.end(), [&](const auto& k) { return exists(hashed(k)); });
      return wire::put_u8(text, ready ? wire::kReady : wire::kNotReady);
    }
    case Op::kWait:
      return add_wait(session, req.keys, out);
    case Op::kGetNumKeys:
      return wire::put_i64(text, static_cast<std::int64_t>(data_.size()));
    case Op::kWatchKey:
      return watch_key(session, h, out);
    case Op::kDeleteKey:
      return delete_key(h, out);
    case Op::kAppend:
      return append(req, h);
    case Op::kMultiGet:
      return multi_get(req, out);
    case Op::kMultiSet:
      return multi_set(req);
    case Op::kCancelWait:
      cancel_waits(session);
      return wire::put_u8(text, wire::kWaitCanceled);
    case Op::kQueuePush:
      return queue_push(req, h);
    case Op::kQueuePop:
      return queue_pop(h, out);
    case Op::kQueueLen: {
      auto* q = queues_.find(h);
      return wire::put_i64(text, q ? static_cast<std::int64_t>(q->second.size()) : 0);
    }
  }
}

void StoreCore::compare_set(Request& req, const HashedKey& h, Message& out) {
  const auto& expected = req.values[0];
  auto* e = data_.find(h);
  bool store = e ? e->second.view() == expected : expected.empty();
  if (store) {
    set_value(h, std::move(req.values[1]), "COMPARE_SET");
    reply_value(out, &data_.find(h)->second);
  } else if (!e) {
    wire::put_str(out.text(), expected);
  } else {
    reply_value(out, &e->second);
  }
}

void StoreCore::add(const Request& req, const HashedKey& h, Message& out) {
  auto* e = data_.find(h);
  std::int64_t current = e ? parse_counter(h.key, e->second.view()) : 0;
  std::int64_t next;
  if (__builtin_add_overflow(current, req.delta, &next)) {
    throw ProtocolError("ADD on key '" + escape_for_log(h.key) + "' overflows a 64-bit counter");
  }
  set_value(h, std::to_string(next), "ADD");
  wire::put_i64(out.text(), next);
}

void StoreCore::delete_key(const HashedKey& h, Message& out) {
  auto* e = data_.find(h);
  if (e) {
    StoredValue old = std::move(e->second);
    bytes_ -= h.key.size() + old.size();
    data_.erase(h);
    release(key_cost(h.key) + cost::string_heap(old.small));
    if (!watchers_.empty()) notify_watchers(h, wire::kKeyDeleted, old, StoredValue());
  }
  wire::put_i64(out.text(), e ? 1 : 0);
}

void StoreCore::append(Request& req, const HashedKey& h) {
  auto& more = req.values[0];
  auto* e = data_.find(h);
  std::size_t size = (e ? e->second.size() : 0) + more.size();
  check_value(size, "APPEND", h.key);
  if (!e) return set_value(h, std::move(more), "APPEND");
  auto& v = e->second;
  if (is_small(size)) {  // grows the key's own string
    require(cost::string_heap(grown_capacity(v.small.capacity(), size)), cost::string_heap(v.small), "APPEND", h.key);
    std::string joined = v.small + more;  // (the event, if watched, needs the old value intact)
    return put(h, joined, nullptr);
  }
  // A new buffer of exactly `size` bytes (the old one may be shared).
  require(shared_cost(size, std::max<std::size_t>(size, 30)), v.freed_by_drop(), "APPEND", h.key);
  std::string joined;
  joined.reserve(size);
  joined.append(v.view()).append(more);
  put(h, {}, share(*budget_, std::move(joined)));
}

void StoreCore::multi_get(const Request& req, Message& out) {
  std::vector<const StoredValue*> values;
  values.reserve(req.keys.size());
  std::size_t reply = 0, copied = 0, shared = 0;
  for (const auto& k : req.keys) {
    auto* e = data_.find(hashed(k));
    values.push_back(e ? &e->second : nullptr);
    std::size_t n = e ? e->second.size() : 0;
    reply += 8 + n;
    copied += 8 + (n < Message::kShareFrom ? n : 0);
    shared += n < Message::kShareFrom ? 0 : 1;
  }
  if (reply > limits_.max_reply_bytes) {
    throw LimitError("MULTI_GET of " + std::to_string(req.keys.size()) + " keys would reply " +
                     std::to_string(reply) + " bytes, over --max_reply_bytes=" +
                     std::to_string(limits_.max_reply_bytes));
  }
  // The copied bytes exist twice until the reply is queued: in the reply, and in the queue.
  require(2 * copied + (shared + copied / 4096 + 2) * cost::kOutputChunk, 0, "MULTI_GET",
          req.keys.empty() ? std::string_view() : std::string_view(req.keys[0]));
  out.text().reserve(out.text().size() + copied);
  for (const auto* v : values) reply_value(out, v);
}

void StoreCore::multi_set(Request& req) {
  // Every value is counted as if it were kept (a key named twice: the earlier one may outlive the
  // request in a watch event); keys new to the store get a node once; replaced values may be freed.
  std::vector<HashedKey> keys;
  keys.reserve(req.keys.size());
  std::size_t grow = 0, shrink = 0;
  std::unordered_set<std::string_view> seen;
  for (std::size_t i = 0; i < req.keys.size(); ++i) {
    keys.push_back(hashed(req.keys[i]));
    const auto& v = req.values[i];
    auto* e = data_.find(keys.back());
    std::size_t cap = e && !e->second.large ? e->second.small.capacity() : 15;
    grow += is_small(v.size()) ? cost::string_heap(grown_capacity(cap, v.size())) : value_cost(v);
    if (!seen.insert(req.keys[i]).second) continue;
    grow += e ? 0 : key_cost(req.keys[i]);
    shrink += e ? e->second.freed_by_drop() : 0;
  }
  require(grow, shrink, "MULTI_SET", req.keys.empty() ? std::string_view() : std::string_view(req.keys[0]));
  for (std::size_t i = 0; i < req.keys.size(); ++i) {
    auto& v = req.values[i];
    if (is_small(v.size())) {
      put(keys[i], v, nullptr);
    } else {
      put(keys[i], {}, share(*budget_, std::move(v)));
    }
  }
}

void StoreCore::queue_push(Request& req, const HashedKey& h) {
  auto& value = req.values[0];
  auto* q = queues_.find(h);
  if (q && q->second.size() >= limits_.max_queue_length) {
    throw LimitError("QUEUE_PUSH on '" + escape_for_log(h.key) + "': the queue already holds " +
                     std::to_string(q->second.size()) + " items, the limit of --max_queue_length");
  }
  std::size_t queue = cost::kQueue + cost::string_heap(h.key.size());
  require(cost::kQueueItem + value_cost(value) + (q ? 0 : queue), 0, "QUEUE_PUSH", h.key);
  if (!q) {
    q = queues_.try_emplace(h).first;
    charge(queue);
    bytes_ += h.key.size();
  }
  charge(cost::kQueueItem);
  bytes_ += value.size();
  q->second.push_back(share(*budget_, std::move(value)));
  wake(h);
}

void StoreCore::queue_pop(const HashedKey& h, Message& out) {
  auto* q = queues_.find(h);
  std::int64_t size = q ? static_cast<std::int64_t>(q->second.size()) : 0;
  wire::put_i64(out.text(), size);
  if (size == 0) return;
  out.put_value(q->second.front());
  bytes_ -= size_of(q->second.front());
  q->second.pop_front();
  release(cost::kQueueItem);
  if (q->second.empty()) {
    queues_.erase(h);
    release(cost::kQueue + cost::string_heap(h.key.size()));
    bytes_ -= h.key.size();
  }
}

StoreStats StoreCore::stats() const {
  StoreStats s;
  s.keys = data_.size();
  s.store_bytes = bytes_;
  s.memory_bytes = budget_->used();
  s.wait_lists = waiters_.size();
  waiters_.for_each([&](const auto& e) { s.wait_entries += e.second.entries.size(); });
  watchers_.for_each([&](const auto& e) { s.watch_entries += e.second.size(); });
  s.waits_woken = woken_;
  return s;
}

}  // namespace ddprun::rendezvous
