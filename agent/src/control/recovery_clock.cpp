#include "control/recovery_clock.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "observe/event_log.hpp"

namespace ddprun::agent {
namespace {

double since(RecoveryClock::Clock::time_point from, RecoveryClock::Clock::time_point to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

std::string ms(double s) {
  if (s < 10) return fmt::format("{:.0f} ms", s * 1000);
  return fmt::format("{:.1f} s", s);
}

}  // namespace

const std::vector<const char*>& recovery_phase_names() {
  static const std::vector<const char*> names = {"detect", "stop", "rendezvous", "spawn", "ready", "total"};
  return names;
}

double phase_seconds(const RecoveryTimes& t, const std::string& phase) {
  if (phase == "detect") return t.detect;
  if (phase == "stop") return t.stop;
  if (phase == "rendezvous") return t.rendezvous;
  if (phase == "spawn") return t.spawn;
  if (phase == "ready") return t.ready;
  return t.total();
}

double seconds_since_wall(std::chrono::system_clock::time_point since, double at_least,
                          std::chrono::system_clock::time_point now) {
  at_least = std::max(0.0, at_least);
  if (since.time_since_epoch().count() == 0) return at_least;
  const double s = std::chrono::duration<double>(now - since).count();
  return s > 0 && s < 3600 ? std::max(s, at_least) : at_least;
}

std::string describe_recovery(const RecoveryTimes& t) {
  std::string start = t.warm > 0 && t.cold == 0 ? "hand-over" : t.warm > 0 ? "hand-over and spawn" : "spawn";
  std::string spares = t.warm > 0 ? fmt::format(" ({} warm{})", t.warm, t.cold ? fmt::format(", {} cold", t.cold) : "") : "";
  std::string line = fmt::format("{} {:.2f} s: detect {}, stop {}, rendezvous {}, {} {}{}, ",
                                 t.ready >= 0 ? "restarted in" : "restarted (no first heartbeat) after", t.total(),
                                 ms(t.detect), ms(t.stop), ms(t.rendezvous), start, ms(t.spawn), spares);
  line += t.ready >= 0 ? "ready " + ms(t.ready) : "ready: no heartbeat before the attempt ended";
  return line;
}

void RecoveryClock::fault(double detect_s, const std::string& cause, Clock::time_point now) {
  if (state_ != State::idle && state_ != State::running) return;  // the round's first fault only
  if (state_ == State::running) abandoned();
  now_ = RecoveryTimes{};
  now_.detect = std::max(0.0, detect_s);
  now_.cause = cause;
  mark_ = now;
  state_ = State::faulted;
}

void RecoveryClock::stopped(Clock::time_point now) {
  if (state_ != State::faulted) return;
  now_.stop = since(mark_, now);
  mark_ = now;
  state_ = State::stopped;
}

void RecoveryClock::joining(Clock::time_point now) {
  if (state_ != State::stopped) return;
  // Between the group's end and the join: the decision, part of "stop".
  now_.stop += since(mark_, now);
  mark_ = now;
  state_ = State::joined;
}

void RecoveryClock::round_ready(Clock::time_point now) {
  if (state_ != State::joined) return;
  now_.rendezvous = since(mark_, now);
  mark_ = now;
  state_ = State::ready_round;
}

void RecoveryClock::started(int attempt, int warm, int cold, Clock::time_point now) {
  if (state_ != State::ready_round) return;
  now_.attempt = attempt;
  now_.warm = warm;
  now_.cold = cold;
  now_.spawn = since(mark_, now);
  mark_ = now;
  state_ = State::running;
}

bool RecoveryClock::ready(Clock::time_point now) {
  if (state_ != State::running) return false;
  now_.ready = since(mark_, now);
  state_ = State::idle;
  show(now_);
  return true;
}

void RecoveryClock::abandoned() {
  if (state_ != State::running) return;
  now_.ready = -1;
  state_ = State::idle;
  show(now_);
}

void RecoveryClock::show(const RecoveryTimes& t) {
  done_.push_back(t);
  spdlog::info("ddprun: {}", describe_recovery(t));
  if (!events_.enabled()) return;
  auto sec = [](double s) { return s < 0 ? nlohmann::json() : nlohmann::json(s); };
  events_.emit("recovery", {{"attempt", t.attempt}, {"cause", t.cause}, {"total_s", t.total()},
                            {"detect_s", t.detect}, {"stop_s", t.stop}, {"rendezvous_s", t.rendezvous},
                            {"spawn_s", t.spawn}, {"ready_s", sec(t.ready)}, {"warm", t.warm}, {"cold", t.cold}});
}

}  // namespace ddprun::agent
