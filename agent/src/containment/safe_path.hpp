#pragma once
// A directory path the user named (--log_dir), walked one component at a time as the kernel's
// fs.protected_symlinks rule would, whatever that sysctl says on this machine (README: Security):
// a symbolic link found in a sticky, world-writable directory (/tmp, a shared /shared/logs) is
// followed only when it belongs to this user or to that directory's owner. Another user's link
// there could send this job's logs wherever its planter chose.

#include <string>

#include "private_files.hpp"

namespace ddprun::agent {

// Opens the directory `path`, creating the missing components 0700; throws ddprun::Error naming
// the link, its owner and the directory when a planted link is on the way, or when a component
// cannot be created or is not a directory.
Fd open_dir_refusing_planted_links(const std::string& path);

}  // namespace ddprun::agent
