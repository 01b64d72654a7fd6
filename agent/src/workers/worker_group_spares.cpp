// WorkerGroup: first heartbeats (a recovery's "ready"), warm spares (spares.hpp) and the start
// of a group's workers, handed to their spares or started cold.
#include <unistd.h>

#include "ddprun/common/error.hpp"
#include "workers/worker_group_impl.hpp"

namespace ddprun::agent {

using namespace std::chrono_literals;

// Every slot's worker, started together (in parallel where the runner can); the ones that
// started are the group's even when another could not (the caller kills them then).
void WorkerGroup::Impl::spawn_all() {
  // Warm spares first (each handed its worker's attempt), then the others started cold.
  std::vector<ProcessRunner::Started> started(slots.size());
  std::vector<std::size_t> cold;
  warm = 0;
  std::vector<const WorkerSpec*> specs;
  for (const auto& s : slots) specs.push_back(&s->w.spec);
  auto handed = spares ? spares->hand_over(specs) : std::vector<std::optional<ProcessRunner::Started>>(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (handed[i]) {
      started[i] = *handed[i];
      ++warm;
    } else {
      cold.push_back(i);
    }
  }
  std::vector<ProcessRunner::Request> requests;
  for (std::size_t i : cold) {
    const auto& spec = slots[i]->w.spec;
    requests.push_back({&spec.argv, &spec.env, spec.binding ? &*spec.binding : nullptr, spec.state_fd});
  }
  std::vector<ProcessRunner::Started> started_cold;
  std::string failure = requests.empty() ? "" : runner.start_all(requests, started_cold);
  for (std::size_t j = 0; j < cold.size() && j < started_cold.size(); ++j) started[cold[j]] = started_cold[j];
  // First what cannot fail: every worker that started is the group's (the caller kills them all
  // if anything below throws); then their pipes, the descriptors not yet taken closed on failure.
  const auto now = std::chrono::system_clock::now();
  for (std::size_t i = 0; i < slots.size() && i < started.size(); ++i) {
    if (started[i].pid <= 0) continue;
    slots[i]->w.pid = started[i].pid;
    slots[i]->w.life = Life::running;
    slots[i]->w.started_wall = now;
  }
  try {
    for (std::size_t i = 0; i < slots.size() && i < started.size(); ++i) {
      if (started[i].pid <= 0) continue;
      Slot& s = *slots[i];
      open_pipe(s, s.out_pipe, std::exchange(started[i].stdout_fd, -1), *s.out);
      open_pipe(s, s.err_pipe, std::exchange(started[i].stderr_fd, -1), *s.err);
    }
  } catch (...) {
    for (const auto& p : started) {
      for (int fd : {p.stdout_fd, p.stderr_fd}) {
        if (fd >= 0) ::close(fd);
      }
    }
    throw;
  }
  if (!failure.empty()) throw Error(failure);
}

bool WorkerGroup::Impl::look_at_beat(Slot& s, SteadyClock::time_point now) {
  return s.hb.look(s.w.spec.heartbeat_file, now);
}

void WorkerGroup::Impl::poll_first_beats() {
  if (!first_beats || stopping() || state == State::ended) return;
  const auto now = SteadyClock::now();
  bool all = true;
  for (auto& s : slots) {
    if (!s->hb.beaten() && !s->w.spec.heartbeat_file.empty()) look_at_beat(*s, now);
    all = all && (s->hb.beaten() || s->w.spec.heartbeat_file.empty() || !s->w.running());
  }
  if (all) return std::exchange(first_beats, nullptr)();
  first_beat_timer.expires_after(first_beat_look(now - first_beats_since));
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
      if (!s->hb.beaten() && !s->w.spec.heartbeat_file.empty()) look_at_beat(*s, now);
      up = up && s->hb.beaten();
    }
    if (!up && now < spares_due) return arm_spares();
    std::vector<WorkerSpec> specs;
    for (const auto& s : slots) specs.push_back(s->w.spec);
    spares->make(specs);
  });
}

void WorkerGroup::watch_first_beats(std::function<void()> ready) {
  impl_->first_beats = std::move(ready);
  impl_->first_beats_since = SteadyClock::now();
  impl_->poll_first_beats();
}
int WorkerGroup::spares_waiting() const { return impl_->spares ? impl_->spares->count() : 0; }
int WorkerGroup::spares_ready() const { return impl_->spares ? impl_->spares->ready_count() : 0; }
long long WorkerGroup::spares_memory_bytes() const { return impl_->spares ? impl_->spares->memory_bytes() : 0; }
void WorkerGroup::make_spares(const std::vector<WorkerSpec>& specs) {
  if (impl_->spares) impl_->spares->make(specs);
}
void WorkerGroup::discard_spares() {
  if (impl_->spares) impl_->spares->discard_all();
}
}  // namespace ddprun::agent
