#include "ddprun/agent/resources.hpp"

#include <unistd.h>

#include <climits>

namespace ddprun::agent {
namespace {

std::string program_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string exe(buf, static_cast<std::size_t>(n));
  return exe.substr(0, exe.rfind('/'));
}

}  // namespace

std::string stack_tool() {
  std::string path = program_dir() + "/ddprun-stack";
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

}  // namespace ddprun::agent
