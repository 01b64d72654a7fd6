#pragma once
// The agent's own helper processes that read workers' stacks (eu-stack, gdb, ddprun-stack;
// stack_dump.cpp), while they run. They are started on the dumpers' threads, beside the loop,
// so the record is process-wide and thread-safe; the workers' runner passes it to a sweep
// (Containment::sweep's `exempt`), which must not kill them.

#include <sys/types.h>

#include <set>

namespace ddprun::agent {

void note_agent_helper(pid_t pid);
void forget_agent_helper(pid_t pid);
// The helpers running now.
std::set<pid_t> agent_helpers();

}  // namespace ddprun::agent
