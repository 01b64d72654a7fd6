#include "ddprun/runtime/reducer.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/heartbeat.hpp"
#include "device_compression.hpp"
#include "reducer_setup.hpp"

namespace ddprun::runtime {

namespace {

constexpr const char* kCallFinalize =
    "call finalize() after the last mark_ready() and before the optimizer uses the gradients (they are averaged "
    "across ranks only then)";

struct Bucket {
  Reducer::BucketInfo info;
  std::vector<std::size_t> offsets;  // byte offset of each parameter in the bucket
  void* storage = nullptr;           // group memory
  std::size_t count = 0;             // elements
  std::size_t pending = 0;           // parameters not yet ready in this iteration
  std::vector<std::uint16_t> wire;   // compressed copy (host memory: gloo, float32 buckets)
  void* device_wire = nullptr;       // compressed copy (group memory: DeviceCompression)
  std::shared_ptr<Work> work;
};

}  // namespace

struct Reducer::Impl {
  std::shared_ptr<ProcessGroup> group;
  ReducerOptions opt;
  std::vector<ParameterSpec> params;
  std::vector<Bucket> buckets;
  std::vector<std::pair<std::size_t, std::size_t>> where;  // parameter -> (bucket, offset)
  std::vector<bool> ready;
  // Buckets are reduced in bucket order, never out of it: collectives must be issued in the
  // same order on every rank, and backward may finish parameters in a slightly different
  // order on different ranks. A ready bucket waits for the ones before it.
  std::size_t next_launch = 0;
  // Compression done by the group on its own memory (nccl), or nullptr: on the host (gloo).
  DeviceCompression* device_compression = nullptr;
  // The program's gradient memory (llm.c style), or nullptr: buckets the Reducer allocates.
  char* user_gradients = nullptr;

  void assign_buckets() {
    // Reverse registration order: the order backward produces gradients (last layer first).
    Bucket cur;
    auto close = [&] {
      if (cur.info.params.empty()) return;
      buckets.push_back(std::move(cur));
      cur = Bucket();
    };
    for (std::size_t k = params.size(); k-- > 0;) {
      const auto& p = params[k];
      std::size_t bytes = p.count * element_size(p.type);
      std::size_t limit = buckets.empty() ? opt.first_bucket_bytes : opt.bucket_cap_bytes;
      if (!cur.info.params.empty() && (cur.info.type != p.type || cur.info.bytes + bytes > limit)) close();
      if (cur.info.params.empty()) cur.info.type = p.type;
      cur.offsets.push_back(cur.info.bytes);
      cur.info.params.push_back(k);
      cur.info.bytes += bytes;
      // Keep every parameter 64-byte aligned inside the bucket.
      cur.info.bytes = (cur.info.bytes + 63) / 64 * 64;
    }
    close();
    if (user_gradients) place_in_user_memory();
    where.resize(params.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& bk = buckets[b];
      if (!user_gradients) bk.storage = group->allocate(bk.info.bytes);
      bk.count = bk.info.bytes / element_size(bk.info.type);
      bk.pending = bk.info.params.size();
      for (std::size_t j = 0; j < bk.info.params.size(); ++j) where[bk.info.params[j]] = {b, bk.offsets[j]};
    }
  }

  // Buckets over the program's gradient array: parameters lie back to back in registration
  // order, so a bucket (a run of consecutive parameters) is one contiguous range of it.
  void place_in_user_memory() {
    std::vector<std::size_t> start(params.size() + 1, 0);
    for (std::size_t k = 0; k < params.size(); ++k) start[k + 1] = start[k] + params[k].count * element_size(params[k].type);
    for (auto& bk : buckets) {
      std::size_t first = *std::min_element(bk.info.params.begin(), bk.info.params.end());
      std::size_t last = *std::max_element(bk.info.params.begin(), bk.info.params.end());
      bk.storage = user_gradients + start[first];
      bk.info.bytes = start[last + 1] - start[first];
      for (std::size_t j = 0; j < bk.info.params.size(); ++j) bk.offsets[j] = start[bk.info.params[j]] - start[first];
    }
  }

  bool compress(const Bucket& b) const { return opt.compression != Compression::kNone && b.info.type == DataType::kFloat32; }
  DataType wire_type() const {
    return opt.compression == Compression::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
  }

  void launch(Bucket& b) {
    if (!compress(b)) {
      b.work = group->all_reduce_async(b.storage, b.count, b.info.type, ReduceOp::kAvg);
      return;
    }
    if (device_compression) {
      b.work = device_compression->all_reduce_compressed_async(static_cast<float*>(b.storage), b.count, wire_type(),
                                                               b.device_wire);
      return;
    }
    const auto* src = static_cast<const float*>(b.storage);
    b.wire.resize(b.count);
    bool half = opt.compression == Compression::kFloat16;
    for (std::size_t i = 0; i < b.count; ++i) b.wire[i] = half ? float_to_half(src[i]) : float_to_bfloat16(src[i]);
    b.work = group->all_reduce_async(b.wire.data(), b.count, half ? DataType::kFloat16 : DataType::kBFloat16,
                                     ReduceOp::kAvg);
  }

  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(buckets[next_launch++]);
  }

  void account_unused();
  std::vector<std::exception_ptr> wait_all();
  void decompress();

  void reset_iteration() {
    next_launch = 0;
    std::fill(ready.begin(), ready.end(), false);
    for (auto& b : buckets) {
      b.pending = b.info.params.size();
      b.work.reset();
    }
  }
};

Reducer::Reducer(std::shared_ptr<ProcessGroup> group, std::vector<ParameterSpec> params, ReducerOptions options)
    : Reducer(std::move(group), std::move(params), nullptr, options) {}

Reducer::Reducer(std::shared_ptr<ProcessGroup> group, std::vector<ParameterSpec> params, void* gradients,
                 ReducerOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!group) throw UsageError("Reducer: no process group");
  if (params.empty()) throw UsageError("Reducer: no parameters registered");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].count == 0) throw UsageError("Reducer: parameter " + std::to_string(i) + " has no elements");
  }
  if (options.bucket_cap_bytes == 0 || options.first_bucket_bytes == 0) {
    throw UsageError("Reducer: bucket sizes must be positive");
  }
  if (options.compression != Compression::kNone && std::string(group->backend()) != "gloo") {
    impl_->device_compression = dynamic_cast<DeviceCompression*>(group.get());
    if (!impl_->device_compression) {
      throw UsageError(std::string("Reducer: compression is not available with the ") + group->backend() + " backend");
    }
  }
  heartbeat_steps_follow();  // the beats until the first finalize are progress, not steps
  // Collectives, on every rank: the same parameters, then rank 0's values everywhere.
  if (options.broadcast_parameters) require_parameter_data(params);
  agree_on_parameters(*group, params);
  if (options.broadcast_parameters) broadcast_parameters(*group, params);
  impl_->user_gradients = static_cast<char*>(gradients);
  impl_->group = std::move(group);
  impl_->opt = options;
  impl_->params = std::move(params);
  impl_->ready.assign(impl_->params.size(), false);
  impl_->assign_buckets();
  if (impl_->device_compression) {
    for (auto& b : impl_->buckets) {
      if (impl_->compress(b)) b.device_wire = impl_->group->allocate(b.count * 2);
    }
  }
}

Reducer::~Reducer() {
  for (auto& b : impl_->buckets) {
    if (b.work) {
      try {
        b.work->wait();  // never free memory a collective is still using
      } catch (...) {
      }
    }
    if (!impl_->user_gradients) impl_->group->deallocate(b.storage);
    if (b.device_wire) impl_->group->deallocate(b.device_wire);
  }
}

// From mark_ready(i) to finalize(), gradient i belongs to the reduction: its bytes are local,
// in flight or averaged, depending on when they are read. The accessor refuses them, so a trainer
// that skipped finalize() stops before its optimizer applies an unaveraged gradient (a pointer
// kept from before mark_ready, or the program's own gradient array, is not checked).
void* Reducer::grad(std::size_t i) {
  if (i >= impl_->params.size()) throw UsageError("Reducer: no parameter " + std::to_string(i));
  if (impl_->ready[i]) {
    const auto k = std::to_string(i);
    throw UsageError("Reducer: grad(" + k + ") after mark_ready(" + k +
                     ") and before finalize(): the gradient is being averaged across ranks; " + kCallFinalize);
  }
  auto [b, off] = impl_->where[i];
  return static_cast<char*>(impl_->buckets[b].storage) + off;
}

void Reducer::zero_grad() {
  // Pending: a parameter was marked ready (its bucket may be on the wire) and finalize() not called.
  if (std::find(impl_->ready.begin(), impl_->ready.end(), true) != impl_->ready.end()) {
    throw UsageError(
        std::string("Reducer: zero_grad() while the last iteration's gradients are still being reduced: ") +
        kCallFinalize);
  }
  // Bucket memory may be device memory: the group zeroes it (nccl: a memset on its stream,
  // after the compute stream's work and before the next backward's).
  for (auto& b : impl_->buckets) impl_->group->zero(b.storage, b.info.bytes);
}

void Reducer::mark_ready(std::size_t i) {
  if (i >= impl_->params.size()) throw UsageError("Reducer: no parameter " + std::to_string(i));
  if (!sync_) return;
  if (impl_->ready[i]) {
    bool all = std::all_of(impl_->ready.begin(), impl_->ready.end(), [](bool r) { return r; });
    if (all) {
      throw UsageError("Reducer: parameter " + std::to_string(i) +
                       " marked ready again, but the last iteration was never finalized: " + kCallFinalize);
    }
    throw UsageError("Reducer: parameter " + std::to_string(i) + " marked ready twice in one iteration");
  }
  impl_->ready[i] = true;
  auto& b = impl_->buckets[impl_->where[i].first];
  if (--b.pending == 0) impl_->launch_ready();
}

void Reducer::finalize() {
  if (!sync_) return;
  auto& im = *impl_;
  im.account_unused();
  auto errors = im.wait_all();
  im.reset_iteration();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  im.decompress();
  heartbeat_step();
}

// Parameters that received no gradient: an error, unless find_unused_parameters (then their
// buckets go without them).
void Reducer::Impl::account_unused() {
  std::vector<std::size_t> unused;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!ready[i]) unused.push_back(i);
  }
  if (!unused.empty() && !opt.find_unused_parameters) {
    std::string list;
    for (std::size_t k = 0; k < unused.size() && k < 10; ++k) list += (k ? ", " : "") + std::to_string(unused[k]);
    if (unused.size() > 10) list += " and " + std::to_string(unused.size() - 10) + " more";
    reset_iteration();
    throw UsageError("Reducer: parameter(s) " + list +
                     " received no gradient in this iteration; mark them ready, or set "
                     "ReducerOptions::find_unused_parameters");
  }
  for (auto i : unused) {
    ready[i] = true;
    --buckets[where[i].first].pending;
  }
}

// Every bucket is waited for, failures or not (no collective may still use bucket memory when
// finalize returns or throws); each bucket's error is kept as it was caught, so a Work whose
// second wait() would return (as an earlier NCCL backend's did) cannot turn a failure into
// success. The caller throws the first in bucket order.
std::vector<std::exception_ptr> Reducer::Impl::wait_all() {
  std::vector<std::exception_ptr> errors(buckets.size());
  std::exception_ptr launch_error;  // the group failed before every bucket was issued
  try {
    launch_ready();
  } catch (...) {
    launch_error = std::current_exception();
  }
  auto wait = [&](std::size_t k) {
    auto& b = buckets[k];
    if (errors[k]) return;
    if (!b.work) {
      errors[k] = launch_error ? launch_error
                               : std::make_exception_ptr(NetworkError(
                                     "Reducer: bucket " + std::to_string(k) +
                                     " was never reduced: the process group failed before it was issued"));
      return;
    }
    try {
      b.work->wait();
    } catch (...) {
      errors[k] = std::current_exception();
    }
  };
  // Buckets complete in order, so waiting for the last one first wakes this thread once
  // instead of once per bucket (each wake-up takes a core from the communication threads).
  if (buckets.back().work) wait(buckets.size() - 1);
  for (std::size_t k = 0; k < buckets.size(); ++k) wait(k);
  return errors;
}

void Reducer::Impl::decompress() {
  if (device_compression) return;  // cast back on the device, as part of the collective
  for (auto& b : buckets) {
    if (!compress(b)) continue;
    auto* dst = static_cast<float*>(b.storage);
    bool half = opt.compression == Compression::kFloat16;
    for (std::size_t i = 0; i < b.count; ++i) dst[i] = half ? half_to_float(b.wire[i]) : bfloat16_to_float(b.wire[i]);
  }
}

std::vector<Reducer::BucketInfo> Reducer::buckets() const {
  std::vector<BucketInfo> out;
  for (const auto& b : impl_->buckets) out.push_back(b.info);
  return out;
}

std::size_t Reducer::num_parameters() const { return impl_->params.size(); }

void broadcast_tensors(ProcessGroup& group, const std::vector<TensorRef>& tensors, int root) {
  for (const auto& t : tensors) group.broadcast(t.data, t.count, t.type, root);
}

}  // namespace ddprun::runtime
