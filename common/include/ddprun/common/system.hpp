#pragma once
// What ddprun reads from the machine and its own process: the environment as a map, the host
// name, a small file whole (/proc, /sys), whole reads and writes at an offset, random
// identifiers. One copy each.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace ddprun {

// This process's environment ("K=V" entries; an entry without '=' is skipped).
std::map<std::string, std::string> environment_map();

// This machine's host name ("?" when it cannot be read).
std::string host_name();

// The whole content of a small file such as /proc/PID/stat or a cgroup's cgroup.events; "" when
// it cannot be read (a process that is gone, a file that is not there).
std::string read_file(const std::string& path);

// Opens `path` (`flags`, O_CLOEXEC added; `mode` where it creates it) only where it is a regular
// file, never waiting on a FIFO's other end: O_NONBLOCK for the open, cleared after. The
// descriptor, or -1 with errno set: EINVAL where it is no regular file (a FIFO, a directory, a
// device), ENXIO where a FIFO or socket opened for writing has no reader.
int open_regular(const std::string& path, int flags, unsigned mode = 0600);

// A file a worker could have put in place (its error file, its stack dump): read from `offset`,
// at most `max_bytes`, only where it is a regular file; "" otherwise. A FIFO is never waited on
// for a writer, and a huge file costs `max_bytes` at most.
std::string read_worker_file(const std::string& path, std::size_t max_bytes, std::uint64_t offset = 0);

// Reads exactly `n` bytes from `fd` into `out` (short reads and EINTR retried); false at end of
// file or on an error first.
bool read_exactly(int fd, char* out, std::size_t n);

// All `n` bytes at offset `at` of `fd` read into `out`, or written from `in` (pread/pwrite until
// done, EINTR retried): 0, or the errno of the failure (a read that reaches the end first: EIO).
int pread_full(int fd, void* out, std::size_t n, std::uint64_t at) noexcept;
int pwrite_full(int fd, const void* in, std::size_t n, std::uint64_t at) noexcept;

// `n` random bytes from the kernel's generator (getrandom(2), the source OpenSSL's RAND_bytes
// seeds from): nonces, and the digits below. Throws Error if the kernel gives none.
std::string random_bytes(std::size_t n);

// `digits` random hexadecimal digits (random_bytes), for run ids, node ids and tokens that must
// not collide. std::random_device cost 30 us at every launch (its CPU probing); this is one
// system call.
std::string random_hex(std::size_t digits);

}  // namespace ddprun
