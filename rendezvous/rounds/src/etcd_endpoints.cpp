// etcd's members as the user wrote them (--rdzv_endpoint, etcdctl's --endpoints), and whether
// the TLS settings fit them.
#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/text.hpp"
#include "etcd_client.hpp"

namespace ddprun::rounds {
namespace {

std::string url(const EtcdEndpoint& e) { return (e.tls ? "https://" : "http://") + format_address(e.host, e.port); }

// "https://h:2379/" -> tls, "h:2379"; no scheme -> `tls_default`.
std::pair<bool, std::string> split_scheme(const std::string& item, bool tls_default) {
  std::string v = trim(item);
  bool tls = tls_default;
  auto sep = v.find("://");
  if (sep != std::string::npos) {
    const std::string scheme = v.substr(0, sep);
    if (scheme != "http" && scheme != "https") {
      throw UsageError("etcd endpoint '" + item + "': the scheme must be http:// or https:// (got '" + scheme + "://')");
    }
    tls = scheme == "https";
    v = v.substr(sep + 3);
    if (!v.empty() && v.back() == '/') v.pop_back();
  }
  return {tls, v};
}

}  // namespace

std::vector<EtcdEndpoint> parse_etcd_endpoints(const std::string& list, bool tls_default) {
  std::vector<EtcdEndpoint> out;
  for (const auto& item : split(list, ',')) {
    auto [tls, v] = split_scheme(item, tls_default);
    if (v.empty()) continue;
    EtcdEndpoint e;
    e.tls = tls;
    std::string port;
    if (v[0] == '[') {
      auto close = v.find(']');
      if (close == std::string::npos) throw UsageError("etcd endpoint '" + item + "': missing ']'");
      e.host = v.substr(1, close - 1);
      if (close + 1 < v.size() && v[close + 1] == ':') port = v.substr(close + 2);
    } else {
      auto colon = v.rfind(':');
      e.host = colon == std::string::npos ? v : v.substr(0, colon);
      if (colon != std::string::npos) port = v.substr(colon + 1);
      if (e.host.find(':') != std::string::npos) {
        throw UsageError("etcd endpoint '" + item + "': IPv6 addresses need brackets, e.g. [fd00::1]:2379");
      }
    }
    if (!port.empty() || v.back() == ':') {
      auto p = parse_int(port, 1, 65535);
      if (!p) throw UsageError("etcd endpoint '" + item + "': the port must be 1-65535");
      e.port = static_cast<std::uint16_t>(*p);
    }
    if (e.host.empty() || e.host.find('/') != std::string::npos) {
      throw UsageError("etcd endpoint '" + item + "': expected [http://|https://]HOST[:PORT]");
    }
    if (auto why = host_name_problem(e.host); !why.empty()) {
      throw UsageError("etcd endpoint '" + (item.size() > 64 ? item.substr(0, 60) + "..." : item) + "': " + why);
    }
    out.push_back(e);
  }
  if (out.empty()) throw UsageError("no etcd endpoint given (expected [https://]HOST:PORT[,HOST:PORT...])");
  return out;
}

void check_etcd_tls(const std::vector<EtcdEndpoint>& endpoints, const EtcdTls& tls) {
  for (const auto& e : endpoints) {
    if (e.tls && !tls.enabled()) {
      throw UsageError("etcd endpoint " + url(e) + " uses TLS: give --rdzv_conf cacert=PATH (the CA that signed "
                       "etcd's server certificates, etcdctl's --cacert)");
    }
    if (!e.tls && tls.enabled()) {
      throw UsageError("etcd endpoint " + url(e) + " is plain HTTP but --rdzv_conf cacert is given: write https://" +
                       format_address(e.host, e.port) + " (or no scheme), or leave out cacert");
    }
  }
  if (tls.cert.empty() != tls.key.empty()) {
    throw UsageError("--rdzv_conf cert and key go together: this node's client certificate and its private key");
  }
  if (!tls.cert.empty() && !tls.enabled()) {
    throw UsageError("--rdzv_conf cert needs cacert: a client certificate is sent over TLS only");
  }
}

}  // namespace ddprun::rounds
