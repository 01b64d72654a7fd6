#include "gloo_context.hpp"

#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/rendezvous/store.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime {
namespace {

// Gloo's store interface over ddprun's.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<rendezvous::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<rendezvous::Store> store_;
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

std::shared_ptr<gloo::rendezvous::Context> connect_gloo(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options,
                                                        const std::string& store_host) {
  gloo::transport::tcp::attr attr;
  if (!options.gloo_hostname.empty()) {
    attr.hostname = options.gloo_hostname;
  } else if (is_loopback(store_host)) {
    attr.hostname = "127.0.0.1";
  } else {
    attr.hostname = host_name();
  }
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    StoreAdapter adapter(std::move(store));
    context->connectFullMesh(adapter, device);
    return context;
  } catch (const ddprun::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError("gloo: rank " + std::to_string(rank) + " could not connect to its " + std::to_string(size - 1) +
                       " peers (address " + attr.hostname + ", timeout " + seconds_text(options.timeout) +
                       "): " + e.what());
  }
}

bool gloo_peer_left(const std::string& message) {
  for (const char* m : {"closed by peer", "reset by peer", "Socket closed", "Broken pipe"}) {
    if (message.find(m) != std::string::npos) return true;
  }
  return false;
}

}  // namespace ddprun::runtime
