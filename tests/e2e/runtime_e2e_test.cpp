// The runtime in processes under the built ddprun: collectives, a peer dying mid-collective,
// and the train_mlp example (equal parameters for 1, 2 and 4 workers; crash and resume).

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <regex>

#include "e2e/launch.hpp"

using namespace ddprun::test;

namespace {

const std::string kDdprun = DDPRUN_BIN;
const std::string kWorker = RUNTIME_WORKER_BIN;
const std::string kTrain = TRAIN_MLP_BIN;

struct Result_ {
  int rank;
  int world;
  double loss, checksum;
};

std::vector<Result_> results(const std::string& out) {
  std::vector<Result_> v;
  std::regex re(R"(RESULT rank=(\d+) world=(\d+) loss=(\S+) checksum=(\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    v.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
  }
  return v;
}

Result train(int n, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {kDdprun, "--standalone", "--nproc_per_node=" + std::to_string(n)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Launch(argv).finish(120s);
}

}  // namespace

TEST_CASE("collectives across processes under ddprun", "[e2e]") {
  auto r = Launch({kDdprun, "--standalone", "--nproc_per_node=3", kWorker, "collectives"}).finish();
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(Launch::occurrences(r.out, "collectives ok") == 3);
}

TEST_CASE("a peer dying mid-collective gives an error well within the timeout", "[e2e]") {
  auto r = Launch({kDdprun, "--standalone", "--nproc_per_node=2", kWorker, "peer_dies"}).finish(60s);
  INFO(r.out << r.err);
  CHECK(r.code == 3);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex(R"(error after (\S+) s: (.*))")));
  CHECK(std::stod(m[1]) < 10.0);  // the collectives' timeout
  CHECK_THAT(m[2].str(), Catch::Contains("all_reduce on rank 0 of 2"));
}

TEST_CASE("train_mlp: 1, 2 and 4 workers train the same parameters", "[e2e][train_mlp]") {
  std::map<int, double> checksum;
  for (int n : {1, 2, 4}) {
    auto r = train(n, {kTrain, "--steps", "120", "--global_batch", "64", "--bucket_cap_mb", "0.004"});
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    auto res = results(r.out);
    REQUIRE(res.size() == static_cast<std::size_t>(n));
    for (const auto& x : res) {
      CHECK(x.world == n);
      CHECK(x.checksum == res[0].checksum);  // every rank of a run holds the same parameters
    }
    checksum[n] = res[0].checksum;
  }
  CHECK(checksum[2] == Approx(checksum[1]).epsilon(1e-5));
  CHECK(checksum[4] == Approx(checksum[1]).epsilon(1e-5));
}

TEST_CASE("train_mlp: bad flags exit 2 naming the flag - a batch larger than a rank's share of the data, nan, out of range", "[e2e][train_mlp]") {
  // (a batch over a rank's share made zero steps an epoch: SIGFPE)
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--global_batch", "8194"}, "--global_batch 8194 gives each of the 2 workers a batch larger than its share of the 8192 samples: at most 8192"},
      {{"--lr", "nan"}, "--lr needs a number, got 'nan'"},
      {{"--steps", "1e30"}, "--steps must be from 0 to 1e+09 (got '1e30')"},
      {{"--bucket_cap_mb", "0"}, "--bucket_cap_mb must be from"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {"--max_restarts=0", kTrain};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = train(2, argv);
    INFO(args[0] << ": " << r.err.substr(0, 600));
    CHECK(r.code != 0);
    CHECK_THAT(r.err, Catch::Contains("train_mlp: " + message) && Catch::Contains("failure    : exit code 2"));
    CHECK_THAT(r.err, !Catch::Contains("SIGFPE"));
  }
  auto help = Launch({kTrain, "--help"}).finish();
  CHECK(help.code == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: train_mlp"));
}

TEST_CASE("train_mlp: a crash and a resume from the checkpoint end like an uninterrupted run", "[e2e][train_mlp]") {
  auto ckpt = (std::filesystem::temp_directory_path() / ("ddprun-train-" + std::to_string(::getpid()) + ".ckpt")).string();
  std::filesystem::remove(ckpt);
  auto plain = train(2, {kTrain, "--steps", "100"});
  auto crashed = train(2, {"--max_restarts=1", kTrain, "--steps", "100", "--checkpoint", ckpt, "--crash_at_step", "37"});
  std::filesystem::remove(ckpt);
  INFO(crashed.out << crashed.err);
  REQUIRE(plain.code == 0);
  REQUIRE(crashed.code == 0);
  CHECK_THAT(crashed.err, Catch::Contains("restarting the worker group"));
  CHECK_THAT(crashed.out, Catch::Contains("resumed from"));
  auto a = results(plain.out), b = results(crashed.out);
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(a[0].checksum == b[0].checksum);  // bit for bit: same steps, same data, same world
  CHECK(a[0].loss == b[0].loss);
}

TEST_CASE("train_mlp: a native trainer's in-memory state - a rank lost at step 37 resumes there, no disk, like an uninterrupted run, its parameters whole or shared out", "[e2e][train_mlp]") {
  auto plain = train(2, {kTrain, "--steps", "100"});
  auto crashed = train(2, {"--max_restarts=1", kTrain, "--steps", "100", "--memory_state", "--crash_at_step", "37"});
  INFO(crashed.out << crashed.err);
  REQUIRE(plain.code == 0);
  REQUIRE(crashed.code == 0);
  CHECK_THAT(crashed.err, Catch::Contains("restarting the worker group"));
  // Rank 1 died before step 37; both ranks had committed step 36: the next attempt starts at 37.
  CHECK_THAT(crashed.out, Catch::Contains("resumed from memory at step 37 (attempt 1)"));
  auto a = results(plain.out), b = results(crashed.out);
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(a[0].checksum == b[0].checksum);  // bit for bit
  CHECK(b[1].checksum == b[0].checksum);
  CHECK(a[0].loss == b[0].loss);
  // --state_replicated: the parameters (alike on both ranks) shared out, each rank copying half;
  // the restarted ranks gather them, and end bit for bit as the uninterrupted run.
  auto shared = train(2, {"--max_restarts=1", kTrain, "--steps", "100", "--memory_state", "--state_replicated",
                          "--crash_at_step", "37"});
  INFO(shared.out << shared.err);
  CHECK(shared.code == 0);
  CHECK_THAT(shared.out, Catch::Contains("resumed from memory at step 37 (attempt 1)"));
  auto s = results(shared.out);
  REQUIRE(s.size() == 2);
  CHECK(s[0].checksum == a[0].checksum);
  CHECK(s[1].checksum == a[0].checksum);
  CHECK(s[0].loss == a[0].loss);
  // What each rank gathered, before rank 0's parameters are broadcast over it: alike.
  const auto loaded_0 = shared.out.find("LOADED rank=0 "), loaded_1 = shared.out.find("LOADED rank=1 ");
  REQUIRE(loaded_0 != std::string::npos);
  REQUIRE(loaded_1 != std::string::npos);
  CHECK(shared.out.substr(shared.out.find("checksum=", loaded_0), 20) ==
        shared.out.substr(shared.out.find("checksum=", loaded_1), 20));
  auto state_bytes = [](const std::string& out) {
    std::vector<long> v;
    for (std::size_t at = out.find("STATE rank="); at != std::string::npos; at = out.find("STATE rank=", at + 1)) {
      v.push_back(std::stol(out.substr(out.find("bytes=", at) + 6)));
    }
    return v;
  };
  const auto whole = state_bytes(crashed.out), half = state_bytes(shared.out);
  REQUIRE(whole.size() == 2);
  REQUIRE(half.size() == 2);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << half[r] << " bytes shared out, " << whole[r] << " whole");
    CHECK(half[r] < whole[r] * 6 / 10);  // half the parameters, and the skeleton
  }
  // Without ddprun's area (--no_state) the trainer runs from step 0 again, and says nothing of memory.
  auto without = train(2, {"--max_restarts=1", "--no_state", kTrain, "--steps", "100", "--memory_state", "--crash_at_step", "37"});
  CHECK(without.code == 0);
  CHECK_THAT(without.out, !Catch::Contains("resumed from memory"));
  auto c = results(without.out);
  REQUIRE(c.size() == 2);
  CHECK(c[0].checksum == a[0].checksum);
}

TEST_CASE("train_mlp: a native trainer's persisted state - the job lost whole at step 37 starts again from the files the agent wrote for step 29", "[e2e][train_mlp]") {
  const auto dir = std::filesystem::temp_directory_path() / ("train_mlp_persist_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Gone {
    std::filesystem::path p;
    ~Gone() { std::filesystem::remove_all(p); }
  } gone{dir};
  auto plain = train(2, {kTrain, "--steps", "100"});
  // Each rank asks after steps 9, 19 and 29 and goes on; rank 1 dies at step 37 and, with no
  // restart, the job ends: nothing is left in memory.
  auto lost = train(2, {"--max_restarts=0", kTrain, "--steps", "100", "--memory_state", "--persist", dir.string(),
                        "--crash_at_step", "37"});
  INFO(lost.out << lost.err);
  REQUIRE(plain.code == 0);
  CHECK(lost.code != 0);
  CHECK(std::filesystem::exists(dir / "rank0.state"));
  CHECK(std::filesystem::exists(dir / "rank1.state"));
  auto again = train(2, {kTrain, "--steps", "100", "--memory_state", "--persist", dir.string()});
  INFO(again.out << again.err);
  REQUIRE(again.code == 0);
  // The saves of steps 30-36 left step 29's slot alone until the agent had copied it.
  CHECK_THAT(again.out, Catch::Contains("resumed from " + (dir / "rank0.state").string() + " at step 30 (attempt 0)"));
  auto a = results(plain.out), b = results(again.out);
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(a[0].checksum == b[0].checksum);  // bit for bit
  CHECK(b[1].checksum == b[0].checksum);
}
