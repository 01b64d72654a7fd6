#include "ddprun/rendezvous/auth.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "handshake.hpp"

namespace ddprun::rendezvous::auth {

std::string random_bytes(std::size_t n) { return ddprun::random_bytes(n); }

std::string read_private_file(const std::string& path, const std::string& what, const std::string& create) {
  int fd = open_regular(path, O_RDONLY | O_NOCTTY);  // (a FIFO: refused, not waited on for a writer)
  if (fd < 0 && errno == EINVAL) throw UsageError(what + " '" + path + "' is not a regular file");
  if (fd < 0) {
    const int err = errno;  // the hint fits the cause: a file not there is made, one there is someone else's
    throw UsageError("cannot open " + what + " '" + path + "': " + std::strerror(err) +
                     (err == ENOENT ? " (create it with: " + create + ")"
                      : err == EACCES ? " (this user may not read it, or a folder on its path: run as its owner, or give a copy of your own, mode 600)"
                                      : ""));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError(what + " '" + path + "' is not a regular file");
  }
  if (st.st_mode & 077) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw UsageError(what + " '" + path + "' is accessible by other users (mode " + mode +
                     "): run chmod 600 '" + path + "' (and change it if others may have read it)");
  }
  std::string s(kMaxSecretBytes + 1, '\0');
  std::size_t have = 0;
  for (;;) {
    ssize_t n = ::read(fd, s.data() + have, s.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw UsageError("cannot read " + what + " '" + path + "': " + std::strerror(err));
    }
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
    if (have == s.size()) break;
  }
  ::close(fd);
  s.resize(have);
  if (s.size() > kMaxSecretBytes) {
    throw UsageError(what + " '" + path + "' holds more than " + std::to_string(kMaxSecretBytes) +
                     " bytes");
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw UsageError(what + " '" + path + "' is empty");
  return s;
}

std::string read_secret_file(const std::string& path) {
  return read_private_file(path, "the secret file", "head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE");
}

}  // namespace ddprun::rendezvous::auth

namespace ddprun::rendezvous {

ServerHandshake::State ServerHandshake::refuse(std::string_view why, std::string& answer, bool as_marker) {
  if (as_marker) {
    std::uint32_t m = auth::kRefusedMarker;
    answer.append(reinterpret_cast<const char*>(&m), sizeof(m));
  } else {
    answer.push_back(static_cast<char>(auth::kRefused));
  }
  why_ = why;
  std::string().swap(in_);
  return state_ = State::kRefused;
}

void ServerHandshake::busy(std::string& answer) const {
  if (state_ == State::kProof) {
    answer.push_back(static_cast<char>(auth::kBusy));  // in place of the verdict
    return;
  }
  std::uint32_t m = auth::kBusyMarker;  // in place of the challenge
  answer.append(reinterpret_cast<const char*>(&m), sizeof(m));
}

ServerHandshake::State ServerHandshake::feed(std::string_view& data, std::string& answer) {
  while (!data.empty() && (state_ == State::kHello || state_ == State::kProof)) {
    if (state_ == State::kHello) {
      if (in_.empty() && static_cast<std::uint8_t>(data[0]) != auth::kHelloOpcode) {
        return refuse("it did not authenticate (a client without this job's secret, such as PyTorch's TCPStore)",
                      answer, true);
      }
      std::size_t take = std::min(auth::kHelloBytes - in_.size(), data.size());
      in_.append(data.substr(0, take));
      data.remove_prefix(take);
      if (in_.size() < auth::kHelloBytes) return state_;
      std::uint32_t magic = 0;
      std::memcpy(&magic, in_.data() + 1, 4);
      if (magic != auth::kHelloMagic) return refuse("malformed authentication hello", answer, true);
      cnonce_ = in_.substr(5);
      snonce_ = auth::random_bytes(auth::kNonceBytes);
      answer.push_back(static_cast<char>(auth::kAccepted));
      answer += snonce_;
      answer += auth::server_proof(secret_, cnonce_, snonce_);
      in_.clear();
      state_ = State::kProof;
      continue;
    }
    std::size_t take = std::min(auth::kProofBytes - in_.size(), data.size());
    in_.append(data.substr(0, take));
    data.remove_prefix(take);
    if (in_.size() < auth::kProofBytes) return state_;
    if (!auth::equal(in_, auth::client_proof(secret_, snonce_, cnonce_))) {
      return refuse("wrong or missing secret", answer, false);
    }
    answer.push_back(static_cast<char>(auth::kAccepted));
    std::string().swap(in_);
    state_ = State::kAccepted;
  }
  return state_;
}

}  // namespace ddprun::rendezvous
