// libFuzzer target: arbitrary bytes from two clients through the request parser and the store's
// semantics, exactly as the server runs them (minus sockets). Any crash, sanitizer report or
// unbounded growth is a bug a remote client could trigger.

#include <cstddef>
#include <cstdint>
#include <string>

#include "ddprun/rendezvous/error.hpp"
#include "request_parser.hpp"
#include "store_core.hpp"

namespace {

using namespace ddprun::rendezvous;

struct FuzzPeer final : Peer {
  std::string received;
  void deliver(std::string_view bytes) override {
    if (received.size() < (1 << 20)) received.append(bytes);
  }
};

struct Client {
  std::shared_ptr<FuzzPeer> peer = std::make_shared<FuzzPeer>();
  Session session;
  RequestParser parser{small_limits()};
  Request request;
  std::string buffer;
  std::size_t need = 1;
  bool closed = false;

  static wire::WireLimits small_limits() {
    wire::WireLimits l;
    l.max_key_bytes = 256;
    l.max_value_bytes = 4096;
    l.max_keys_per_request = 64;
    l.max_request_bytes = 64 * 1024;
    return l;
  }

  Client() { session.peer = peer; }

  void feed(StoreCore& core, const std::uint8_t* data, std::size_t n) {
    if (closed) return;
    buffer.append(reinterpret_cast<const char*>(data), n);
    std::size_t begin = 0;
    while (!closed && buffer.size() - begin >= need) {
      auto r = parser.parse(std::string_view(buffer).substr(begin), request);
      if (r.status == RequestParser::Status::kNeedMore) {
        if (r.need <= buffer.size() - begin) __builtin_trap();  // must ask for more than it has
        need = r.need;
        break;
      }
      if (r.status == RequestParser::Status::kInvalid) {
        closed = true;
        core.drop(session);
        break;
      }
      if (r.consumed == 0 || r.consumed > buffer.size() - begin) __builtin_trap();
      begin += r.consumed;
      need = 1;
      try {
        std::string out;
        core.handle(session, request, out);
      } catch (const ddprun::Error&) {
        closed = true;
        core.drop(session);
      }
    }
    buffer.erase(0, begin);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  // Byte 0 picks the chunk size, byte 1 where the second client's stream starts.
  std::size_t chunk = 1 + data[0] % 16;
  std::size_t split = 2 + (size - 2) * data[1] / 256;
  StoreCore core;
  Client a, b;
  std::size_t pa = 2, pb = split;
  while (pa < split || pb < size) {
    if (pa < split) {
      std::size_t n = std::min(chunk, split - pa);
      a.feed(core, data + pa, n);
      pa += n;
    }
    if (pb < size) {
      std::size_t n = std::min(chunk, size - pb);
      b.feed(core, data + pb, n);
      pb += n;
    }
  }
  return 0;
}
