// Failure semantics of the gloo backend and of checkpoints: a failed collective never passes as
// success, and a checkpoint holds only what every rank confirmed.

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/checkpoint.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "group_fixture.hpp"

using namespace ddprun;
using namespace ddprun::runtime;
using ddprun::test::message_of;
using namespace std::chrono_literals;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/ddprun-ckpt-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  return tmpl;
}

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

}  // namespace

TEST_CASE("gloo: after a failed collective every wait() rethrows and every later call fails at once", "[failure]") {
  test::Ranks ranks;
  ProcessGroupOptions opt;
  opt.timeout = 300ms;
  std::atomic<bool> rank0_done{false};
  ranks.run(
      2,
      [&](int rank, ProcessGroup& g) {
        if (rank == 1) {
          // Never joins the collective: rank 0's times out.
          for (int i = 0; i < 500 && !rank0_done; ++i) std::this_thread::sleep_for(10ms);
          return;
        }
        std::vector<float> buf(1024, 1.0f);
        auto w = g.all_reduce_async(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        std::string a = message_of([&] { w->wait(); });
        std::string b = message_of([&] { w->wait(); });
        RANK_CHECK_MSG(a.find("timed out") != std::string::npos, a);
        RANK_CHECK_MSG(a == b, a << " | " << b);
        auto t0 = std::chrono::steady_clock::now();
        std::string later = message_of([&] { g.barrier(); });
        RANK_CHECK_MSG(later.find("failed earlier") != std::string::npos, later);
        RANK_CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
        // A Reducer on the broken group fails at construction (the ranks' check of their
        // parameters is a collective) rather than return unreduced gradients later.
        ReducerOptions ro;
        ro.first_bucket_bytes = ro.bucket_cap_bytes = 1024;
        ro.broadcast_parameters = false;
        RANK_CHECK_THROWS_AS(Reducer(std::shared_ptr<ProcessGroup>(&g, [](ProcessGroup*) {}), {{256}, {256}}, ro),
                             ddprun::Error);
        rank0_done = true;
      },
      opt);
}

TEST_CASE("save_checkpoint_on_rank0 writes nothing when a rank did not confirm its step", "[failure][checkpoint]") {
  test::Ranks ranks;
  ProcessGroupOptions opt;
  opt.timeout = 300ms;
  auto dir = temp_dir();
  auto path = dir + "/model.ckpt";
  std::atomic<bool> rank0_done{false};
  ranks.run(
      2,
      [&](int rank, ProcessGroup& g) {
        if (rank == 1) {  // its step failed: it never reaches the checkpoint
          for (int i = 0; i < 500 && !rank0_done; ++i) std::this_thread::sleep_for(10ms);
          return;
        }
        RANK_CHECK_THROWS_AS(save_checkpoint_on_rank0(g, path, "weights after an unconfirmed step"), ddprun::Error);
        RANK_CHECK(!exists(path));
        rank0_done = true;
      },
      opt);
  // With both ranks it is written.
  ranks.run(2, [&](int, ProcessGroup& g) { save_checkpoint_on_rank0(g, path, "confirmed"); });
  CHECK(load_checkpoint(path).value() == "confirmed");
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("checkpoint temporary files: a stale one or a planted link is replaced, never followed", "[checkpoint]") {
  auto dir = temp_dir();
  auto path = dir + "/model.ckpt";
  auto tmp = path + ".tmp." + std::to_string(::getpid());
  auto victim = dir + "/victim";
  { std::ofstream(victim) << "precious"; }
  SECTION("a symbolic link where the temporary file goes") {
    REQUIRE(::symlink(victim.c_str(), tmp.c_str()) == 0);
    save_checkpoint(path, "new data");
  }
  SECTION("a stale temporary file from a crashed writer") {
    { std::ofstream(tmp) << "half-written garbage from a crash"; }
    save_checkpoint(path, "new data");
  }
  CHECK(load_checkpoint(path).value() == "new data");
  std::ifstream v(victim);
  std::string content((std::istreambuf_iterator<char>(v)), std::istreambuf_iterator<char>());
  CHECK(content == "precious");
  CHECK_FALSE(exists(tmp));
  ::unlink(path.c_str());
  ::unlink(victim.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("checkpoint load: one buffer - damage and non-files are reported", "[checkpoint]") {
  auto dir = temp_dir();
  auto path = dir + "/c";
  std::string big(3 << 20, 'x');
  save_checkpoint(path, big);
  CHECK(load_checkpoint(path).value() == big);
  CHECK_FALSE(load_checkpoint(dir + "/missing").has_value());
  CHECK_THROWS_WITH(load_checkpoint(dir), Catch::Contains("not a regular file"));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('y');
  }
  CHECK_THROWS_WITH(load_checkpoint(path), Catch::Contains("checksum mismatch"));
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}
