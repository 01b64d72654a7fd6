#pragma once
// Heartbeats for ddprun's hang detection (--worker_timeout): touch DDPRUN_HEARTBEAT_FILE.
// The runtime calls this itself after every collective and Reducer::finalize, so trainers built
// on it need no code of their own; a loop doing long work without collectives can call it too.

namespace ddprun::runtime {

// Touches $DDPRUN_HEARTBEAT_FILE, at most once a second (cheap to call often). Does nothing
// when the variable is unset. Thread-safe.
void heartbeat();

}  // namespace ddprun::runtime
