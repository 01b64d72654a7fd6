// Bytes a client chose reach the store's log (and the agent's console, which hosts it) only
// escaped: a key holding a newline and a made-up log line, or terminal escape sequences, cannot
// start a line of its own or reach the operator's terminal.
#include "abuse_helpers.hpp"
#include "ddprun/common/text.hpp"

namespace {

// A key that, logged raw, would start a forged line and colour the terminal red, then set its
// title (ESC ] ... BEL); then a DEL and a byte of UTF-8.
const std::string kEvilKey = std::string("k\n[2026-01-01 00:00:00.000] [info] store: forged\x1b[31m\x1b]0;t\x07") +
                             "\x7f\xc3";

// Every captured line holding a raw control byte (other than the newline that ends it: a forged
// line would follow one inside it) or a byte from 0x7f up.
std::vector<std::string> problems(const LogCapture& logs) {
  std::vector<std::string> found;
  for (auto line : logs.lines_with({})) {
    while (!line.empty() && line.back() == '\n') line.pop_back();
    for (unsigned char c : line) {
      if (c < 0x20 || c >= 0x7f) {
        found.push_back("raw byte " + std::to_string(c) + " in: " + ddprun::escape_for_log(line, 400));
        break;
      }
    }
  }
  return found;
}

}  // namespace

TEST_CASE("a client's key reaches the log escaped - on every refusal that names it", "[abuse]") {
  LogCapture logs;
  auto frame = [](Op op) { return Frame(Dialect::kV2, op); };
  // Sends `setup` then `refused` on a connection of its own, which the server closes.
  auto refuse = [](TestServer& server, const Frame& setup, const Frame& refused) {
    auto c = Raw::speaking(Dialect::kV2, server.port());
    c.send(setup.bytes() + refused.bytes());
    CHECK(c.closed_by_server());
  };
  // SET over the memory budget: 15,000 bytes beside the filler's 40,000 do not fit the 64 KiB
  // (with its last sixteenth kept back), but while they are still being received they fit: the
  // store refuses the whole SET, naming its key, never the request half-read (which names none;
  // 40,000 bytes arriving in several reads were refused that way in 1 of 7 suite runs).
  auto tiny = TestServer::with_loopback();
  tiny.max_store_bytes = 64 * 1024;
  TestServer full(tiny);
  auto filler = Raw::speaking(Dialect::kV2, full.port());
  filler.send(frame(Op::kSet).str("filler").str(std::string(40000, 'f')));
  CHECK(filler.ping_is_next());
  refuse(full, frame(Op::kPing).u32(1), frame(Op::kSet).str(kEvilKey).str(std::string(15000, 'v')));

  auto o = TestServer::with_loopback();
  o.limits.max_value_bytes = 1024;
  o.max_reply_bytes = 64 * 1024;
  o.max_pending_output_bytes = 2 * 1024 * 1024;
  o.max_watches_per_connection = 1;
  o.max_queue_length = 1;
  TestServer server(o);
  // APPEND past --max_value_bytes.
  refuse(server, frame(Op::kAppend).str(kEvilKey).str(std::string(600, 'a')),
         frame(Op::kAppend).str(kEvilKey).str(std::string(600, 'a')));
  // ADD on a value that is not a number, and ADD past 2^63.
  refuse(server, frame(Op::kSet).str(kEvilKey).str("text"), frame(Op::kAdd).str(kEvilKey).i64(1));
  refuse(server, frame(Op::kSet).str(kEvilKey).str("9223372036854775807"), frame(Op::kAdd).str(kEvilKey).i64(1));
  // QUEUE_PUSH past --max_queue_length.
  refuse(server, frame(Op::kQueuePush).str(kEvilKey).str("1"), frame(Op::kQueuePush).str(kEvilKey).str("2"));
  // WATCH_KEY (1.13) past --max_watches_per_connection.
  auto w = Raw::speaking(Dialect::kV1, server.port());
  w.send(Frame(Dialect::kV1, Op::kWatchKey).str(kEvilKey));
  CHECK(w.u8() == wire::kKeyCallbackRegistered);
  w.send(Frame(Dialect::kV1, Op::kWatchKey).str(kEvilKey));
  CHECK(w.closed_by_server());

  for (const char* refusal : {"would make the store hold", "over --max_value_bytes", "not a decimal integer",
                              "overflows a 64-bit counter", "--max_queue_length", "--max_watches_per_connection"}) {
    auto lines = logs.await_lines_with({refusal, "k\\n[2026-01-01 00:00:00.000] [info] store: forged\\x1b[31m"});
    INFO(refusal);
    CHECK(lines.size() == 1);
  }
  auto found = problems(logs);
  INFO(found.size() << " problem(s); the first: " << (found.empty() ? "" : found.front()));
  CHECK(found.empty());
}

TEST_CASE("a key in a client's error message is escaped - a time-out naming it", "[abuse]") {
  TestServer server;
  auto c = client(server.port());
  try {
    c.wait({kEvilKey}, 50ms);
    FAIL("the wait did not time out");
  } catch (const ddprun::TimeoutError& e) {
    std::string what = e.what();
    CHECK(what.find("k\\n[2026-01-01") != std::string::npos);
    CHECK(std::none_of(what.begin(), what.end(), [](char ch) {
      auto c = static_cast<unsigned char>(ch);
      return c < 0x20 || c >= 0x7f;
    }));
  }
}
