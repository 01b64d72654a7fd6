#pragma once
// One reply or notification as the store core builds it: the small fields as bytes, the values
// by reference (a shared buffer, not a copy), in wire order. A connection queues it with
// OutputQueue::append(); a watch event is built once and queued on every watcher.

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddprun/rendezvous/protocol.hpp"
#include "memory_budget.hpp"

namespace ddprun::rendezvous {

class Message {
 public:
  // Values shorter than this are copied: cheaper than a reference and a writev() piece.
  static constexpr std::size_t kShareFrom = 4096;

  Message() = default;
  explicit Message(std::string_view bytes) : text_(bytes) {}

  // The small fields (integers, keys): append with wire::put_*.
  std::string& text() { return text_; }
  // Appends `value` as the protocol's string: its u64 length, then its bytes.
  void put_value(const SharedBytes& value) {
    wire::put_u64(text_, size_of(value));
    if (size_of(value) < kShareFrom) {
      auto v = view(value);
      text_.append(v.data(), v.size());
      return;
    }
    refs_.emplace_back(text_.size(), value);
    shared_bytes_ += value->size();
  }

  std::size_t size() const { return text_.size() + shared_bytes_; }
  bool empty() const { return size() == 0; }
  std::size_t references() const { return refs_.size(); }
  void clear() {
    text_.clear();
    refs_.clear();
    shared_bytes_ = 0;
  }

  // Calls bytes(std::string_view) for each run of copied bytes and shared(const SharedBytes&)
  // for each value by reference, in wire order.
  template <typename Bytes, typename Shared>
  void visit(Bytes&& bytes, Shared&& shared) const {
    std::size_t from = 0;
    for (const auto& [at, value] : refs_) {
      if (at > from) bytes(std::string_view(text_).substr(from, at - from));
      shared(value);
      from = at;
    }
    if (from < text_.size()) bytes(std::string_view(text_).substr(from));
  }

 private:
  std::string text_;
  std::vector<std::pair<std::size_t, SharedBytes>> refs_;  // each goes after text_[0, first)
  std::size_t shared_bytes_ = 0;
};

}  // namespace ddprun::rendezvous
