#pragma once
// `ddprun` and ddprun-full: one launcher built twice. OpenSSL's static tables were 9% of a
// one-worker launch (their relocations at every start: README, Start-up cost), and only two
// kinds of job use OpenSSL: the etcd rendezvous (its client, TLS) and store secrets (the
// handshake's HMAC). `ddprun` is built without OpenSSL and hands those jobs to ddprun-full,
// beside it, by exec with the same arguments and environment, as git hands https:// to
// git-remote-https. A build of shared libraries has one program, with everything.

#include <optional>
#include <string>

#include "ddprun/agent/agent.hpp"

namespace ddprun::launcher {

// Why this job needs OpenSSL ("the etcd rendezvous", "a store secret"); nullopt when it does not.
std::optional<std::string> openssl_use(const agent::AgentOptions& options);

// Runs ddprun-full with `argv` in place of this program; returns only when it cannot, after
// saying why on stderr (what is missing, what to do).
void exec_full_program(char** argv, const std::string& use);

}  // namespace ddprun::launcher
