// The nccl backend's contract with the trainer's streams and threads, and its usage errors, on
// the fake NCCL/CUDA: work on the group's stream waits for the compute stream and the compute
// stream for it; the device is set on every thread that does CUDA work; more ranks than GPUs
// and a missing device are usage errors; CUDA failures are CudaErrors naming the call.

#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/env.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "fake_ranks.hpp"

using namespace ddprun;
using namespace ddprun::runtime;
using namespace std::chrono_literals;
using ddprun::test::message_of;
using nccl::Handle;
using nccl::fake::Fate;

namespace {

using Clock = std::chrono::steady_clock;

// A compute stream of the trainer's, made on device `device` of the fake (on rank threads too:
// throws instead of asserting).
Handle compute_stream(nccl::Api& api, int device) {
  Handle s = nullptr;
  if (!api.set_device(device).is_ok() || !api.stream_create(&s).is_ok()) throw std::runtime_error("fake stream");
  return s;
}

}  // namespace

TEST_CASE("fake nccl streams: zero() runs after the compute stream's work and before its next", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& api = *f.apis[0];
  auto g = f.group(0);
  Handle compute = compute_stream(api, 0);
  g->set_compute_stream(compute);
  auto* buf = static_cast<float*>(g->allocate(4 * sizeof(float)));
  const float nine = 9;
  g->copy_to_device(buf, &nine, sizeof nine);
  auto gate = nccl::fake::hold(api, compute);  // the trainer's kernels have not run yet
  nccl::fake::launch(api, compute, [&] { buf[0] = 5; });  // the last backward writes a gradient
  g->zero(buf, 4 * sizeof(float));
  float seen = -1;
  nccl::fake::launch(api, compute, [&] { seen = buf[0]; });  // the next backward reads it
  bool zeroed_early = buf[0] == 0.0f;
  gate->open();
  g->barrier();
  CHECK_FALSE(zeroed_early);
  CHECK(seen == 0.0f);
  g->deallocate(buf);
  api.stream_destroy(compute);
}

TEST_CASE("fake nccl streams: a collective starts after the compute stream, and wait() orders it before the next "
          "kernel without blocking the host", "[nccl-fake]") {
  test::FakeRanks f(2);
  ProcessGroupOptions timeout;
  timeout.timeout = 10s;  // a wait() that blocked the host would hold the gate shut until then
  float seen[2] = {-1, -1};
  double waited_ms[2] = {-1, -1};
  auto errors = f.run([&](int r, ProcessGroup& g) {
    auto& api = *f.apis[static_cast<std::size_t>(r)];
    Handle compute = compute_stream(api, r);
    g.set_compute_stream(compute);
    auto* buf = static_cast<float*>(g.allocate(sizeof(float)));
    auto gate = nccl::fake::hold(api, compute);
    nccl::fake::launch(api, compute, [&, r] { buf[0] = static_cast<float>(r + 1); });  // the gradient
    auto work = g.all_reduce_async(buf, 1, DataType::kFloat32, ReduceOp::kSum);
    auto t0 = Clock::now();
    work->wait();
    waited_ms[r] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    nccl::fake::launch(api, compute, [&, r] { seen[r] = buf[0]; });  // the optimizer
    gate->open();
    g.barrier();
    g.deallocate(buf);
    api.stream_destroy(compute);
  }, timeout);
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(seen[0] == 3.0f);  // 1 + 2: both gradients were written before the sum, read after
  CHECK(seen[1] == 3.0f);
  CHECK(waited_ms[0] < 1000);
  CHECK(waited_ms[1] < 1000);
}

TEST_CASE("fake nccl threads: the group's device is set on every thread that does CUDA work", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& s = *f.states[0];
  s.devices = 2;
  auto& api = *f.apis[0];
  ProcessGroupOptions o;
  o.device = 1;
  std::shared_ptr<ProcessGroup> g = f.group(0, o);
  int device_after = -1;
  api.get_device(&device_after);  // the creating thread keeps its own device
  std::string errors;
  std::thread user([&] {  // a thread that never set a device: CUDA puts it on device 0
    errors = message_of([&] {
      Reducer red(g, {{256}, {1}}, ReducerOptions{.broadcast_parameters = false});
      red.zero_grad();
      std::vector<float> host(256, 1.0f);
      g->copy_to_device(red.grad(0), host.data(), host.size() * sizeof(float));
      red.mark_ready(1);
      red.mark_ready(0);
      red.finalize();
      g->copy_to_host(host.data(), red.grad(0), host.size() * sizeof(float));
      g->all_reduce_async(red.grad(0), 256, DataType::kFloat32, ReduceOp::kSum)->synchronize();
      g->barrier();
    });
  });
  user.join();
  std::thread closer([&] { g.reset(); });  // destroyed on yet another thread
  closer.join();
  CHECK(errors.empty());
  CHECK(device_after == 0);
  for (const auto& w : s.wrong_device()) UNSCOPED_INFO(w);
  CHECK(s.wrong_device().empty());
}

TEST_CASE("fake nccl: more ranks than GPUs is a usage error unless the user opts in", "[nccl-fake]") {
  ProcessGroupOptions o;
  CHECK_THROWS_AS(nccl::choose_device(2, o, {2, 3}, 2), ddprun::UsageError);
  CHECK_THROWS_WITH(nccl::choose_device(2, o, {2, 3}, 2),
                    Catch::Contains("3 ranks run on this machine but it has 2 visible CUDA device(s)") &&
                        Catch::Contains("DDPRUN_NCCL_SHARE_DEVICES=1"));
  CHECK(nccl::choose_device(2, o, {1, 2}, 1) == 1);
  o.share_devices = true;
  CHECK(nccl::choose_device(2, o, {2, 3}, 2) == 0);
  o.device = 5;
  CHECK_THROWS_WITH(nccl::choose_device(2, o, {0, 1}, 0), Catch::Contains("asks for device 5"));

  std::map<std::string, std::string> env = {{"RANK", "0"},          {"WORLD_SIZE", "1"},
                                            {"LOCAL_RANK", "0"},    {"LOCAL_WORLD_SIZE", "1"},
                                            {"MASTER_ADDR", "h"},   {"MASTER_PORT", "1"}};
  CHECK_FALSE(DistEnv::from_map(env).share_devices);
  env["DDPRUN_NCCL_SHARE_DEVICES"] = "1";
  CHECK(DistEnv::from_map(env).share_devices);
  env["DDPRUN_NCCL_SHARE_DEVICES"] = "maybe";
  CHECK_THROWS_WITH(DistEnv::from_map(env), Catch::Contains("DDPRUN_NCCL_SHARE_DEVICES=maybe"));

  // Through the group: 2 ranks on a fake machine with one device.
  test::FakeRanks f(1);
  auto store = runtime::next_group_store(f.ranks.store("oversubscribed"), 1);
  CHECK_THROWS_AS(nccl::make_process_group(f.apis[0], store, 1, 2, {}, {1, 2}), ddprun::UsageError);
}

TEST_CASE("fake nccl: CUDA failures are CudaErrors naming the call and the device", "[nccl-fake]") {
  test::FakeRanks f(1);
  auto& s = *f.states[0];
  auto g = f.group(0);
  s.failing_call = "cudaMalloc";
  std::string alloc = message_of([&] { g->allocate(1 << 20); });
  CHECK_THROWS_AS(g->allocate(64), CudaError);
  CHECK_THAT(alloc, Catch::Contains("cudaMalloc") && Catch::Contains("device 0") &&
                        Catch::Contains("an illegal memory access"));
  s.failing_call = "";
  std::vector<char> host(64);
  void* buf = g->allocate(64);
  s.failing_call = "cudaMemcpyAsync";
  CHECK_THROWS_AS(g->copy_to_host(host.data(), buf, 64), CudaError);
  s.failing_call = "";
  g->barrier();  // a copy that could not be queued leaves the group whole
  g->deallocate(buf);
}
