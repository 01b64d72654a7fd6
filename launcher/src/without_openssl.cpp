// Linked into the `ddprun` program alone (launcher/CMakeLists.txt), never into a library: the
// definitions below come before the static libraries on the link line, so the linker takes
// these instead of the real ones, and never pulls the etcd client, the store handshake's HMAC,
// or OpenSSL behind them (launcher/full_program.hpp says why). main() hands the jobs that use
// them to ddprun-full before anything here could be called; if one is called all the same, it
// fails with the reason instead of doing something else.

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/auth.hpp"
#include "etcd_factory.hpp"

namespace {

[[noreturn]] void needs_full(const char* what) {
  throw ddprun::Error(std::string(what) + " needs ddprun-full (ddprun built with OpenSSL); this ddprun has no OpenSSL");
}

}  // namespace

namespace ddprun::rounds {

// Parsing validates the options before main() knows the job is ddprun-full's, which validates
// them again after the exec: nothing to check here.
void validate_etcd(const RendezvousOptions&) {}

std::unique_ptr<Backend> make_etcd_backend(const RendezvousOptions&, std::weak_ptr<Renewals>) {
  needs_full("the etcd rendezvous");
}

}  // namespace ddprun::rounds

namespace ddprun::rendezvous::auth {

std::string server_proof(std::string_view, std::string_view, std::string_view) { needs_full("a store secret"); }
std::string client_proof(std::string_view, std::string_view, std::string_view) { needs_full("a store secret"); }
bool equal(std::string_view, std::string_view) { needs_full("a store secret"); }

}  // namespace ddprun::rendezvous::auth
