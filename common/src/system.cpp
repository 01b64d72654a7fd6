#include "ddprun/common/system.hpp"

#include <unistd.h>

extern char** environ;

namespace ddprun {

std::map<std::string, std::string> environment_map() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::string host_name() {
  char buf[256] = "?";
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  buf[sizeof(buf) - 1] = '\0';
  return buf;
}

}  // namespace ddprun
