#pragma once
// How nodes meet (torchrun's --rdzv_* and --nnodes settings), with their defaults. The agent
// builds a Rendezvous from these (rendezvous.hpp); nothing else of the agent is needed here.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::rounds {

// Where the round records live.
enum class BackendKind {
  single_node,   // one node: no other node to meet; it hosts its workers' store itself
  static_ranks,  // torchrun's static: a fixed number of nodes, each with its --node_rank
  c10d,          // torchrun's c10d: MIN:MAX nodes, ranks by arrival (kept at a restart), through a TCPStore
  etcd,          // an etcd v3 cluster (no node is a single point of failure)
};
const char* to_string(BackendKind b);

// static and c10d: does this node host the rendezvous store at the endpoint?
enum class HostRole {
  automatic,  // when the endpoint is one of this machine's addresses and its port is free
  never,      // an agent elsewhere, or an external ddprun-store, hosts it
  always,     // this node must (an error when the port cannot be bound)
};

struct RendezvousOptions {
  BackendKind backend = BackendKind::single_node;
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  int node_rank = 0;  // static_ranks: this node's group rank; a hint elsewhere
  int nproc = 1;      // this node's workers

  // single_node: where this node's workers' store listens (port 0: a free port, bound first).
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 29500;

  // static, c10d: the rendezvous store (--rdzv_endpoint, or --master_addr:port).
  std::string endpoint_host = "127.0.0.1";
  std::uint16_t endpoint_port = 29400;
  HostRole host_role = HostRole::automatic;
  // The settings that gave the endpoint's host and port, as the user gave them, for messages:
  // "--rdzv_endpoint", "--master_addr" and "--master_port" (static without --rdzv_endpoint), or
  // the variable read for one ("PET_MASTER_ADDR (read as --master_addr)", Slurm's host list).
  std::string endpoint_host_setting = "--rdzv_endpoint";
  std::string endpoint_port_setting = "--rdzv_endpoint";
  std::string node_rank_setting = "--node_rank";  // or the variable read for it (PET_NODE_RANK, SLURM_NODEID)
  // How other nodes reach this one (--local_addr): the workers' store is advertised at it when
  // this node hosts that store. Empty: the address this node reaches the rendezvous from.
  std::string local_addr;

  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
  // c10d, static: each node bumps its keep-alive counter this often; a node whose counter has
  // not moved for interval x max_attempt is lost (and fences itself before then).
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};
  // The agents' restart policy (--max_restarts, --max_same_failures), which every member of a
  // round applies alike: a node that joins with another is refused. Unset: not compared.
  std::optional<int> max_restarts, max_same_failures;

  // etcd: the cluster's members ("h1:2379,h2:2379", "https://h1:2379"), the key prefix (keys
  // under <prefix>/<run_id>/), each node's lease (a node silent this long is lost), credentials.
  std::string etcd_endpoints;
  std::string etcd_prefix = "/ddprun";
  std::chrono::seconds lease_ttl{5};
  std::string etcd_user, etcd_password;
  // TLS, as etcdctl's --cacert, --cert, --key (PEM files). A cacert makes endpoints without a
  // scheme TLS ones; https:// needs it. cert and key: this node's client certificate, for a
  // cluster with --client-cert-auth. Empty: plain HTTP.
  std::string etcd_cacert, etcd_cert, etcd_key;

  // The per-job secret (--rdzv_conf=secret_file=PATH or DDPRUN_SECRET_FILE): agents and the
  // rendezvous store authenticate each other with it. Empty: the store accepts any client.
  std::string secret;

  bool multi_node() const { return backend != BackendKind::single_node; }
};

// Throws UsageError for settings that cannot work (a malformed etcd endpoint list, MIN > MAX).
void validate(const RendezvousOptions& opt);

}  // namespace ddprun::rounds
