#include "ddprun/agent/resources.hpp"

#include <unistd.h>

#include <climits>
#include <filesystem>

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

// The program `name` beside this one, if it is there and executable; else "".
std::string beside_program(const char* name) {
  std::string path = program_dir() + "/" + name;
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

}  // namespace

std::string python_site_dir() {
  std::string dir = program_dir() + "/" DDPRUN_DATA_FROM_BIN "/ddprun/python";
  if (::access((dir + "/sitecustomize.py").c_str(), R_OK) != 0) return "";
  // The program's directory is the kernel's answer (no symbolic link in it), so the ".." of
  // DATA_FROM_BIN resolves by the text alone: no readlink of every component at every launch.
  std::string clean = std::filesystem::path(dir).lexically_normal().string();
  if (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  return clean;
}

std::string stack_tool() { return beside_program("ddprun-stack"); }

std::string full_program() { return beside_program("ddprun-full"); }

}  // namespace ddprun::agent
