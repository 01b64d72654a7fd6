#pragma once
// The exception hierarchy of ddprun. Every error ddprun raises derives from ddprun::Error, so a
// boundary (main, a connection handler, a worker thread) catches one type and logs it once.
// Messages say what failed, on what (address, key, rank, pid), with numbers, and a hint when the
// user can fix it.

#include <stdexcept>
#include <string>

namespace ddprun {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A blocking call ran out of time. The message names what was awaited and for how long.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The network failed: connect refused until the deadline, the peer closed, a read or write failed.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// Every server asked took the request and none answered within the time given: slow or
// overloaded, or cut off after accepting, rather than refused or gone.
class UnansweredError : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

// Binding failed because another socket holds the address.
class AddressInUseError : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

// The peer refused us, or we refused it: a wrong or missing secret, a store that does not
// authenticate. Not retried: the same credentials get the same answer.
class AuthError : public Error {
 public:
  using Error::Error;
};

// The peer broke the wire protocol (bad opcode, bad magic, over-long key, ...).
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The user asked for something invalid (a bad flag, a malformed address). Launchers exit 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// The process exit code for an error that ends a program: 2 for a usage error (as getopt
// programs do), 1 for anything else. One place, so every program of ddprun agrees.
int exit_code_for(const std::exception& e) noexcept;

}  // namespace ddprun
