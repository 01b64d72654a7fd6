#include "local_store.hpp"

#include <condition_variable>
#include <map>
#include <mutex>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::runtime {
namespace {

class LocalStore final : public rendezvous::Store {
 public:
  void set(std::string_view key, std::string_view value) override {
    std::lock_guard<std::mutex> lock(mu_);
    map_[std::string(key)] = std::string(value);
    cv_.notify_all();
  }
  std::string get(std::string_view key) override {
    wait({std::string(key)}, timeout_);
    std::lock_guard<std::mutex> lock(mu_);
    return map_[std::string(key)];
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& v = map_[std::string(key)];
    auto n = (v.empty() ? 0 : std::stoll(v)) + delta;
    v = std::to_string(n);
    cv_.notify_all();
    return n;
  }
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(std::string(key));
    if (it == map_.end()) {
      if (!expected.empty()) return std::string(expected);
      map_[std::string(key)] = std::string(desired);
      cv_.notify_all();
      return std::string(desired);
    }
    if (it->second == expected) it->second = std::string(desired);
    cv_.notify_all();
    return it->second;
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    return all(keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return all(keys); })) {
      throw TimeoutError("local store: keys not set within " + duration_text(timeout) +
                         " (a world of one has no peers to set them)");
    }
  }
  bool delete_key(std::string_view key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.erase(std::string(key)) > 0;
  }
  std::int64_t num_keys() override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<std::int64_t>(map_.size());
  }
  void append(std::string_view key, std::string_view value) override {
    std::lock_guard<std::mutex> lock(mu_);
    map_[std::string(key)] += std::string(value);
    cv_.notify_all();
  }
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& k : keys) {
      auto it = map_.find(k);
      out.push_back(it == map_.end() ? std::string() : it->second);
    }
    return out;
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override {
    if (keys.size() != values.size()) throw UsageError("local store: multi_set with more keys than values");
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) map_[keys[i]] = values[i];
    cv_.notify_all();
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  bool all(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (!map_.count(k)) return false;
    }
    return true;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
  std::chrono::milliseconds timeout_ = std::chrono::seconds(300);
};

}  // namespace

std::shared_ptr<rendezvous::Store> make_local_store() { return std::make_shared<LocalStore>(); }

}  // namespace ddprun::runtime
