#pragma once
// A map from keys to V, split into kShards hash maps by the top bits of the key's hash. A hash
// map grows by rehashing all of its elements at once: 1.5 s for one std::unordered_map of 6
// million keys, inside the one request that made it grow, with every other client waiting. Here
// each shard rehashes alone: with the store's memory budget of 1 GiB full of empty keys, a few
// milliseconds. Elements never move (their addresses stay valid until erased).
//
// Lookups take a HashedKey: a key is hashed once per request, however many maps it is looked up
// in (keys are up to 8 KiB; hashing one costs microseconds).

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace ddprun::rendezvous {

struct HashedKey {
  std::string_view key;
  std::size_t hash;
};

inline HashedKey hashed(std::string_view key) { return HashedKey{key, std::hash<std::string_view>{}(key)}; }

template <typename V>
class KeyMap {
 public:
  using Entry = std::pair<const std::string, V>;

  // The entry of `k`; nullptr when absent.
  Entry* find(const HashedKey& k) {
    if (!shards_) return nullptr;
    auto& s = shard(k);
    auto it = s.find(k);
    return it == s.end() ? nullptr : &*it;
  }
  const Entry* find(const HashedKey& k) const { return const_cast<KeyMap*>(this)->find(k); }
  bool contains(const HashedKey& k) const { return find(k) != nullptr; }
  // The entry of `k`, made (with a default V) when absent; and whether it was.
  std::pair<Entry*, bool> try_emplace(const HashedKey& k) {
    if (auto* e = find(k)) return {e, false};
    if (!shards_) shards_ = std::make_unique<Map[]>(kShards);
    ++size_;
    return {&*shard(k).try_emplace(std::string(k.key)).first, true};
  }
  // Erases the entry of `k`, which must be there (`k` may name the entry's own key).
  void erase(const HashedKey& k) {
    if (!shards_) return;
    auto& s = shard(k);
    s.erase(s.find(k));
    --size_;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() {
    shards_.reset();
    size_ = 0;
  }
  template <typename F>
  void for_each(F&& f) const {
    if (!shards_) return;
    for (std::size_t i = 0; i < kShards; ++i) {
      for (const auto& e : shards_[i]) f(e);
    }
  }

 private:
  static constexpr int kBits = 9;
  static constexpr std::size_t kShards = std::size_t{1} << kBits;

  struct Hash {
    using is_transparent = void;
    std::size_t operator()(const std::string& s) const { return std::hash<std::string_view>{}(s); }
    std::size_t operator()(const HashedKey& k) const { return k.hash; }
  };
  struct Equal {
    using is_transparent = void;
    bool operator()(const std::string& a, const std::string& b) const { return a == b; }
    bool operator()(const HashedKey& a, const std::string& b) const { return a.key == b; }
    bool operator()(const std::string& a, const HashedKey& b) const { return a == b.key; }
  };
  using Map = std::unordered_map<std::string, V, Hash, Equal>;

  Map& shard(const HashedKey& k) { return shards_[k.hash >> (8 * sizeof(std::size_t) - kBits)]; }

  // Made at the first key: a store (every agent hosts one) that is never written to costs nothing,
  // where constructing 512 maps cost 60 us at each launch.
  std::unique_ptr<Map[]> shards_;
  std::size_t size_ = 0;
};

}  // namespace ddprun::rendezvous
