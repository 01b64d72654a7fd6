// Warm spares: which workers a spare can run, and what makes a spare unusable (spares.hpp).

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>

#include "workers/spares.hpp"
#include "workers/worker_group.hpp"

using namespace ddprun::agent;

namespace {

WorkerSpec spec_of(std::vector<std::string> argv, std::vector<std::string> env = {"PATH=/bin", "RANK=0"}) {
  WorkerSpec s;
  s.argv = std::move(argv);
  s.env = std::move(env);
  return s;
}

}  // namespace

TEST_CASE("a spare runs python scripts and -m modules, nothing else", "[spares]") {
  char dir[] = "/tmp/spare-key-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  std::string script = std::string(dir) + "/train.py";
  std::ofstream(script) << "print(1)\n";
  auto k = SpareKey::of(spec_of({"/usr/bin/python3", "-u", script, "--lr", "1"}));
  REQUIRE(k);
  CHECK(k->interpreter == std::vector<std::string>{"/usr/bin/python3", "-u"});
  CHECK(k->run == script);
  CHECK(k->args == std::vector<std::string>{"--lr", "1"});
  auto m = SpareKey::of(spec_of({"/usr/bin/python3", "-u", "-m", "pkg.train", "x"}));
  REQUIRE(m);
  CHECK(m->run == "-m pkg.train");
  CHECK(m->args == std::vector<std::string>{"x"});
  CHECK_FALSE(SpareKey::of(spec_of({"/usr/bin/python3", "-c", "print(1)"})));
  CHECK_FALSE(SpareKey::of(spec_of({"/usr/bin/python3", "-W", "error", script})));  // a flag with a value
  CHECK_FALSE(SpareKey::of(spec_of({"/opt/train", script})));                      // not Python (--no_python)
  CHECK_FALSE(SpareKey::of(spec_of({"/usr/bin/python3", "-u", std::string(dir) + "/missing.py"})));
  std::remove(script.c_str());
  ::rmdir(dir);
}

TEST_CASE("a spare is unusable when the script, the flags or the group-wide environment changed", "[spares]") {
  char dir[] = "/tmp/spare-key-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  std::string script = std::string(dir) + "/train.py";
  std::ofstream(script) << "print(1)\n";
  auto base = SpareKey::of(spec_of({"/usr/bin/python3", "-u", script}, {"A=1", "RANK=0", "MASTER_PORT=1"}));
  REQUIRE(base);
  // Per-rank and per-attempt variables and the script's arguments may differ.
  auto next = SpareKey::of(spec_of({"/usr/bin/python3", "-u", script, "--resume"}, {"A=1", "RANK=1", "MASTER_PORT=2"}));
  REQUIRE(next);
  CHECK(base->differs(*next).empty());
  auto env = SpareKey::of(spec_of({"/usr/bin/python3", "-u", script}, {"A=2", "RANK=0"}));
  CHECK(base->differs(*env) == "the environment changed (A)");
  auto flags = SpareKey::of(spec_of({"/usr/bin/python3", "-u", "-O", script}, {"A=1", "RANK=0"}));
  CHECK(base->differs(*flags) == "the interpreter or its flags changed");
  std::ofstream(script) << "print(2)\n";  // edited
  auto edited = SpareKey::of(spec_of({"/usr/bin/python3", "-u", script}, {"A=1", "RANK=0"}));
  CHECK(base->differs(*edited) == "the script " + script + " was edited");
  std::remove(script.c_str());
  ::rmdir(dir);
}
