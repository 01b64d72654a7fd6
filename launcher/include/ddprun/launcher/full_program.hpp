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

// Runs ddprun-full with `argv` in place of this program, marked as handed over (below); returns
// only when it cannot, after saying why on stderr (what is missing, what to do).
void exec_full_program(char** argv, const std::string& use);

// First thing in main(): whether ddprun handed this process its job, by the mark
// exec_full_program() leaves in the environment, which is removed here (workers never see it).
// A `ddprun` that finds it was handed a job it cannot run: "ddprun-full" is not the full build.
bool take_handoff_mark();

// The process name ddprun was started under (argv[0]'s last part: `ddprun`, or the name of a
// link to it), for ps -C, pgrep -x and pkill, which would otherwise see "ddprun-full".
void keep_launcher_name(const char* argv0);

}  // namespace ddprun::launcher
