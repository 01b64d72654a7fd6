#include "listener.hpp"

#include <fcntl.h>
#include <sys/resource.h>

#include <climits>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::rendezvous {
namespace {

namespace asio = boost::asio;

std::string endpoint_string(const tcp::endpoint& ep) { return format_address(ep.address().to_string(), ep.port()); }

}  // namespace

std::size_t raise_fd_limit(bool raise) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (raise && lim.rlim_cur < lim.rlim_max) {
    auto before = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
      spdlog::debug("store: raised the open-file limit from {} to {}", before, lim.rlim_cur);
    } else {
      ::getrlimit(RLIMIT_NOFILE, &lim);
    }
  }
  return lim.rlim_cur == RLIM_INFINITY ? std::size_t{1} << 30 : static_cast<std::size_t>(lim.rlim_cur);
}

ListenAddress listen_on(tcp::acceptor& acceptor, const std::string& host, std::uint16_t port) {
  std::vector<tcp::endpoint> candidates;
  boost::system::error_code ec;
  if (host.empty()) {
    candidates.emplace_back(asio::ip::address_v6::any(), port);
    candidates.emplace_back(asio::ip::address_v4::any(), port);
  } else {
    tcp::resolver resolver(acceptor.get_executor());
    auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    if (ec) throw NetworkError("store: cannot resolve host '" + host + "': " + ec.message());
    for (const auto& r : results) candidates.push_back(r.endpoint());
  }
  std::string errors;
  bool in_use = false;
  for (const auto& ep : candidates) {
    acceptor.close(ec);
    acceptor.open(ep.protocol(), ec);
    if (ec) {
      errors += "; " + endpoint_string(ep) + ": " + ec.message();
      continue;
    }
    // Not inherited by workers the hosting agent spawns.
    ::fcntl(acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (ep.protocol() == tcp::v6()) acceptor.set_option(asio::ip::v6_only(!host.empty()), ec);
    acceptor.bind(ep, ec);
    // Linux caps the backlog at net.core.somaxconn: asking for INT_MAX gets the system maximum.
    if (!ec) acceptor.listen(INT_MAX, ec);
    if (!ec) acceptor.non_blocking(true, ec);
    if (!ec) {
      auto local = acceptor.local_endpoint();
      return ListenAddress{local.address().to_string(), local.port()};
    }
    in_use = in_use || ec == asio::error::address_in_use;
    errors += "; " + endpoint_string(ep) + ": " + ec.message();
  }
  std::string what = "store: cannot listen on " + format_address(host.empty() ? "*" : host, port) + errors;
  if (in_use) {
    throw AddressInUseError(what + " (another process holds that port: choose another port, or 0 for a free one)");
  }
  throw NetworkError(what);
}

}  // namespace ddprun::rendezvous
