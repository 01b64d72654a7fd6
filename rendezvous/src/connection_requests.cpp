// Connection: what its bytes do. The handshake of a store with a secret, then requests parsed
// and applied one at a time, each client's memory kept on the store's budget (sync_charge), and
// replies queued. The socket side is in connection.cpp.

#include <sys/socket.h>

#include <new>
#include <spdlog/spdlog.h>

#include "connection.hpp"

namespace ddprun::rendezvous {
namespace {

// A connection's turn ends after this much work on its requests (or kReadsPerTurn reads): a
// client pipelining costly requests (WAITs on 8 KiB keys) would otherwise hold the loop for
// 16 x 64 KiB of them. The clock is read every kRequestsPerClockCheck requests.
constexpr auto kTurnTime = std::chrono::microseconds(1000);
constexpr int kRequestsPerClockCheck = 16;
// A request whose buffers hold more than this does not keep them for the next request.
constexpr std::size_t kKeptRequestBytes = 16 * 1024;

}  // namespace

// Parses and applies the requests in `data`, one at a time, until the data is used up or the
// replies queued reach the high-water mark; then the rest waits in pending_ (at most one read).
void Connection::consume(std::string_view data) {
  while (!data.empty() && !closed_) {
    if (auth_ != Auth::kOpen) {
      if (!authenticate(data)) return;
      continue;
    }
    if (out_.size() >= ctx_.options.output_high_water_bytes) {
      paused_ = true;
      pending_.assign(data);
      spdlog::debug("store: {} has {} bytes of replies unread; not reading from it until they drain", peer_,
                    out_.size());
      break;
    }
    if (turn_requests_ % kRequestsPerClockCheck == kRequestsPerClockCheck - 1 && turn_over()) {
      pending_.assign(data);  // the rest goes first on its next turn
      queue_turn();
      break;
    }
    auto r = parser_.parse(data, request_, request_held_);
    if (r.status == RequestParser::Status::kInvalid) {
      close(r.error);
      return;
    }
    data.remove_prefix(r.consumed);
    if (r.status == RequestParser::Status::kNeedMore) {
      if (!sync_charge()) close(over_budget("the request it is sending (" + std::to_string(parser_.partial_bytes()) +
                                            " bytes so far)"));
      break;
    }
    request_held_ = r.request_heap;
    ++turn_requests_;
    apply();
  }
  if (!closed_) flush();  // also counts what it now holds (sync_charge)
  if (!closed_ && ctx_.budget.used() > ctx_.budget.limit()) close(over_budget("the input it sent"));
}

// Whether this turn has used its time; the clock starts at the first check.
bool Connection::turn_over() {
  auto now = SteadyClock::now();
  if (turn_started_ == SteadyClock::time_point{}) {
    turn_started_ = now;
    return false;
  }
  return now - turn_started_ > kTurnTime;
}

// A large request's values become the store's (taken, not copied) or go with it: while it is
// applied only its keys count as this connection's, and its buffers are freed after. A small one
// (at most kKeptRequestBytes) keeps its buffers for the next request and stays counted as is.
void Connection::apply() {
  bool large = request_held_ > kKeptRequestBytes;
  if (large) {
    request_held_ = key_heap_bytes(request_);
    if (!sync_charge()) return close(over_budget(std::string("its ") + wire::op_name(request_.op) + " request"));
  }
  ctx_.reply.clear();
  try {
    if (ctx_.options.on_request) {
      ctx_.options.on_request(wire::op_name(request_.op),
                              request_.keys.empty() ? std::string_view() : std::string_view(request_.keys[0]));
    }
    std::size_t request_bytes = 0;
    if (ctx_.options.on_applied) {  // counted before handle() takes the values
      for (const auto& k : request_.keys) request_bytes += k.size();
      for (const auto& v : request_.values) request_bytes += v.size();
    }
    ctx_.core.handle(session_, request_, ctx_.reply);
    if (ctx_.options.on_applied) {
      ctx_.options.on_applied(wire::op_name(request_.op),
                              request_.keys.empty() ? std::string_view() : std::string_view(request_.keys[0]),
                              request_bytes, ctx_.reply.size());
    }
  } catch (const Error& e) {
    return close(e.what());
  } catch (const std::bad_alloc&) {
    return close(std::string("out of memory while applying its ") + wire::op_name(request_.op) + " request");
  } catch (const std::exception& e) {
    return close(std::string("internal error while applying its ") + wire::op_name(request_.op) +
                 " request: " + e.what());
  }
  if (closed_) return;  // a notification it was sent while applying did not fit
  queue_reply();
  if (!large) return;  // counted with the rest of this read, at the end of consume()
  request_ = Request();
  request_held_ = 0;
  if (!sync_charge()) close(over_budget(std::string("the reply to its ") + wire::op_name(request_.op) + " request"));
}

void Connection::queue_reply() {
  auto& reply = ctx_.reply;
  if (reply.references() == 0 && reply.size() >= OutputQueue::kChunkBytes) {
    out_.append(std::move(reply.text()));
    reply.text() = std::string();
  } else {
    out_.append(reply);
  }
  reply.clear();
  if (reply.text().capacity() > OutputQueue::kChunkBytes) reply = Message();  // a scratch, kept small
}

bool Connection::sync_charge() {
  if (closed_) {
    charge_.set(0);
    return true;
  }
  charge_.set(cost::kConnection + out_.held_bytes() + cost::string_heap(pending_) + parser_.held_bytes() +
              request_held_);
  return ctx_.budget.used() <= ctx_.budget.limit();
}

std::string Connection::over_budget(const std::string& what) const {
  return what + " does not fit in the store's memory budget: " + std::to_string(ctx_.budget.used()) +
         " bytes in use (keys, values, queues, waits, watches and the clients' buffers), over --max_store_bytes=" +
         std::to_string(ctx_.budget.limit());
}

bool Connection::authenticate(std::string_view& data) {
  std::string answer;
  auto state = handshake_->feed(data, answer);
  if (state == ServerHandshake::State::kRefused) {
    refuse(answer, handshake_->why());
    return false;
  }
  out_.append(std::string_view(answer));
  if (state == ServerHandshake::State::kAccepted) {
    auth_ = Auth::kOpen;
    handshake_.reset();
    ctx_.handshakes.remove(this);
    spdlog::debug("store: {} authenticated", peer_);
  }
  return true;
}

// Tells a client it was refused (a byte or a 4-byte marker it can recognise), logs one line,
// and closes.
void Connection::refuse(const std::string& answer, const std::string& why) {
  send_refusal(answer);
  if (closed_) return;
  ++ctx_.refused;
  auto host = peer_.substr(0, peer_.rfind(':'));
  ctx_.log_once(host + "|" + why, "store: refused " + peer_ + ": " + why);
  shutdown();
}

void Connection::evict() {
  if (closed_ || !handshake_) return;
  std::string answer;
  handshake_->busy(answer);
  send_refusal(answer);
  ++ctx_.evicted;
  shutdown();
}

// Sends `answer` and our FIN after it. Unread input is drained first, so that the close is not
// a reset that could overtake the answer.
void Connection::send_refusal(const std::string& answer) {
  out_.append(std::string_view(answer));
  flush();
  char sink[4096];
  for (int i = 0; i < 64 && fd_ >= 0 && ::recv(fd_, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  if (!closed_) ::shutdown(fd_, SHUT_WR);
}

}  // namespace ddprun::rendezvous
