// libFuzzer target: arbitrary bytes from two clients through the authentication handshake (one
// client), the request parser and the store's semantics under small limits, exactly as the
// server runs them (minus sockets). A closed client's waits are dropped a few at a time while the
// other goes on, as the server does. Any crash, sanitizer report, growth beyond the memory budget,
// or memory the budget does not give back once everything is gone, is a bug a remote client could
// trigger.

#include <cstddef>
#include <cstdint>
#include <string>

#include "ddprun/common/error.hpp"
#include "handshake.hpp"
#include "request_parser.hpp"
#include "store_core.hpp"

namespace {

using namespace ddprun::rendezvous;

constexpr std::size_t kMaxReceived = 1 << 20;

struct FuzzPeer final : Peer {
  std::string received;
  void deliver(const Message& m) override {
    m.visit([&](std::string_view b) { take(b); }, [&](const SharedBytes& v) { take(view(v)); });
  }
  void take(std::string_view b) {
    if (received.size() < kMaxReceived) received.append(b.substr(0, kMaxReceived - received.size()));
  }
};

StoreLimits small_store() {
  StoreLimits l;
  l.max_value_bytes = 4096;
  l.max_reply_bytes = 16 * 1024;
  l.max_store_bytes = 64 * 1024;
  l.max_waits_per_connection = 32;
  l.max_watches_per_connection = 8;
  l.max_queue_length = 16;
  return l;
}

wire::WireLimits small_wire() {
  wire::WireLimits l;
  l.max_key_bytes = 256;
  l.max_value_bytes = 4096;
  l.max_keys_per_request = 64;
  l.max_request_bytes = 64 * 1024;
  return l;
}

struct Client {
  explicit Client(bool authenticate) {
    session.peer = peer;
    if (authenticate) handshake = std::make_unique<ServerHandshake>("fuzz-secret");
  }

  std::shared_ptr<FuzzPeer> peer = std::make_shared<FuzzPeer>();
  Session session;
  std::unique_ptr<ServerHandshake> handshake;
  RequestParser parser{small_wire()};
  Request request;
  bool closed = false;
  bool dropped = false;

  void close() { closed = true; }
  // A closed client's waits go two at a time, between the other client's requests.
  void drop_some(StoreCore& core) {
    if (closed && !dropped) dropped = core.drop_some(session, 2) == 0;
  }

  void feed(StoreCore& core, const std::uint8_t* data, std::size_t n) {
    std::string_view in(reinterpret_cast<const char*>(data), n);
    while (!closed && !in.empty()) {
      if (handshake && handshake->state() != ServerHandshake::State::kAccepted) {
        std::string answer;
        std::size_t before = in.size();
        auto state = handshake->feed(in, answer);
        if (in.size() > before) __builtin_trap();
        if (state == ServerHandshake::State::kRefused) {
          if (answer.empty()) __builtin_trap();  // a refusal always says so
          close();
        }
        continue;
      }
      std::size_t before = in.size();
      auto r = parser.parse(in, request);
      if (r.consumed > before) __builtin_trap();
      if (r.status == RequestParser::Status::kInvalid) {
        close();
        break;
      }
      in.remove_prefix(r.consumed);
      if (r.status == RequestParser::Status::kNeedMore) {
        if (!in.empty()) __builtin_trap();  // "need more" takes every byte
        break;
      }
      if (r.consumed == 0) __builtin_trap();
      try {
        Message out;
        core.handle(session, request, out);
        if (out.size() > core.limits().max_reply_bytes + 64) __builtin_trap();
      } catch (const ddprun::Error&) {
        close();
      }
      if (parser.partial_bytes() > small_wire().max_request_bytes + 64) __builtin_trap();
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  // Byte 0 picks the chunk size, byte 1 where the second client's stream starts, byte 2 whether
  // the first client must authenticate first.
  std::size_t chunk = 1 + data[0] % 16;
  std::size_t split = 3 + (size - 3) * data[1] / 256;
  StoreCore core(small_store());
  Client a(data[2] & 1), b(false);
  std::size_t pa = 3, pb = split;
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
    a.drop_some(core);
    b.drop_some(core);
    if (core.budget().used() > core.budget().limit()) __builtin_trap();
  }
  // Waits and watches die with their connection.
  a.close();
  b.close();
  while (!a.dropped || !b.dropped) {
    a.drop_some(core);
    b.drop_some(core);
  }
  auto s = core.stats();
  if (s.wait_lists != 0 || s.watch_entries != 0) __builtin_trap();
  // Everything charged was given back: nothing is left on the budget once the keys go too.
  core.clear();
  if (core.budget().used() != 0) __builtin_trap();
  return 0;
}
