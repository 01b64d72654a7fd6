#pragma once
// Where each process group's keys live in the store, and how a split's membership is agreed
// (private). Groups are created collectively, in the same order on every rank: so the k-th
// group each rank creates on a store gets the same keys on every rank, and keys of its own.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime {

// The store of a new group under `store`: prefix "group_<k>", k counting the groups this rank
// created there (a counter per rank, in the store). So no group reads another's keys: a
// second NCCL group of the same attempt gets its own unique id.
std::shared_ptr<rendezvous::Store> next_group_store(const std::shared_ptr<rendezvous::Store>& store, int rank);

struct SplitPlan {
  int rank = 0;        // in the new group
  int size = 0;
  std::string prefix;  // of the new group's keys, under the parent group's store
};

// The n-th split of a group (n counts its splits from 1): every rank publishes its color and
// key under "split_<n>/rank_<r>" and reads every rank's. Ranks of one color are ordered by key,
// then by rank. nullopt for a color < 0. Throws TimeoutError (naming the keys) when a rank does
// not call split within `timeout`, ProtocolError for a malformed entry.
std::optional<SplitPlan> agree_split(rendezvous::Store& store, int n, int rank, int size, int color, int key,
                                     std::chrono::milliseconds timeout);

// new_group's members: sorted; throws UsageError for an empty list, a duplicate or a rank that
// is not in a group of `size`.
std::vector<int> checked_members(std::vector<int> ranks, int size);

}  // namespace ddprun::runtime
