// --numa_binding on this machine: what --report_bindings says is what each worker's kernel
// affinity (Cpus_allowed_list) is, and exclusive ranks do not overlap.
#include <catch2/catch.hpp>

#include <map>
#include <regex>
#include <set>

#include "ddprun/common/text.hpp"
#include "e2e/agents.hpp"
#include "skip.hpp"

using namespace ddprun::test;

namespace {

std::set<int> expand(const std::string& list) {
  std::set<int> out;
  for (const auto& part : ddprun::split(list, ',')) {
    auto dash = part.find('-');
    int lo = std::stoi(part.substr(0, dash)), hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return out;
}

}  // namespace

TEST_CASE("numa: each worker runs on the CPUs --report_bindings names", "[numa]") {
  auto mode = GENERATE(std::string("node"), std::string("exclusive"), std::string("socket"), std::string("core-complex"));
  auto r = Launch(cmd({"--standalone", "--nproc_per_node=2", "--numa_binding=" + mode, "--report_bindings", "sh",
                       "-c", "grep Cpus_allowed_list /proc/self/status"}))
               .finish(60s);
  INFO(r.err);
  SKIP_UNLESS_HARDWARE(mode != "exclusive" || r.err.find("which has 1 cores") == std::string::npos,
                       "one core on this machine: exclusive cannot split it");
  REQUIRE(r.code == 0);
  std::map<int, std::string> reported, actual;
  static const std::regex rep(R"(ddprun: local rank (\d+): cpus (\S+) \()");
  static const std::regex got(R"(\[default(\d+)\]:Cpus_allowed_list:\s+(\S+))");
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), rep); it != std::sregex_iterator(); ++it) {
    reported[std::stoi((*it)[1])] = (*it)[2];
  }
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), got); it != std::sregex_iterator(); ++it) {
    actual[std::stoi((*it)[1])] = (*it)[2];
  }
  REQUIRE(reported.size() == 2);
  REQUIRE(actual.size() == 2);
  for (int rank : {0, 1}) CHECK(expand(actual[rank]) == expand(reported[rank]));
  if (mode == "exclusive") {
    auto a = expand(actual[0]), b = expand(actual[1]);
    for (int c : a) CHECK(b.count(c) == 0);
  }
}

TEST_CASE("numa: a bad mode, or --report_bindings alone, is a usage error", "[numa]") {
  auto bad = Launch(cmd({"--numa_binding=nodes", "/bin/true"})).finish(30s);
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--numa_binding must be node, socket, exclusive or core-complex"));
  auto alone = Launch(cmd({"--report_bindings", "/bin/true"})).finish(30s);
  CHECK(alone.code == 2);
  CHECK_THAT(alone.err, Catch::Contains("--report_bindings needs --numa_binding"));
}
