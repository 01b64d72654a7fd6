#pragma once
// The fake's device and network (private to tests/fakes): streams, events, communicators.
// One mutex guards all of it; every change of state runs the streams as far as they can go
// (pump) and wakes every blocked call.

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fake_nccl.hpp"

namespace ddprun::runtime::nccl::fake {

// A point in a stream: passed once the stream has run everything queued before it.
struct Marker {
  bool passed = false;
};

struct Clique;
struct Comm;

// A collective as queued on one rank's stream.
struct Collective {
  enum Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter } kind = kAllReduce;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Comm* comm = nullptr;
  int seq = 0;            // its number on its communicator: the ranks' n-th collectives meet
  Fate fate = Fate::kComplete;
  bool arrived = false;   // it reached the head of its stream and joined its round
  bool done = false;
};

struct Op {
  std::function<void()> host;                // a copy, memset, cast, or a test's host function
  std::shared_ptr<Marker> mark;              // passes this marker
  std::shared_ptr<Marker> wait_for;          // holds until this marker has passed
  std::shared_ptr<bool> gate_open;           // holds until *gate_open
  std::shared_ptr<Collective> coll;          // holds until the collective is done
};

struct Stream {
  int device = 0;
  std::deque<Op> ops;
};

struct Event {
  int device = 0;
  std::shared_ptr<Marker> marker;  // the last recorded point; null: never recorded (reached)
};

struct Comm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
  int next_seq = 0;
  int next_split = 0;
  bool aborted = false;
  bool peer_died = false;
};

struct SplitRound {
  std::map<int, std::pair<int, int>> asks;   // parent rank -> (color, key)
  std::map<int, Comm*> children;              // parent rank -> its new communicator (null: none)
  bool done = false;
};

struct Clique {
  std::string id;
  int size = 0;
  std::map<int, Comm*> members;                          // rank -> communicator
  std::map<int, std::vector<std::shared_ptr<Collective>>> rounds;  // seq -> arrived, by rank
  std::map<int, SplitRound> splits;
};

class Fabric {
 public:
  std::mutex mu;
  std::condition_variable cv;
  bool shut = false;

  // Guarded by mu.
  std::set<Stream*> streams;
  std::map<int, Stream> legacy;  // each device's NULL stream (handle nullptr)
  std::map<std::string, std::shared_ptr<Clique>> cliques;
  std::vector<std::unique_ptr<Comm>> comms;
  std::map<const void*, std::pair<std::size_t, int>> memory;  // allocation -> (bytes, device)

  // The stream of a handle; nullptr is the NULL stream of the calling thread's device.
  Stream* stream(Handle h, int device) {
    if (h) return static_cast<Stream*>(h);
    auto& s = legacy[device];
    s.device = device;
    return &s;
  }
  // Runs every stream as far as it can go, then wakes blocked calls. Under mu.
  void pump();
  // Waits (under `lock`) until `ready()`, the fabric shuts down, or kFakeWait passes.
  Status wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready, const char* what);

  // Communicators (fake_comms.cpp). Under mu.
  Status join(Comm** out, int size, const std::string& id, int rank, int device,
              std::unique_lock<std::mutex>& lock);
  Status split(Comm* parent, int color, int key, Comm** child, std::unique_lock<std::mutex>& lock);
  void abort(Comm* comm);

 private:
  bool step(Stream& s);
  bool start(const std::shared_ptr<Collective>& c);  // joins its round; the last one completes it
  void finish_round(Clique& clique, int seq);
};

// Element i of a buffer of type t, as a double, and back (fake_comms.cpp).
double load(DataType t, const void* p, std::size_t i);
void store(DataType t, void* p, std::size_t i, double v);
// Runs a finished round's data movement (fake_comms.cpp).
void execute(const std::vector<std::shared_ptr<Collective>>& parts);

}  // namespace ddprun::runtime::nccl::fake
