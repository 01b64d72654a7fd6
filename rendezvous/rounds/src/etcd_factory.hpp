#pragma once
// The etcd backend as the rest of the rounds library sees it: two functions, and nothing of
// etcd's client, TLS or OpenSSL. They are what lets the `ddprun` program leave OpenSSL out
// (its static tables were 9% of a one-worker launch: README, Start-up cost): that program
// defines both itself (launcher/src/without_openssl.cpp), so the linker never takes the
// object defining them (etcd_factory.o, or the etcd files' one unity batch), nor the etcd and
// OpenSSL code behind it, from the static libraries; it hands
// etcd jobs to ddprun-full, which is linked with the real ones.

#include <memory>

#include "backend.hpp"
#include "ddprun/rounds/options.hpp"

namespace ddprun::rounds {

// Throws UsageError for etcd settings that cannot work: a malformed endpoint list, TLS files
// that do not load, https:// without a CA.
void validate_etcd(const RendezvousOptions& opt);

// The etcd backend of one agent.
std::unique_ptr<Backend> make_etcd_backend(const RendezvousOptions& opt, std::weak_ptr<Renewals> renewals);

}  // namespace ddprun::rounds
