#pragma once
// Helpers for tests that run several ddprun agents on loopback (multi-node, security).

#include <catch2/catch.hpp>

#include <regex>
#include <string>
#include <vector>

#include "e2e/launch.hpp"

namespace ddprun::test {

inline const std::string kDdprun = DDPRUN_BIN;
inline const std::string kWorker = TEST_WORKER_BIN;

// ddprun with `args`.
inline std::vector<std::string> cmd(std::vector<std::string> args) {
  args.insert(args.begin(), kDdprun);
  return args;
}

// The rendezvous store's port, from the host agent's log ("hosting the rendezvous store on port N").
inline std::string host_port(Launch& host) {
  // ddprun logs to stderr; Launch::wait_for reads stdout, so the test polls both streams for a
  // moment at a time and reads the line from stderr.
  auto deadline = Clock::now() + 10s;
  std::smatch m;
  std::regex re(R"(hosting the rendezvous store on port (\d+))");
  while (Clock::now() < deadline) {
    host.wait_for("\x01", 1, 50ms);  // pumps both streams for a moment
    if (std::regex_search(host.err(), m, re)) return m[1];
  }
  FAIL("the host agent did not report its port: " << host.err());
  return "";
}

}  // namespace ddprun::test
