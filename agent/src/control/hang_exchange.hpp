#pragma once
// One hang verdict across nodes (README: Hangs). In a hang every rank of the job goes silent
// (the stuck one, and the others waiting for it in a collective), so each node finds its own
// ranks silent within a check or two and reads them (its hang report). Each then puts a summary
// of its ranks (state, innermost frames) in the workers' store, under ddprun/hang/ATTEMPT/N/ (N:
// the node's report number in the attempt, 1 for the first; a cleared report, a false alarm, is
// one on every node, as every node was silent):
//   node/GROUP_RANK   that node's summary (JSON, with a nonce), written once
//   gather            an add: the node that makes it 1 gathers
//   verdict           the gatherer's verdict (JSON, with the nonces of the summaries it read)
// A node whose nonce is not in the verdict (its numbering went another way) keeps its own.
// The gatherer waits (bounded) for every node's summary, reads them once, decides over all ranks
// (observe/hang_verdict.hpp) and writes the verdict; every node waits for it and prints it.
// Per node: its summary, one add, one wait and one read; the gatherer alone reads N summaries.
// The exchange runs on a thread of its own (the store client blocks); its end is posted to the loop.

#include <chrono>
#include <cstdint>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/thread.hpp"
#include "observe/hang_verdict.hpp"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

struct HangExchangeSetup {
  std::string store_host;  // the workers' store
  std::uint16_t store_port = 0;
  int attempt = 0;
  int report = 1;  // this node's report number in the attempt
  int node = 0;    // this node's group rank
  int nodes = 1;  // the round's nodes
  std::chrono::milliseconds wait{std::chrono::seconds(10)};  // for the other nodes' summaries
};

struct JobHangVerdict {
  HangVerdict verdict;
  std::vector<RankView> ranks;      // every rank read, on every node that answered
  std::vector<int> missing_nodes;   // group ranks without a summary within the wait
  bool gathered_here = false;
};

std::string hang_summary_json(const std::vector<RankView>& ranks);
std::vector<RankView> hang_summary_from_json(const std::string& text);  // throws on malformed input

class HangExchange {
 public:
  using Done = std::function<void(std::optional<JobHangVerdict> verdict, std::string error)>;
  explicit HangExchange(boost::asio::io_context& io) : io_(io) {}
  ~HangExchange();
  HangExchange(const HangExchange&) = delete;
  HangExchange& operator=(const HangExchange&) = delete;

  // Puts `mine` in and gets the job's verdict; `done` runs on the loop. One at a time.
  void start(HangExchangeSetup setup, std::vector<RankView> mine, Done done);

 private:
  boost::asio::io_context& io_;
  ThreadSet threads_;  // one exchange at a time; a finished one joined at the next start
};

}  // namespace ddprun::agent
