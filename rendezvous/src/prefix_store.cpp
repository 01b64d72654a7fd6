#include "ddprun/rendezvous/prefix_store.hpp"

namespace ddprun::rendezvous {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {}

std::string PrefixStore::join(std::string_view key) const {
  std::string k;
  k.reserve(prefix_.size() + 1 + key.size());
  k.append(prefix_).append("/").append(key);
  return k;
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(join(k));
  return out;
}

void PrefixStore::set(std::string_view key, std::string_view value) { base_->set(join(key), value); }
std::string PrefixStore::get(std::string_view key) { return base_->get(join(key)); }
std::int64_t PrefixStore::add(std::string_view key, std::int64_t delta) { return base_->add(join(key), delta); }
std::string PrefixStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  return base_->compare_set(join(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(join(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(join(keys), timeout);
}
bool PrefixStore::delete_key(std::string_view key) { return base_->delete_key(join(key)); }
std::int64_t PrefixStore::num_keys() { return base_->num_keys(); }
void PrefixStore::append(std::string_view key, std::string_view value) { base_->append(join(key), value); }
std::vector<std::string> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  return base_->multi_get(join(keys));
}
void PrefixStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  base_->multi_set(join(keys), values);
}

}  // namespace ddprun::rendezvous
