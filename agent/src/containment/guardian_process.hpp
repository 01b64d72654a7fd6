#pragma once
// The guardian process: the loop that reads the agent's messages and acts on them, with the C++
// at hand (the cgroup's sweep, the scan for the job's token, the removal of the temporary
// directory). The sentinel becomes it by exec of the running program (guardian_sentinel.hpp):
// any program that links the agent library (ddprun, ddprun-full, a test) is recognised as one
// before its main, by a constructor in guardian_process.cpp, when argv[1] is
// guardian_protocol::kGuardianFlag and the number of the memfd that holds the sentinel's state.
// Where there is no sentinel, a fork of the agent runs the same loop (guardian_forked).

namespace ddprun::agent {

class Containment;

// In a fork of the agent (the pipe's read end `fd`): a session of its own, /dev/null for the
// console, the signals ignored, then the loop; never returns.
[[noreturn]] void guardian_forked(int fd, const Containment* containment);

// Referenced by the agent's side (guardian.cpp), so that a static link keeps guardian_process.cpp,
// and its constructor, in every program that starts a guardian.
void link_guardian_process();

}  // namespace ddprun::agent
