#pragma once
// store_bench: what the load generator and the abusers send (1.13 numbering, which both servers
// speak, unless said otherwise) and their non-blocking loopback sockets.

#include <chrono>
#include <cstdint>
#include <string>

namespace store_bench {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t);

std::string frame_set(const std::string& key, const std::string& value);
std::string frame_get(const std::string& key);
std::string frame_add(const std::string& key, std::int64_t delta);
std::string frame_wait(const std::string& key);

// A non-blocking TCP socket with TCP_NODELAY; throws std::runtime_error.
int make_socket();
// Starts connecting to 127.0.0.1:port (EINPROGRESS is fine); throws std::runtime_error. From a
// source address and port of its own for source >= 0 (0 to 20,000 x 253), the kernel's choice for -1.
void start_connect(int fd, std::uint16_t port, int source = -1);
// Connects, waiting up to 5 s for the connection.
int connect_blocking(std::uint16_t port);
// Sends all of `b` (polling on EAGAIN); throws std::runtime_error.
void send_all(int fd, const std::string& b);
// Bytes of a complete reply at the start of `in` (a GET's string, or 8 bytes), 0 if incomplete.
std::size_t reply_size(const std::string& in, bool is_get);

}  // namespace store_bench
