#pragma once
// nccl process groups on the fake NCCL/CUDA (tests/fakes/fake_nccl.hpp): N ranks as
// threads, each with its own fake Api and State, meeting through one Fabric and one store.

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/runtime/process_group.hpp"
#include "fake_nccl.hpp"
#include "group_fixture.hpp"
#include "group_keys.hpp"
#include "nccl_group.hpp"

namespace ddprun::test {

class FakeRanks {
 public:
  // `size` ranks, each with its own device (State::devices = size) unless told otherwise.
  explicit FakeRanks(int size) {
    for (int r = 0; r < size; ++r) {
      auto s = std::make_shared<runtime::nccl::fake::State>();
      s->devices = size;
      states.push_back(s);
      apis.push_back(runtime::nccl::fake::make_api(s, fabric));
    }
  }
  // Ends what a failed test left blocked in the fake (an abandoned init, a hung destroy).
  ~FakeRanks() { runtime::nccl::fake::shutdown(*fabric); }

  // Rank r's group, created on the calling thread: the k-th call for a rank makes its k-th group.
  std::shared_ptr<runtime::ProcessGroup> group(int r, runtime::ProcessGroupOptions o = {}) {
    int size = static_cast<int>(states.size());
    auto store = runtime::next_group_store(ranks.store("fake"), r);
    return runtime::nccl::make_process_group(apis[static_cast<std::size_t>(r)], store, r, size, o,
                                             runtime::nccl::Placement{r, size});
  }

  // Runs fn(rank, group) on one thread per rank; returns each rank's error message ("" if none).
  std::vector<std::string> run(const std::function<void(int, runtime::ProcessGroup&)>& fn,
                               runtime::ProcessGroupOptions o = {}) {
    std::vector<std::string> errors(states.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < states.size(); ++r) {
      threads.emplace_back([&, r] {
        errors[r] = message_of([&] {
          auto g = group(static_cast<int>(r), o);
          fn(static_cast<int>(r), *g);
        });
      });
    }
    for (auto& t : threads) t.join();
    return errors;
  }

  Ranks ranks;
  std::shared_ptr<runtime::nccl::fake::Fabric> fabric = runtime::nccl::fake::make_fabric();
  std::vector<std::shared_ptr<runtime::nccl::fake::State>> states;
  std::vector<std::shared_ptr<runtime::nccl::Api>> apis;
};

}  // namespace ddprun::test
