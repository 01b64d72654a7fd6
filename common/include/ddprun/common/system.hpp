#pragma once
// What ddprun reads from the machine and its own process: the environment as a map, the host
// name. One copy each.

#include <map>
#include <string>

namespace ddprun {

// This process's environment ("K=V" entries; an entry without '=' is skipped).
std::map<std::string, std::string> environment_map();

// This machine's host name ("?" when it cannot be read).
std::string host_name();

}  // namespace ddprun
