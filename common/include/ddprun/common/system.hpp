#pragma once
// What ddprun reads from the machine and its own process: the environment as a map, the host
// name, a small file whole (/proc, /sys). One copy each.

#include <map>
#include <string>

namespace ddprun {

// This process's environment ("K=V" entries; an entry without '=' is skipped).
std::map<std::string, std::string> environment_map();

// This machine's host name ("?" when it cannot be read).
std::string host_name();

// The whole content of a small file such as /proc/PID/stat or a cgroup's cgroup.events; "" when
// it cannot be read (a process that is gone, a file that is not there).
std::string read_file(const std::string& path);

}  // namespace ddprun
