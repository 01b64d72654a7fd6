#include "ddprun/rendezvous/protocol.hpp"

#include <array>

namespace ddprun::rendezvous::wire {
namespace {

constexpr std::optional<Op> kNone = std::nullopt;

// Index = opcode byte.
constexpr std::array<std::optional<Op>, 9> kV1Ops = {
    Op::kSet,   Op::kCompareSet, Op::kGet,      Op::kAdd,       Op::kCheck,
    Op::kWait,  Op::kGetNumKeys, Op::kWatchKey, Op::kDeleteKey,
};
constexpr std::array<std::optional<Op>, 17> kV2Ops = {
    Op::kValidate,  Op::kSet,        Op::kCompareSet, Op::kGet,        Op::kAdd,       Op::kCheck,
    Op::kWait,      Op::kGetNumKeys, Op::kDeleteKey,  Op::kAppend,     Op::kMultiGet,  Op::kMultiSet,
    Op::kCancelWait, Op::kPing,      Op::kQueuePush,  Op::kQueuePop,   Op::kQueueLen,
};

template <std::size_t N>
std::optional<std::uint8_t> find(const std::array<std::optional<Op>, N>& table, Op op) {
  for (std::size_t i = 0; i < N; ++i) {
    if (table[i] == op) return static_cast<std::uint8_t>(i);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint8_t> encode_op(Op op, Dialect dialect) {
  switch (dialect) {
    case Dialect::kV1: return find(kV1Ops, op);
    case Dialect::kV2: return find(kV2Ops, op);
    case Dialect::kUnknown: break;
  }
  return std::nullopt;
}

std::optional<Op> decode_op(std::uint8_t byte, Dialect dialect) {
  if (dialect == Dialect::kV1) return byte < kV1Ops.size() ? kV1Ops[byte] : kNone;
  if (dialect == Dialect::kV2) return byte < kV2Ops.size() ? kV2Ops[byte] : kNone;
  return std::nullopt;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kValidate: return "VALIDATE";
    case Op::kPing: return "PING";
    case Op::kSet: return "SET";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCheck: return "CHECK";
    case Op::kWait: return "WAIT";
    case Op::kGetNumKeys: return "GETNUMKEYS";
    case Op::kWatchKey: return "WATCH_KEY";
    case Op::kDeleteKey: return "DELETE_KEY";
    case Op::kAppend: return "APPEND";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kCancelWait: return "CANCEL_WAIT";
    case Op::kQueuePush: return "QUEUE_PUSH";
    case Op::kQueuePop: return "QUEUE_POP";
    case Op::kQueueLen: return "QUEUE_LEN";
  }
  return "?";
}

}  // namespace ddprun::rendezvous::wire
