#include "ddprun/agent/resources.hpp"

#include <unistd.h>

#include <climits>
#include <filesystem>
#include <system_error>

#ifndef DDPRUN_DATA_FROM_BIN
#define DDPRUN_DATA_FROM_BIN "../share"  // CMAKE_INSTALL_DATADIR seen from CMAKE_INSTALL_BINDIR
#endif

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

std::string python_site_dir() {
  std::string dir = program_dir() + "/" DDPRUN_DATA_FROM_BIN "/ddprun/python";
  if (::access((dir + "/sitecustomize.py").c_str(), R_OK) != 0) return "";
  std::error_code ec;
  auto clean = std::filesystem::weakly_canonical(dir, ec);
  return ec ? dir : clean.string();
}

std::string stack_tool() {
  std::string path = program_dir() + "/ddprun-stack";
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

}  // namespace ddprun::agent
