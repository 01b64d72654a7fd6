#pragma once
// The guardian is the running program started again with a flag (/proc/self/exe
// --ddprun-guardian ...): every program that runs an Agent (ddprun, ddprun-full, the tests)
// hands such a start to guardian_main first thing in its main.
//
//   int main(int argc, char** argv) {
//     if (ddprun::agent::is_guardian_start(argc, argv)) ddprun::agent::guardian_main(argc, argv);
//     ...

namespace ddprun::agent {

bool is_guardian_start(int argc, char** argv);
// Watches the job until the agent says goodbye or dies; never returns. A start that is not
// whole and sound (not started by an agent) exits 2 and touches nothing.
[[noreturn]] void guardian_main(int argc, char** argv);

}  // namespace ddprun::agent
