#pragma once
// Replies waiting to be sent on one connection: a queue of chunks sent with writev(), so a
// partial send only advances an offset and never moves the bytes still queued. Small replies
// share a chunk; a large one is its own chunk.

#include <sys/uio.h>

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace ddprun::rendezvous {

class OutputQueue {
 public:
  static constexpr std::size_t kChunkBytes = 64 * 1024;

  void append(std::string_view bytes) {
    if (bytes.empty()) return;
    if (chunks_.empty() || chunks_.back().size() + bytes.size() > kChunkBytes) {
      if (bytes.size() >= kChunkBytes) {
        chunks_.emplace_back(bytes);
        size_ += bytes.size();
        return;
      }
      chunks_.emplace_back(std::move(spare_));
      spare_.clear();
    }
    chunks_.back().append(bytes);
    size_ += bytes.size();
  }
  // Takes ownership of a large reply without copying it.
  void append(std::string&& bytes) {
    if (bytes.size() < kChunkBytes) {
      append(std::string_view(bytes));
      return;
    }
    size_ += bytes.size();
    chunks_.push_back(std::move(bytes));
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Fills `iov` with up to `max` pieces of what is queued; returns how many.
  int gather(iovec* iov, int max) const {
    int n = 0;
    std::size_t offset = offset_;
    for (auto it = chunks_.begin(); it != chunks_.end() && n < max; ++it, ++n) {
      iov[n].iov_base = const_cast<char*>(it->data() + offset);
      iov[n].iov_len = it->size() - offset;
      offset = 0;
    }
    return n;
  }

  // Drops the first `n` bytes (those the socket took).
  void consume(std::size_t n) {
    size_ -= n;
    while (n > 0) {
      auto& front = chunks_.front();
      std::size_t left = front.size() - offset_;
      if (n < left) {
        offset_ += n;
        return;
      }
      n -= left;
      offset_ = 0;
      if (front.capacity() <= kChunkBytes && spare_.capacity() == 0) {
        spare_ = std::move(front);  // keep one small buffer for the next replies
        spare_.clear();
      }
      chunks_.pop_front();
    }
  }

  void clear() {
    std::deque<std::string>().swap(chunks_);
    std::string().swap(spare_);
    offset_ = size_ = 0;
  }

 private:
  std::deque<std::string> chunks_;
  std::string spare_;
  std::size_t offset_ = 0;  // bytes of chunks_.front() already sent
  std::size_t size_ = 0;
};

}  // namespace ddprun::rendezvous
