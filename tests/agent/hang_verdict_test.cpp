// The hang verdict (observe/hang_verdict.hpp): which rank holds the job up, from what ddprun read.
#include <catch2/catch.hpp>

#include "control/hang_exchange.hpp"
#include "observe/hang_verdict.hpp"
#include "observe/pace_judge.hpp"

using namespace ddprun::agent;

namespace {

const std::vector<StackFrame> kBackward = {{"backward", "__init__.py", 197}, {"backward", "_tensor.py", 488},
                                           {"main", "train.py", 12}};
const std::vector<StackFrame> kReducer = {{"c10d::Reducer::finalize_backward()", "", 0}, {"??", "libtorch_cpu.so", 0}};
const std::vector<StackFrame> kLoader = {{"load_batch", "train.py", 8}, {"main", "train.py", 11}};
const std::vector<StackFrame> kEval = {{"_PyEval_EvalFrameDefault", "", 0}};

RankView rank(int r, std::vector<StackFrame> py, std::vector<StackFrame> native, char state = 'S', double cpu = 0) {
  RankView v;
  v.rank = r;
  v.host = "node-b";
  v.pid = 100 + r;
  v.state = state;
  v.cpu = cpu;
  v.python = std::move(py);
  v.native = std::move(native);
  return v;
}

}  // namespace

TEST_CASE("hang verdict: a rank stuck in Python is blamed, not the ones waiting in DDP's all-reduce under backward",
          "[hang]") {
  auto v = decide_hang({rank(0, kBackward, kReducer), rank(1, kLoader, kEval), rank(2, kBackward, kReducer),
                        rank(3, kBackward, kReducer)});
  CHECK(v.kind == HangKind::stuck);
  CHECK(v.blamed == std::vector<int>{1});
  CHECK(v.text == "rank 1 (host node-b, pid 101) is stuck outside any collective in load_batch (train.py:8); "
                  "ranks 0, 2-3 wait for it in DDP's all-reduce");
}

TEST_CASE("hang verdict: backward() without DDP's Reducer in the native stack is not a collective", "[hang]") {
  // (a rank computing a long backward pass, read while it runs)
  auto v = decide_hang({rank(0, kBackward, {{"at::native::addmm", "", 0}}, 'R', 1.0), rank(1, kBackward, kReducer)});
  CHECK(v.kind == HangKind::spinning);
  CHECK(v.blamed == std::vector<int>{0});
}

TEST_CASE("hang verdict: a rank asleep in backward() waits in DDP's all-reduce, whatever its native stack shows",
          "[hang]") {
  // (a loaded machine: its native main thread read in the autograd engine's wait, or not read)
  auto v = decide_hang({rank(0, kBackward, {{"torch::autograd::Engine::execute", "", 0}}, 'S', 0.01),
                        rank(1, kBackward, {}, 'S', 0.0), rank(2, kLoader, kEval, 'S', 0.0)});
  CHECK(v.kind == HangKind::stuck);
  CHECK(v.blamed == std::vector<int>{2});
  CHECK_THAT(v.text, Catch::Contains("ranks 0-1 wait for it in DDP's all-reduce"));
}

TEST_CASE("hang verdict: spinning, stopped and uninterruptible ranks, each with its kind", "[hang]") {
  auto spin = decide_hang({rank(0, kBackward, kReducer), rank(1, kLoader, kEval, 'R', 0.97)});
  CHECK(spin.kind == HangKind::spinning);
  CHECK_THAT(spin.text, Catch::Contains("rank 1 (host node-b, pid 101) is spinning (busy 97% of the time) outside any collective"));
  auto stopped = decide_hang({rank(0, kBackward, kReducer), rank(1, {}, {}, 'T')});
  CHECK(stopped.kind == HangKind::stopped);
  CHECK(stopped.blamed == std::vector<int>{1});
  CHECK(stopped.text == "rank 1 (host node-b, pid 101) is stopped (SIGSTOP: state T); rank 0 waits for it in DDP's all-reduce");
  auto d = decide_hang({rank(0, kBackward, kReducer), rank(1, {}, {}, 'D'), rank(2, kLoader, kEval)});
  CHECK(d.kind == HangKind::uninterruptible);  // before a rank outside collectives: D says more
  CHECK(d.blamed == std::vector<int>{1});
  CHECK_THAT(d.text, Catch::Contains("uninterruptible sleep (D"));
}

// A rank in one long write to a slow FUSE mount: the stack signal turns its wait into D, so neither
// its Python nor its native main thread is read, while the others wait for it in a barrier.
TEST_CASE("hang verdict: a rank none of whose stacks could be read beside ranks waiting in one collective is blamed",
          "[hang]") {
  const std::vector<StackFrame> barrier = {{"barrier", "distributed_c10d.py", 3152}, {"<module>", "train.py", 12}};
  auto unread = rank(0, {}, {});
  unread.python_note = "the stack signal wrote nothing within 10 s";
  auto v = decide_hang({unread, rank(1, barrier, {{"c10d::Work::wait", "", 0}}), rank(2, kBackward, kReducer)});
  CHECK(v.kind == HangKind::mismatch);  // two collectives: the mismatch says more than the unread rank
  v = decide_hang({unread, rank(1, barrier, {{"c10d::Work::wait", "", 0}})});
  CHECK(v.kind == HangKind::stuck);
  CHECK(v.blamed == std::vector<int>{0});
  CHECK(v.text == "rank 0 (host node-b, pid 100) could not be read (no stack: the stack signal wrote nothing within "
                  "10 s), sleeping before ddprun signalled it: held in the kernel, most likely (a slow or stuck file "
                  "system, a driver); rank 1 waits for it in torch.distributed.barrier");
  CHECK(decide_hang({rank(0, {}, {}), rank(1, {}, {})}).text == "no stack could be read");  // nobody read: nobody blamed
  auto never_signalled = rank(0, {}, {});  // another node read with --stack_dump_timeout=0: proves nothing
  never_signalled.python_note = "--stack_dump_timeout=0";
  v = decide_hang({never_signalled, rank(1, barrier, {{"c10d::Work::wait", "", 0}})});
  CHECK(v.kind == HangKind::undecided);
  CHECK(v.blamed.empty());
  CHECK_THAT(v.text, Catch::Contains("not here (on another node)"));
}

TEST_CASE("hang verdict: ranks in different collectives are a mismatch, the odd group blamed", "[hang]") {
  std::vector<StackFrame> bcast = {{"broadcast", "distributed_c10d.py", 1408}, {"main", "train.py", 20}};
  auto v = decide_hang({rank(0, kBackward, kReducer), rank(1, bcast, {{"c10d::Work::wait", "", 0}}),
                        rank(2, kBackward, kReducer)});
  CHECK(v.kind == HangKind::mismatch);
  CHECK(v.blamed == std::vector<int>{1});
  CHECK_THAT(v.text, Catch::Contains("ranks wait in different collectives:"));
  CHECK_THAT(v.text, Catch::Contains("ranks 0, 2 in DDP's all-reduce"));
  CHECK_THAT(v.text, Catch::Contains("rank 1 (host node-b, pid 101) in torch.distributed.broadcast"));
}

TEST_CASE("hang verdict: every rank here waiting blames no one here, native programs by their function names",
          "[hang]") {
  auto v = decide_hang({rank(0, kBackward, kReducer), rank(1, kBackward, kReducer)});
  CHECK(v.kind == HangKind::undecided);
  CHECK(v.blamed.empty());
  CHECK_THAT(v.text, Catch::Contains("not here (on another node)"));
  auto native = decide_hang({rank(0, {}, {{"wait_for_peer", "comm.cpp", 42}, {"all_reduce", "comm.cpp", 80}}),
                             rank(1, {}, {{"read_shard", "data.cpp", 7}, {"main", "train.cpp", 3}})});
  CHECK(native.kind == HangKind::stuck);
  CHECK(native.blamed == std::vector<int>{1});
  CHECK_THAT(native.text, Catch::Contains("in read_shard (data.cpp:7); rank 0 waits for it in all_reduce"));
  CHECK(rank_list({7, 0, 2, 3, 4, 5, 9}) == "0, 2-5, 7, 9");
}

TEST_CASE("hang verdict: a node's summary for the other nodes keeps what the verdict needs, and refuses garbage",
          "[hang]") {
  auto mine = std::vector<RankView>{rank(2, kLoader, kEval, 'R', 0.93), rank(3, {}, {}, 'T')};
  mine[1].python_note = "stopped";
  auto back = hang_summary_from_json(hang_summary_json(mine));
  REQUIRE(back.size() == 2);
  CHECK(back[0].rank == 2);
  CHECK(back[0].host == "node-b");
  CHECK(back[0].pid == 102);
  CHECK(back[0].state == 'R');
  CHECK(back[0].cpu == Approx(0.93));
  CHECK(describe_frames(back[0].python) == describe_frames(kLoader));
  CHECK(back[1].state == 'T');
  CHECK(back[1].python_note == "stopped");
  // Gathered with another node's ranks, the verdict is the same as if one node had them all.
  auto all = back;
  all.push_back(rank(0, kBackward, kReducer));
  CHECK(decide_hang(all).blamed == std::vector<int>{3});
  CHECK_THROWS(hang_summary_from_json("[{\"rank\": 1}]"));
  CHECK_THROWS(hang_summary_from_json("not json"));
}

TEST_CASE("hang report: ranks waiting alike are one line, whether /proc caught one of them awake or not", "[hang]") {
  // Rank 0 was sampled running (between two short sleeps) but was busy 1% of the window.
  std::vector<RankView> ranks = {rank(0, kLoader, kEval, 'R', 0.01), rank(1, kLoader, kEval, 'S', 0.0),
                                 rank(2, kLoader, kEval, 'R', 0.97), rank(3, kLoader, kEval, 'T', 0.0)};
  auto text = format_hang_report(decide_hang(ranks), ranks, "node-b", "no heartbeat for 3.0 s", {},
                                 std::chrono::milliseconds(0), 0, false);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("ranks 0-1 [sleeping]: load_batch (train.py:8)"));
  CHECK_THAT(text, Catch::Contains("rank 2 [running, busy 97%]: load_batch (train.py:8)"));
  CHECK_THAT(text, Catch::Contains("rank 3 [stopped (T), busy 0%]"));
}

TEST_CASE("stragglers: a rank 1.5x the others' median and 25 points above it, 3 windows in a row, named once", "[hang]") {
  PaceJudge judge;
  const std::map<int, double> slow = {{0, 0.10}, {1, 0.90}, {2, 0.12}};
  CHECK(judge.window(slow).empty());
  CHECK(judge.window(slow).empty());
  auto named = judge.window(slow);
  REQUIRE(named.size() == 1);
  CHECK(named[0].rank == 1);
  CHECK(named[0].busy == Approx(0.90));
  CHECK(named[0].others == Approx(0.12));  // the median of the others
  CHECK(judge.straggler(1));
  CHECK(judge.window(slow).empty());  // once per run of slow windows
  CHECK(judge.straggler(1));
  // A window it is not slow in ends the run; one it is missing from (no steps) keeps it.
  CHECK(judge.window({{0, 0.5}, {1, 0.5}, {2, 0.5}}).empty());
  CHECK_FALSE(judge.straggler(1));
  CHECK(judge.window(slow).empty());
  CHECK(judge.window({{0, 0.1}, {2, 0.1}}).empty());
  CHECK(judge.window(slow).empty());
  CHECK(judge.window(slow).size() == 1);
  // Busy, but not by a quarter of a core over the others (all nearly idle): nobody is named.
  PaceJudge idle;
  for (int i = 0; i < 5; ++i) CHECK(idle.window({{0, 0.01}, {1, 0.20}}).empty());
  // One rank alone has nobody to be slower than.
  PaceJudge alone;
  for (int i = 0; i < 5; ++i) CHECK(alone.window({{0, 0.99}}).empty());
}
