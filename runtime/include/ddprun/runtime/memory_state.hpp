#pragma once
// A native trainer's training state kept in memory by ddprun across a worker's crash
// (docs/usage.md: In-memory state). ddprun's agent owns one memory area per local rank (a memfd,
// DDPRUN_STATE_FD) that outlives the worker and is handed to the next attempt's worker of that
// rank: the same area, header and two slots as Python's ddprun.state, each slot written whole,
// then its CRC-32s, then its commit word, so that a worker killed mid-save leaves the previous
// state whole. A slot holds named byte buffers (the model's parameters, the optimizer's moments,
// the data's position), saved as they are.
//
//   ddprun::runtime::MemoryState state;
//   if (auto found = state.load(*pg)) { restore(found->buffers); start = found->step + 1; }
//   for (step = start; ...) { train(step); state.save(step, {{"params", p.data(), p.size() * 4}}); }

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace ddprun::runtime {

class ProcessGroup;

struct StateBuffer {
  std::string name;
  const void* data = nullptr;
  std::size_t bytes = 0;
  // Alike on every rank (a data-parallel model's parameters and optimizer moments): the
  // replicated buffers' bytes are cut into WORLD_SIZE equal ranges and each rank copies only its
  // own; load(group) gathers them (a broadcast from each rank). Ignored on a single rank.
  bool replicated = false;
};

class MemoryState {
 public:
  // This rank's area (DDPRUN_STATE_FD, DDPRUN_STATE_BYTES). Without one (not started by ddprun,
  // or ddprun --no_state), available() is false, save() does nothing and load() finds nothing;
  // so too, after one line on stderr, where the variables name something that is not ddprun's
  // state area (a process that inherited them, not the descriptor).
  MemoryState();
  ~MemoryState();
  MemoryState(const MemoryState&) = delete;
  MemoryState& operator=(const MemoryState&) = delete;

  bool available() const { return map_ != nullptr; }
  // The largest state a save holds, in bytes: half this rank's share of --state_memory.
  std::size_t capacity() const;

  // Copies `buffers` into the slot that does not hold the last committed state and commits them
  // as the state after `step`. Blocking. Throws ddprun::Error when they do not fit (saying the
  // --state_memory that would); the previous state is kept.
  void save(std::int64_t step, const std::vector<StateBuffer>& buffers);
  // The same, with the copy (the buffers' bytes, their CRC-32s, the commit) on a thread while the
  // trainer goes on: the buffers must not change until wait() returns. Call wait() before the
  // optimizer step that changes them; the next save, load and the destructor wait too.
  void save_async(std::int64_t step, const std::vector<StateBuffer>& buffers);
  // Blocks until the last save_async is committed.
  void wait() const;
  // The steps this rank holds committed, newest first (at most two).
  std::vector<std::int64_t> steps() const;

  // The bytes of the last save's slot (its structure and the buffers it copied).
  std::size_t last_bytes() const { return last_bytes_; }

  struct Loaded {
    std::int64_t step = -1;
    std::map<std::string, std::vector<unsigned char>> buffers;  // copied out of the area
    // Where some buffers were replicated (filled by load(group), which gathers them): the world
    // that saved them, each one's (name, offset, bytes) in their space, the space's bytes and
    // this rank's range of it.
    struct Shared {
      int world = 0, rank = 0;
      std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t>> buffers;
      std::uint64_t bytes = 0;
      std::vector<unsigned char> mine;
    };
    std::optional<Shared> shared;
  };
  // The newest state every rank of `group` holds, by step and course (a collective: every rank
  // calls it; docs/usage.md: One step for every rank), checked
  // against its CRC-32s; nullopt when the ranks hold none in common (a fresh start), or when any
  // rank's state fails its check or was saved by Python's ddprun.state (said on stderr).
  std::optional<Loaded> load(ProcessGroup& group);
  // The state of `step` on this rank alone (one of steps()), or nullopt. Waits for the last save.
  // Replicated buffers are not in it (in `shared`): load(group) gathers them.
  std::optional<Loaded> load_step(std::int64_t step) const;

  // Asks ddprun's agent to write this rank's latest committed state to the file `path`, in the
  // background (ddprun.state.persist): the file is replaced whole or not at all. blocking: waits
  // until it is in place and returns its step; throws ddprun::Error saying why it could not be
  // written (a full disk, a missing folder), or, with a `timeout` over zero, that it was not in
  // place by then (a stuck file system: the agent may still write it; a timeout without
  // blocking, or under zero, is refused). Returns -1 when not blocking, or without a state.
  std::int64_t persist(const std::string& path, bool blocking = false,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds::zero());
  // The state in the file persist() wrote at `path` (each rank its own), as load(group) agrees
  // on it; nullopt where a rank has none. Needs no area: what survives the loss of every node.
  static std::optional<Loaded> load(ProcessGroup& group, const std::string& path);

 private:
  void drop_newer(std::int64_t agreed, std::int64_t course);  // the states newer than the agreed one uncommitted
  struct Layout;  // what a save writes: its skeleton and the pieces of its buffers (memory_state.cpp)
  void write_slot(std::int64_t step, int slot, std::uint64_t gen, const Layout& layout);

  unsigned char* map_ = nullptr;
  std::size_t size_ = 0, slot_bytes_ = 0;
  mutable std::thread copying_;  // the last save_async's copy (joined by const readers too)
  std::uint64_t last_gen_ = 0;  // the last save's generation (its copy may still run)
  std::size_t last_bytes_ = 0;
};

}  // namespace ddprun::runtime
