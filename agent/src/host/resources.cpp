#include "ddprun/agent/resources.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

bool trusted_owner(const struct stat& st) { return st.st_uid == 0 || st.st_uid == ::geteuid(); }

std::string mode_text(const struct stat& st) {
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return mode;
}

// Why someone other than root or this user could have planted or changed `file` (a path without
// "." or ".." in it), or "". Each directory from / down is looked at as the kernel goes through
// it (links followed): owned by root or this user, writable by nobody else; a directory others
// may write to passes only when sticky (they cannot rename or remove an entry of someone else)
// and the entry taken from it is itself root's or this user's.
std::string untrusted_on_path(const std::string& file) {
  struct stat st{};
  for (std::size_t end = 0; end != std::string::npos;) {
    end = file.find('/', end + 1);
    const std::string prefix = file.substr(0, end == std::string::npos ? file.size() : end);
    const std::string shown = prefix.empty() ? "/" : prefix;
    if (::stat(shown.c_str(), &st) != 0) return "cannot inspect " + shown + ": " + std::strerror(errno);
    if (!trusted_owner(st)) {
      return shown + " belongs to uid " + std::to_string(st.st_uid) + ", neither root nor this user";
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
      if (!S_ISDIR(st.st_mode) || !(st.st_mode & S_ISVTX) || end == std::string::npos ||
          file.rfind('/') == end) {  // the hook's own directory and the file: writable by nobody else
        return shown + " is writable by group or others (mode " + mode_text(st) + ")";
      }
    }
  }
  return "";
}

}  // namespace

std::string python_site_dir(std::string* refused) {
  std::string dir = program_dir() + "/" DDPRUN_DATA_FROM_BIN "/ddprun/python";
  if (::access((dir + "/sitecustomize.py").c_str(), R_OK) != 0) return "";
  // The program's directory is the kernel's answer (no symbolic link in it), so the ".." of
  // DATA_FROM_BIN resolves by the text alone: no readlink of every component at every launch.
  std::string clean = std::filesystem::path(dir).lexically_normal().string();
  if (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  std::string why = untrusted_on_path(clean + "/sitecustomize.py");
  if (why.empty()) return clean;
  if (refused) *refused = why;
  return "";
}

std::string stack_tool() { return beside_program("ddprun-stack"); }

std::string full_program() { return beside_program("ddprun-full"); }

}  // namespace ddprun::agent
