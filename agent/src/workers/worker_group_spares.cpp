// WorkerGroup: first heartbeats (a recovery's "ready") and warm spares (spares.hpp).
#include "workers/worker_group_impl.hpp"

namespace ddprun::agent {

using namespace std::chrono_literals;

bool WorkerGroup::Impl::look_at_beat(Slot& s, SteadyClock::time_point now) {
  struct stat st{};
  if (::stat(s.w.spec.heartbeat_file.c_str(), &st) != 0 ||
      (st.st_mtim.tv_sec == s.beat_mtime.tv_sec && st.st_mtim.tv_nsec == s.beat_mtime.tv_nsec)) {
    return false;
  }
  s.beat_mtime = st.st_mtim;
  s.last_beat = now;
  s.beaten = true;
  return true;
}

void WorkerGroup::Impl::poll_first_beats() {
  if (!first_beats || stopping() || state == State::ended) return;
  const auto now = SteadyClock::now();
  bool all = true;
  for (auto& s : slots) {
    if (!s->beaten && !s->w.spec.heartbeat_file.empty()) look_at_beat(*s, now);
    all = all && (s->beaten || s->w.spec.heartbeat_file.empty() || !s->w.running());
  }
  if (all) return std::exchange(first_beats, nullptr)();
  first_beat_timer.expires_after(5ms);
  first_beat_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
    if (!ec && gen == generation) poll_first_beats();
  });
}

// Spares once the group is up: every worker has beaten once, or spares.delay has passed.
void WorkerGroup::Impl::arm_spares() {
  spare_timer.expires_after(std::chrono::milliseconds(100));
  spare_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
    if (ec || gen != generation || state != State::running) return;
    const auto now = SteadyClock::now();
    bool up = true;
    for (auto& s : slots) {
      if (!s->beaten && !s->w.spec.heartbeat_file.empty()) look_at_beat(*s, now);
      up = up && s->beaten;
    }
    if (!up && now < spares_due) return arm_spares();
    std::vector<WorkerSpec> specs;
    for (const auto& s : slots) specs.push_back(s->w.spec);
    spares->make(specs);
  });
}

void WorkerGroup::watch_first_beats(std::function<void()> ready) {
  impl_->first_beats = std::move(ready);
  impl_->poll_first_beats();
}
int WorkerGroup::spares_waiting() const { return impl_->spares ? impl_->spares->count() : 0; }
int WorkerGroup::spares_ready() const { return impl_->spares ? impl_->spares->ready_count() : 0; }
long long WorkerGroup::spares_memory_bytes() const { return impl_->spares ? impl_->spares->memory_bytes() : 0; }
void WorkerGroup::discard_spares() {
  if (impl_->spares) impl_->spares->discard_all();
}
}  // namespace ddprun::agent
