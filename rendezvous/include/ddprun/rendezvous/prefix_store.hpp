#pragma once
// A view of a store under a key prefix: key k becomes prefix + "/" + k (PyTorch's PrefixStore
// rule), so independent users (restart attempts, process groups) cannot see each other's keys.

#include <memory>
#include <string>

#include "ddprun/rendezvous/store.hpp"

namespace ddprun::rendezvous {

class PrefixStore final : public Store {
 public:
  // `base` is shared: several PrefixStores may wrap one connection.
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;
  std::chrono::milliseconds timeout() const override { return base_->timeout(); }
  void set_timeout(std::chrono::milliseconds timeout) override { base_->set_timeout(timeout); }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string join(std::string_view key) const;
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace ddprun::rendezvous
