#pragma once
// Heartbeats for ddprun's hang detection (--worker_timeout, README: Hangs), in
// DDPRUN_HEARTBEAT_FILE. The runtime beats itself: a step after every Reducer::finalize (the
// gradient all-reduce of an optimizer step), progress after every other collective, so trainers
// built on it need no code of their own; a loop doing long work without collectives (an
// evaluation) can call heartbeat() too.

namespace ddprun::runtime {

// Touches $DDPRUN_HEARTBEAT_FILE, at most once a second (cheap to call often). Does nothing
// when the variable is unset. Thread-safe.
void heartbeat();

// A step done: the count of steps written into the file, at most once a second. Under
// --worker_timeout=auto the agent judges a worker only after its first step, by its step times.
void heartbeat_step();

// Steps will follow (a Reducer was made): "0" is written, so that the beats of collectives before
// the first step (the parameters' broadcast) are progress, not steps; the agent starts judging a
// worker at its first step, however long it takes.
void heartbeat_steps_follow();

}  // namespace ddprun::runtime
