#pragma once
// store_bench: one misbehaving client, on its own thread, during one throughput point.
//
//   slow reader: SETs a 1 MiB value, then pipelines GETs of it (at most 1,000: 1 GiB of replies)
//                and never reads a reply.
//   amplifier:   over and over (up to ~1,000 times a second): connect, MULTI_GET naming the 1 MiB
//                key 1,000 times (1 GiB of reply), read whatever comes for 10 ms, disconnect.
//                PyTorch 2.x numbering: 1.13's server has no MULTI_GET, so it is run against
//                ddprun only.

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace store_bench {

enum class Abuse { kNone, kSlowReader, kAmplifier };

const char* abuse_name(Abuse a);

class Abuser {
 public:
  // Starts abusing the server on `port` at once (kNone: does nothing).
  Abuser(Abuse mode, std::uint16_t port);
  // Stops and joins.
  ~Abuser();
  Abuser(const Abuser&) = delete;
  Abuser& operator=(const Abuser&) = delete;

 private:
  bool send_some(int fd, const std::string& b);
  void slow_reader();
  void amplifier();

  Abuse mode_;
  std::uint16_t port_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int fd_ = -1;
};

}  // namespace store_bench
