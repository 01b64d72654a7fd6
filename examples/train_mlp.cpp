// train_mlp: a small multi-layer perceptron trained data-parallel on CPU with ddprun's runtime.
//
//   ddprun --standalone --nproc_per_node=4 build/examples/train_mlp --steps 200
//
// The dataset is synthetic and deterministic; each step takes a global batch (split across the
// ranks by the DistributedSampler), so 1, 2 or 4 workers train the same model up to float
// rounding. Gradients go through the Reducer (bucketed, overlapped with backward). With
// --checkpoint, rank 0 saves every --checkpoint_every steps and a restarted job resumes from the
// last checkpoint; --crash_at_step makes rank 1 die at that step in the first attempt. With
// --memory_state, each rank keeps its parameters in ddprun's memory after every step, and with
// --persist DIR also asks ddprun's agent to write them to DIR/rankR.state every
// --checkpoint_every steps (in the background); a job started again loads those files. With
// --state_replicated the parameters (alike on every rank) are saved as replicated: each rank
// copies its share of them, and a restarted job gathers them.
// Each rank ends with: RESULT rank=R world=W loss=L checksum=C (and with --memory_state
// STATE rank=R bytes=<its last save's bytes>)

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/checkpoint.hpp"
#include "ddprun/runtime/memory_state.hpp"
#include "ddprun/runtime/env.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "ddprun/runtime/sampler.hpp"

using namespace ddprun::runtime;

namespace {

constexpr int kIn = 32, kHidden = 64, kOut = 1;
constexpr std::size_t kDataset = 8192;

struct Args {
  int steps = 200;
  int global_batch = 64;
  double bucket_cap_mb = 25;
  double lr = 0.05;
  std::string checkpoint;
  int checkpoint_every = 10;
  int crash_at_step = -1;
  bool memory_state = false;
  bool state_replicated = false;
  std::string persist;
  std::string backend = "gloo";
};

[[noreturn]] void usage(const std::string& msg, int code = 2) {
  std::fprintf(code == 0 ? stdout : stderr,
               "train_mlp: %s\nusage: train_mlp [--steps N] [--global_batch B] [--bucket_cap_mb MB] [--lr X]\n"
               "                 [--checkpoint PATH] [--checkpoint_every K] [--crash_at_step K] [--memory_state]\n"
               "                 [--state_replicated] [--persist DIR]\n",
               msg.c_str());
  std::exit(code);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    // A finite number from `lo` to `hi` (nan, inf and 1e30 are no step count or learning rate).
    auto num = [&](const std::string& v, double lo, double hi) {
      char* end = nullptr;
      double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !std::isfinite(d)) usage(k + " needs a number, got '" + v + "'");
      auto g = [](double x) {
        char b[32];
        std::snprintf(b, sizeof(b), "%g", x);
        return std::string(b);
      };
      if (d < lo || d > hi) usage(k + " must be from " + g(lo) + " to " + g(hi) + " (got '" + v + "')");
      return d;
    };
    auto count = [&](const std::string& v, int lo) {
      const double d = num(v, lo, 1e9);
      if (d != std::floor(d)) usage(k + " needs a whole number, got '" + v + "'");
      return static_cast<int>(d);
    };
    if (k == "--help" || k == "-h") usage("a small MLP trained with ddprun's runtime (bucketed all-reduce)", 0);
    else if (k == "--steps") a.steps = count(val(), 0);
    else if (k == "--global_batch") a.global_batch = count(val(), 1);
    else if (k == "--bucket_cap_mb") a.bucket_cap_mb = num(val(), 1e-6, 1e6);
    else if (k == "--lr") a.lr = num(val(), 0, 1e6);
    else if (k == "--checkpoint") a.checkpoint = val();
    else if (k == "--checkpoint_every") a.checkpoint_every = count(val(), 1);
    else if (k == "--crash_at_step") a.crash_at_step = count(val(), -1);
    else if (k == "--memory_state") a.memory_state = true;
    else if (k == "--state_replicated") a.state_replicated = true;
    else if (k == "--persist") a.persist = val();
    else usage("unknown argument '" + k + "'");
  }
  if (!a.persist.empty() && !a.memory_state) usage("--persist needs --memory_state");
  if (a.state_replicated && !a.memory_state) usage("--state_replicated needs --memory_state");
  return a;
}

// The dataset: x ~ N(0, 1), y = tanh(x . w) + 0.1 sin(3 x0); the same on every rank.
struct Data {
  std::vector<float> x, y;
  Data() : x(kDataset * kIn), y(kDataset) {
    std::mt19937 g(2024);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> w(kIn);
    for (auto& v : w) v = n(g) / std::sqrt(static_cast<float>(kIn));
    for (std::size_t s = 0; s < kDataset; ++s) {
      float dot = 0;
      for (int j = 0; j < kIn; ++j) {
        x[s * kIn + j] = n(g);
        dot += x[s * kIn + j] * w[j];
      }
      y[s] = std::tanh(dot) + 0.1f * std::sin(3.0f * x[s * kIn]);
    }
  }
};

// Parameters, in registration order: W1 b1 W2 b2 W3 b3 (row-major W[out][in]).
const std::vector<ParameterSpec> kShapes = {
    {kHidden * kIn}, {kHidden}, {kHidden * kHidden}, {kHidden}, {kOut * kHidden}, {kOut}};

std::vector<std::vector<float>> init_params() {
  std::mt19937 g(7);
  std::vector<std::vector<float>> p;
  int fan_in[] = {kIn, kIn, kHidden, kHidden, kHidden, kHidden};
  for (std::size_t k = 0; k < kShapes.size(); ++k) {
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(static_cast<float>(fan_in[k])),
                                            1.0f / std::sqrt(static_cast<float>(fan_in[k])));
    p.emplace_back(kShapes[k].count);
    for (auto& v : p.back()) v = u(g);
  }
  return p;
}

// out[b][o] = act(W . in[b] + bias)
void dense(const float* in, int n_in, const float* W, const float* bias, float* out, int n_out, int batch, bool act) {
  for (int b = 0; b < batch; ++b) {
    for (int o = 0; o < n_out; ++o) {
      float s = bias[o];
      for (int i = 0; i < n_in; ++i) s += W[o * n_in + i] * in[b * n_in + i];
      out[b * n_out + o] = act ? std::tanh(s) : s;
    }
  }
}

// Given dL/d(out) (pre- or post-activation handled by caller), accumulates dW, db, and dL/d(in).
void dense_backward(const float* in, int n_in, const float* W, const float* dout, int n_out, int batch, float* dW,
                    float* db, float* din) {
  for (int b = 0; b < batch; ++b) {
    for (int o = 0; o < n_out; ++o) {
      float g = dout[b * n_out + o];
      db[o] += g;
      for (int i = 0; i < n_in; ++i) dW[o * n_in + i] += g * in[b * n_in + i];
    }
  }
  if (!din) return;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < n_in; ++i) {
      float s = 0;
      for (int o = 0; o < n_out; ++o) s += dout[b * n_out + o] * W[o * n_in + i];
      din[b * n_in + i] = s;
    }
  }
}

std::string serialize(int step, const std::vector<std::vector<float>>& p) {
  std::string s(reinterpret_cast<const char*>(&step), sizeof(step));
  for (const auto& t : p) s.append(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float));
  return s;
}

int deserialize(const std::string& s, std::vector<std::vector<float>>& p) {
  std::size_t need = sizeof(int);
  for (const auto& t : p) need += t.size() * sizeof(float);
  if (s.size() != need) throw ddprun::Error("checkpoint has " + std::to_string(s.size()) + " bytes, this model needs " + std::to_string(need));
  int step;
  std::memcpy(&step, s.data(), sizeof(step));
  std::size_t off = sizeof(int);
  for (auto& t : p) {
    std::memcpy(t.data(), s.data() + off, t.size() * sizeof(float));
    off += t.size() * sizeof(float);
  }
  return step;
}

// One rank's training: its shard of the data, the model, the Reducer that averages gradients.
struct Trainer {
  const Args& args;
  int rank, world, batch;
  std::shared_ptr<ProcessGroup> pg;
  std::vector<std::vector<float>> params = init_params();
  Reducer reducer;
  Data data;
  DistributedSampler sampler;
  std::size_t steps_per_epoch;
  std::vector<std::int64_t> order;
  std::size_t order_epoch = ~std::size_t{0};
  std::vector<float> x, y, h1, h2, out, d_out, d_h2, d_h1;

  Trainer(const Args& a, const DistEnv& env, std::shared_ptr<ProcessGroup> group)
      : args(a), rank(env.rank), world(env.world_size), batch(a.global_batch / env.world_size), pg(std::move(group)),
        reducer(pg, with_data(kShapes, params), reducer_options(a)), sampler(kDataset, world, rank, /*shuffle=*/true, /*seed=*/0),
        steps_per_epoch(sampler.num_samples() / static_cast<std::size_t>(batch)),
        x(static_cast<std::size_t>(batch) * kIn), y(batch), h1(batch * kHidden), h2(batch * kHidden), out(batch),
        d_out(batch), d_h2(batch * kHidden), d_h1(batch * kHidden) {}

  // The Reducer copies rank 0's initial values to every rank at construction (ParameterSpec::data).
  static std::vector<ParameterSpec> with_data(std::vector<ParameterSpec> specs, std::vector<std::vector<float>>& p) {
    for (std::size_t k = 0; k < specs.size(); ++k) specs[k].data = p[k].data();
    return specs;
  }

  static ReducerOptions reducer_options(const Args& a) {
    ReducerOptions ropt;
    ropt.bucket_cap_bytes = static_cast<std::size_t>(a.bucket_cap_mb * 1024 * 1024);
    ropt.first_bucket_bytes = std::min(ropt.first_bucket_bytes, ropt.bucket_cap_bytes);
    return ropt;
  }

  // Replicas start identical whatever happened before (rank 0's values win).
  void broadcast() {
    std::vector<TensorRef> refs;
    for (auto& p : params) refs.push_back({p.data(), p.size(), DataType::kFloat32});
    broadcast_tensors(*pg, refs);
  }

  void load_batch(int step) {
    std::size_t epoch = static_cast<std::size_t>(step) / steps_per_epoch;
    if (epoch != order_epoch) {
      sampler.set_epoch(epoch);
      order = sampler.indices();
      order_epoch = epoch;
    }
    std::size_t pos = (static_cast<std::size_t>(step) % steps_per_epoch) * static_cast<std::size_t>(batch);
    for (int b = 0; b < batch; ++b) {
      auto s = static_cast<std::size_t>(order[pos + static_cast<std::size_t>(b)]);
      std::memcpy(&x[b * kIn], &data.x[s * kIn], kIn * sizeof(float));
      y[b] = data.y[s];
    }
  }

  // The local batch's mean squared error; d_out its gradient.
  float forward() {
    dense(x.data(), kIn, params[0].data(), params[1].data(), h1.data(), kHidden, batch, true);
    dense(h1.data(), kHidden, params[2].data(), params[3].data(), h2.data(), kHidden, batch, true);
    dense(h2.data(), kHidden, params[4].data(), params[5].data(), out.data(), kOut, batch, false);
    float local = 0;
    for (int b = 0; b < batch; ++b) {
      float e = out[b] - y[b];
      local += e * e;
      d_out[b] = 2.0f * e / static_cast<float>(batch);  // mean over the local batch; the Reducer averages ranks
    }
    return local / static_cast<float>(batch);
  }

  // Each layer's gradients are handed to the Reducer as soon as they exist, so the last layer's
  // bucket is on the wire while earlier layers are still being computed.
  void backward() {
    reducer.zero_grad();
    dense_backward(h2.data(), kHidden, params[4].data(), d_out.data(), kOut, batch, reducer.grad_as<float>(4),
                   reducer.grad_as<float>(5), d_h2.data());
    reducer.mark_ready(5);
    reducer.mark_ready(4);
    for (int i = 0; i < batch * kHidden; ++i) d_h2[i] *= 1.0f - h2[i] * h2[i];
    dense_backward(h1.data(), kHidden, params[2].data(), d_h2.data(), kHidden, batch, reducer.grad_as<float>(2),
                   reducer.grad_as<float>(3), d_h1.data());
    reducer.mark_ready(3);
    reducer.mark_ready(2);
    for (int i = 0; i < batch * kHidden; ++i) d_h1[i] *= 1.0f - h1[i] * h1[i];
    dense_backward(x.data(), kIn, params[0].data(), d_h1.data(), kHidden, batch, reducer.grad_as<float>(0),
                   reducer.grad_as<float>(1), nullptr);
    reducer.mark_ready(1);
    reducer.mark_ready(0);
    reducer.finalize();
  }

  void sgd() {
    for (std::size_t k = 0; k < params.size(); ++k) {
      const float* g = reducer.grad_as<float>(k);
      for (std::size_t i = 0; i < params[k].size(); ++i) params[k][i] -= static_cast<float>(args.lr) * g[i];
    }
  }

  // Position-weighted, so that swapped or offsetting values change it too.
  double checksum() const {
    double sum = 0;
    for (const auto& t : params) {
      for (std::size_t i = 0; i < t.size(); ++i) sum += static_cast<double>(t[i]) * static_cast<double>(1 + i % 7);
    }
    return sum;
  }
};

int train(const Args& args) {
  auto env = DistEnv::from_environment();
  if (args.global_batch % env.world_size != 0) {
    usage("--global_batch " + std::to_string(args.global_batch) + " is not divisible by the " +
          std::to_string(env.world_size) + " workers");
  }
  const auto world = static_cast<std::size_t>(env.world_size);
  const std::size_t share = (kDataset + world - 1) / world;  // a rank's samples an epoch (the sampler pads)
  if (static_cast<std::size_t>(args.global_batch) / world > share) {
    usage("--global_batch " + std::to_string(args.global_batch) + " gives each of the " + std::to_string(world) +
          " workers a batch larger than its share of the " + std::to_string(kDataset) + " samples: at most " +
          std::to_string(share * world));
  }
  Trainer t(args, env, init_process_group(args.backend, env));
  int start_step = 0;
  if (!args.checkpoint.empty()) {
    if (auto data = load_checkpoint(args.checkpoint)) {
      start_step = deserialize(*data, t.params);
      if (t.rank == 0) std::printf("resumed from %s at step %d (attempt %d)\n", args.checkpoint.c_str(), start_step, env.restart_count);
    }
  }
  // --memory_state: the parameters after each step, kept by ddprun's agent (docs/usage.md:
  // In-memory state); a restarted rank goes on from the newest step every rank holds.
  MemoryState state;
  const std::string persisted = args.persist + "/rank" + std::to_string(t.rank) + ".state";
  if (args.memory_state) {
    auto found = state.load(*t.pg);
    const bool from_disk = !found && !args.persist.empty();
    if (from_disk) found = MemoryState::load(*t.pg, persisted);  // the whole job was lost: the last file
    if (found) {
      for (std::size_t k = 0; k < t.params.size(); ++k) {
        const auto& b = found->buffers.at("p" + std::to_string(k));
        if (b.size() != t.params[k].size() * sizeof(float)) throw ddprun::Error("the in-memory state is of another model");
        std::memcpy(t.params[k].data(), b.data(), b.size());
      }
      start_step = static_cast<int>(found->step) + 1;
      std::printf("LOADED rank=%d checksum=%.9f\n", t.rank, t.checksum());  // before rank 0's broadcast
      if (t.rank == 0) {
        std::printf("resumed from %s at step %d (attempt %d)\n", from_disk ? persisted.c_str() : "memory", start_step,
                    env.restart_count);
      }
    }
  }
  t.broadcast();
  float loss = 0;
  for (int step = start_step; step < args.steps; ++step) {
    if (step == args.crash_at_step && env.restart_count == 0) {
      // Once every rank's last save is committed (one killed mid-copy would resume a step earlier).
      state.wait();
      float one = 1;
      t.pg->all_reduce(&one, 1, DataType::kFloat32, ReduceOp::kSum);
      if (t.rank == (t.world > 1 ? 1 : 0)) {
        std::fprintf(stderr, "rank %d: crashing at step %d as asked (--crash_at_step)\n", t.rank, step);
        std::_Exit(17);
      }
    }
    t.load_batch(step);
    loss = t.forward();
    t.backward();
    state.wait();  // the last save's copy of the parameters, before the step changes them
    t.sgd();
    if (t.rank == 0 && (step + 1) % 50 == 0) std::printf("step %d loss %.6f (rank 0's share of the batch)\n", step + 1, loss);
    if (args.memory_state) {
      std::vector<StateBuffer> buffers;
      for (std::size_t k = 0; k < t.params.size(); ++k) {
        // The parameters are alike on every rank: with --state_replicated each rank copies its share.
        buffers.push_back({"p" + std::to_string(k), t.params[k].data(), t.params[k].size() * sizeof(float),
                           args.state_replicated});
      }
      state.save_async(step, buffers);  // copied while the next forward and backward run
      if (!args.persist.empty() && (step + 1) % args.checkpoint_every == 0) state.persist(persisted);
    }
    if (!args.checkpoint.empty() && (step + 1) % args.checkpoint_every == 0) {
      save_checkpoint_on_rank0(*t.pg, args.checkpoint, serialize(step + 1, t.params));
    }
  }
  // The mean loss of the last global batch, the same on every rank.
  t.pg->all_reduce(&loss, 1, DataType::kFloat32, ReduceOp::kAvg);
  std::printf("RESULT rank=%d world=%d loss=%.6f checksum=%.9f\n", t.rank, t.world, loss, t.checksum());
  if (args.memory_state) std::printf("STATE rank=%d bytes=%zu\n", t.rank, state.last_bytes());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // ddprun reads workers' output through pipes, where C stdio is block-buffered: without this,
  // progress lines would appear only at exit (or every 4 KiB).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Args args = parse(argc, argv);
  try {
    return train(args);
  } catch (const ddprun::Error& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
