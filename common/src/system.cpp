#include "ddprun/common/system.hpp"

#include <unistd.h>

#include <fstream>
#include <iterator>

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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace ddprun
