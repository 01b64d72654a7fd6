#pragma once
// Replies waiting to be sent on one connection: a queue of chunks sent with writev(), so a
// partial send only advances an offset and never moves the bytes still queued. Small replies
// share a chunk (256 bytes for a client with one reply in flight, up to kSmallChunk as replies
// pile up); a large one is its own chunk; a value carried by reference (Message) is a chunk that
// points at the shared buffer, so a value queued for many clients exists once.
//
// held_bytes() is what the queue itself allocates (its chunks and their slots), for the memory
// budget; shared buffers are charged once, by themselves. A chunk never grows once allocated, so
// what an append will cost is known before it is made (cost_of).

#include <sys/uio.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

#include "memory_budget.hpp"
#include "message.hpp"

namespace ddprun::rendezvous {

class OutputQueue {
 public:
  static constexpr std::size_t kFirstChunk = 256;
  static constexpr std::size_t kSmallChunk = 4096;
  static constexpr std::size_t kChunkBytes = 64 * 1024;  // replies this large are moved, not copied

  void append(std::string_view bytes) {
    if (bytes.empty()) return;
    if (bytes.size() > tail_room()) {
      if (bytes.size() >= kSmallChunk) {
        push(Chunk{std::string(bytes), nullptr, false});
        return;
      }
      std::string fresh;
      if (kept_.capacity() >= chunk_capacity(size_, bytes.size())) {
        fresh.swap(kept_);
      } else {
        fresh.reserve(chunk_capacity(size_, bytes.size()));
      }
      push(Chunk{std::move(fresh), nullptr, true});
    }
    chunks_.back().own.append(bytes);
    size_ += bytes.size();
  }
  // Takes ownership of a large reply without copying it.
  void append(std::string&& bytes) {
    if (bytes.size() < kChunkBytes) {
      append(std::string_view(bytes));
      return;
    }
    push(Chunk{std::move(bytes), nullptr, false});
  }
  void append(const SharedBytes& value) {
    if (value) push(Chunk{std::string(), value, false});
  }
  void append(const Message& m) {
    m.visit([this](std::string_view b) { append(b); }, [this](const SharedBytes& v) { append(v); });
  }
  // How much appending `m` will add to held_bytes().
  std::size_t cost_of(const Message& m) const {
    std::size_t grow = 0;
    std::size_t room = tail_room(), kept = kept_.capacity(), queued = size_;
    m.visit(
        [&](std::string_view b) {
          if (b.size() <= room) {
            room -= b.size();
          } else if (b.size() >= kSmallChunk) {
            grow += cost::kOutputChunk + cost::string_heap(b.size());
            room = 0;
          } else {
            std::size_t cap = chunk_capacity(queued, b.size());
            grow += cost::kOutputChunk + (kept >= cap ? 0 : cost::string_heap(cap));
            kept = kept >= cap ? 0 : kept;
            room = cap - b.size();
          }
          queued += b.size();
        },
        [&](const SharedBytes& v) {
          grow += cost::kOutputChunk;
          room = 0;
          queued += v->size();
        });
    return grow;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t held_bytes() const { return owned_ + cost::string_heap(kept_) + chunks_.size() * cost::kOutputChunk; }

  // Fills `iov` with up to `max` pieces of what is queued; returns how many.
  int gather(iovec* iov, int max) const {
    int n = 0;
    std::size_t offset = offset_;
    for (auto it = chunks_.begin(); it != chunks_.end() && n < max; ++it, ++n) {
      auto v = it->view();
      iov[n].iov_base = const_cast<char*>(v.data() + offset);
      iov[n].iov_len = v.size() - offset;
      offset = 0;
    }
    return n;
  }

  // Drops the first `n` bytes (those the socket took).
  void consume(std::size_t n) {
    size_ -= n;
    while (n > 0) {
      auto& front = chunks_.front();
      std::size_t left = front.view().size() - offset_;
      if (n < left) {
        offset_ += n;
        return;
      }
      n -= left;
      offset_ = 0;
      owned_ -= cost::string_heap(front.own);
      if (front.open && front.own.capacity() > kept_.capacity()) {
        kept_.swap(front.own);  // keep one small chunk (the largest) for the next replies
        kept_.clear();
      }
      chunks_.pop_front();
    }
  }

  void clear() {
    std::deque<Chunk>().swap(chunks_);
    std::string().swap(kept_);
    offset_ = size_ = owned_ = 0;
  }

 private:
  struct Chunk {
    std::string own;
    SharedBytes shared;
    bool open;  // a small chunk that takes more replies, up to its capacity
    std::string_view view() const { return shared ? shared->view() : std::string_view(own); }
  };
  // A new small chunk: 256 bytes for a client with little pending, up to kSmallChunk as its
  // replies pile up.
  static std::size_t chunk_capacity(std::size_t queued, std::size_t bytes) {
    return std::min(kSmallChunk, std::max(kFirstChunk, std::bit_ceil(2 * (queued + bytes))));
  }
  // Bytes the last chunk can still take without growing (none after a shared or large one).
  std::size_t tail_room() const {
    if (chunks_.empty() || !chunks_.back().open) return 0;
    return chunks_.back().own.capacity() - chunks_.back().own.size();
  }
  void push(Chunk c) {
    owned_ += cost::string_heap(c.own);
    size_ += c.view().size();
    chunks_.push_back(std::move(c));
  }

  std::deque<Chunk> chunks_;
  std::string kept_;
  std::size_t offset_ = 0;  // bytes of chunks_.front() already sent
  std::size_t size_ = 0;    // bytes queued
  std::size_t owned_ = 0;   // heap bytes of the chunks' own strings
};

}  // namespace ddprun::rendezvous
