#pragma once
// Files ddprun ships beside its program, found from where the running program is (so an
// installed ddprun, a build tree and a relocated copy all find their own): PREFIX/bin/ddprun
// looks in PREFIX/share/ddprun/ and PREFIX/bin/; build/launcher/ddprun in build/share/ddprun/
// and build/launcher/.

#include <string>

namespace ddprun::agent {

// The directory holding ddprun's sitecustomize.py for Python workers (the progress hook);
// empty when it is not there, or when someone other than root and this user could have put it
// there or changed it (README: Security): every directory from / down to it, and the file, must
// belong to root or this user and be writable by nobody else (a sticky directory such as /tmp
// may be on the way when the entry in it is root's or this user's). Then `refused`, when given,
// says why it was not used.
std::string python_site_dir(std::string* refused = nullptr);

// The path of ddprun-stack (native stacks through libdw); empty when it is not there (ddprun
// built without libdw, or copied without it).
std::string stack_tool();

// The path of ddprun-full, the build of ddprun with OpenSSL that the `ddprun` program hands jobs
// needing it to (launcher/full_program.hpp); empty when it is not there.
std::string full_program();

}  // namespace ddprun::agent
