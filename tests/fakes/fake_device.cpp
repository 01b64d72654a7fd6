// The fake's streams, events and blocking waits (see fake_nccl.hpp).

#include "fake_fabric.hpp"

namespace ddprun::runtime::nccl::fake {

std::vector<std::string> State::wrong_device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wrong_device_;
}

void State::note_wrong_device(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  wrong_device_.push_back(std::move(what));
}

bool Fabric::step(Stream& s) {
  if (s.ops.empty()) return false;
  Op& op = s.ops.front();
  if (op.wait_for && !op.wait_for->passed) return false;
  if (op.gate_open && !*op.gate_open) return false;
  if (op.coll) {
    auto& c = *op.coll;
    if (!c.done && !c.comm->aborted) {
      if (!c.arrived) start(op.coll);
      if (!c.done) return false;
    }
  }
  if (op.host) op.host();
  if (op.mark) op.mark->passed = true;
  s.ops.pop_front();
  return true;
}

void Fabric::pump() {
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& [device, s] : legacy) {
      while (step(s)) progress = true;
    }
    for (Stream* s : streams) {
      while (step(*s)) progress = true;
    }
  }
  cv.notify_all();
}

Status Fabric::wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready, const char* what) {
  bool ok = cv.wait_for(lock, kFakeWait, [&] { return shut || ready(); });
  if (shut && !ready()) return Status::error(std::string("fake: ") + what + ": the fabric was shut down");
  if (!ok) return Status::error(std::string("fake: ") + what + " did not happen within the fake's limit");
  return Status::ok();
}

std::shared_ptr<Fabric> make_fabric() { return std::make_shared<Fabric>(); }

void shutdown(Fabric& fabric) {
  std::lock_guard<std::mutex> lock(fabric.mu);
  fabric.shut = true;
  fabric.cv.notify_all();
}

}  // namespace ddprun::runtime::nccl::fake
