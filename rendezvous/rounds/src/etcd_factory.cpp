#include "etcd_factory.hpp"

#include "etcd_backend.hpp"
#include "etcd_transport.hpp"

namespace ddprun::rounds {

void validate_etcd(const RendezvousOptions& opt) {
  const EtcdTls tls{opt.etcd_cacert, opt.etcd_cert, opt.etcd_key};
  check_etcd_tls(parse_etcd_endpoints(opt.etcd_endpoints, tls.enabled()), tls);
  if (tls.enabled()) make_tls_context(tls);  // the files load, or the usage error names the one that does not
}

std::unique_ptr<Backend> make_etcd_backend(const RendezvousOptions& opt, std::weak_ptr<Renewals> renewals) {
  return std::make_unique<EtcdBackend>(opt, std::move(renewals));
}

}  // namespace ddprun::rounds
