// ddprun as the Kubernetes operators start it: the exact environments Kubeflow Trainer v2 (a
// TrainJob's torch runtime on a JobSet) and the Training Operator's PyTorchJob (plain and
// elastic) give the node's container, with no flags; and etcd endpoints written as etcdctl
// writes them.
#include <catch2/catch.hpp>

#include "ddprun/common/error.hpp"
#include "ddprun/launcher/cli.hpp"
#include "launcher/parse.hpp"
#include "skip.hpp"
#include "test_pki.hpp"

using namespace ddprun;
using rounds::BackendKind;
using rounds::HostRole;
using Env = std::map<std::string, std::string>;

namespace {

using test::parse;

// Trainer v2's torch plugin: PET_NODE_RANK from the pod's job-completion-index annotation, the
// master at the JobSet pod's name under the job's headless service, port 29400.
Env trainer_v2(const std::string& rank) {
  return {{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "auto"}, {"PET_NODE_RANK", rank},
          {"PET_MASTER_ADDR", "mnist-node-0-0.mnist"}, {"PET_MASTER_PORT", "29400"}};
}

// The Training Operator's PyTorchJob with a Master and 2 Workers: MASTER_*, WORLD_SIZE and RANK
// for the workers' code, PET_* for torchrun (setPodEnv).
Env pytorchjob_worker(int index) {
  return {{"PYTHONUNBUFFERED", "1"}, {"MASTER_ADDR", "pj-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"},
          {"RANK", std::to_string(index + 1)}, {"PET_MASTER_ADDR", "pj-master-0"}, {"PET_MASTER_PORT", "23456"},
          {"PET_NPROC_PER_NODE", "2"}, {"PET_NNODES", "3"}, {"PET_NODE_RANK", std::to_string(index + 1)}};
}

}  // namespace

TEST_CASE("Kubeflow Trainer v2: a TrainJob's PET_ variables alone make a static job of 2 nodes", "[kubernetes]") {
  for (int rank : {0, 1}) {
    auto r = parse({"/bin/true"}, trainer_v2(std::to_string(rank)), 4).agent;
    CAPTURE(rank);
    CHECK(r.rdzv.backend == BackendKind::static_ranks);
    CHECK(r.rdzv.min_nodes == 2);
    CHECK(r.rdzv.max_nodes == 2);
    CHECK(r.rdzv.node_rank == rank);
    CHECK(r.rdzv.endpoint_host == "mnist-node-0-0.mnist");
    CHECK(r.rdzv.endpoint_port == 29400);
    CHECK(r.nproc_per_node == 4);  // "auto": the GPUs
    CHECK(r.rdzv.host_role == (rank == 0 ? HostRole::always : HostRole::never));
  }
  CHECK(parse({"/bin/true"}, trainer_v2("1")).agent.nproc_per_node == 6);  // "auto" without GPUs: the CPUs
}

TEST_CASE("PyTorchJob: a worker's environment makes node rank RANK of WORLD_SIZE nodes at the master", "[kubernetes]") {
  auto r = parse({"/bin/true"}, pytorchjob_worker(1)).agent;
  CHECK(r.rdzv.backend == BackendKind::static_ranks);
  CHECK(r.rdzv.max_nodes == 3);
  CHECK(r.rdzv.node_rank == 2);
  CHECK(r.rdzv.endpoint_host == "pj-master-0");
  CHECK(r.rdzv.endpoint_port == 23456);
  CHECK(r.nproc_per_node == 2);
  // The operator's MASTER_ADDR, WORLD_SIZE and RANK are its view of nodes: the workers get
  // ddprun's own (worker_plan), and a flag still wins over PET_.
  CHECK(parse({"--node_rank=0", "/bin/true"}, pytorchjob_worker(1)).agent.rdzv.node_rank == 0);
}

TEST_CASE("PyTorchJob elasticPolicy: PET_RDZV_* make a c10d job - PET_STANDALONE set empty is standalone", "[kubernetes]") {
  Env elastic = {{"PET_RDZV_ENDPOINT", "el-worker-0:23456"}, {"PET_RDZV_BACKEND", "c10d"}, {"PET_NNODES", "1:3"},
                 {"PET_MAX_RESTARTS", "10"}, {"PET_NPROC_PER_NODE", "1"}, {"PET_RDZV_ID", "el"},
                 {"PET_RDZV_CONF", "join_timeout=900,last_call_timeout=15"}, {"PET_NODE_RANK", "1"}};
  auto r = parse({"/bin/true"}, elastic).agent;
  CHECK(r.rdzv.backend == BackendKind::c10d);
  CHECK(r.rdzv.min_nodes == 1);
  CHECK(r.rdzv.max_nodes == 3);
  CHECK(r.rdzv.endpoint_host == "el-worker-0");
  CHECK(r.rdzv.endpoint_port == 23456);
  CHECK(r.rdzv.run_id == "el");
  CHECK(r.rdzv.join_timeout == std::chrono::seconds(900));
  CHECK(r.rdzv.last_call_timeout == std::chrono::seconds(15));
  CHECK(r.rdzv.host_role == HostRole::automatic);  // el-worker-0 hosts the store once its name is its own
  CHECK(r.max_restarts == 10);
  // elasticPolicy.standalone: the operator sets PET_STANDALONE to "" (torchrun's int("") fails).
  Env standalone = {{"PET_STANDALONE", ""}, {"PET_NNODES", "1"}, {"PET_NPROC_PER_NODE", "2"},
                    {"PET_RDZV_BACKEND", "c10d"}, {"PET_RDZV_ENDPOINT", "sa-worker-0:23456"}};
  auto sa = parse({"/bin/true"}, standalone).agent;
  CHECK(sa.rdzv.backend == BackendKind::single_node);
  CHECK(sa.rdzv.store_port == 0);
  CHECK(parse({"/bin/true"}, {{"PET_STANDALONE", "0"}}).agent.rdzv.store_port == 29500);
}

TEST_CASE("etcd endpoints as etcdctl writes them: the scheme chooses TLS - a mismatch is a usage error", "[kubernetes][tls]") {
  Env etcd = {{"PET_RDZV_BACKEND", "etcd"}, {"PET_NNODES", "1:2"}, {"PET_RDZV_ID", "j"}};
  auto with = [&](const std::string& endpoint, const std::string& conf) {
    Env e = etcd;
    e["PET_RDZV_ENDPOINT"] = endpoint;
    if (!conf.empty()) e["PET_RDZV_CONF"] = conf;
    return parse({"/bin/true"}, e).agent.rdzv;
  };
  CHECK(with("http://10.0.0.1:2379,http://10.0.0.2:2379", "").etcd_endpoints == "http://10.0.0.1:2379,http://10.0.0.2:2379");
  CHECK_THROWS_WITH(with("https://10.0.0.1:2379", ""), Catch::Contains("https://10.0.0.1:2379 uses TLS: give --rdzv_conf cacert"));
  CHECK_THROWS_WITH(with("10.0.0.1:2379", "protocol=https"), Catch::Contains("uses TLS: give --rdzv_conf cacert"));
  CHECK_THROWS_WITH(with("http://10.0.0.1:2379", "cacert=/nonexistent/ca.pem"),
                    Catch::Contains("is plain HTTP but --rdzv_conf cacert is given"));
  CHECK_THROWS_WITH(with("https://10.0.0.1:2379", "cacert=/nonexistent/ca.pem"),
                    Catch::Contains("cacert=/nonexistent/ca.pem: cannot be read"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=https://h:29400", "/bin/true"}, {}),
                    Catch::Contains("http:// and https:// are for --rdzv_backend=etcd"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_conf=cacert=ca.pem", "/bin/true"}, {}),
                    Catch::Contains("cacert applies to --rdzv_backend=etcd"));
}

TEST_CASE("etcd TLS files through --rdzv_conf (cacert, cert, key, protocol) reach the rendezvous options", "[kubernetes][tls]") {
  SKIP_UNLESS(rounds::testing::TestPki::available(), "openssl is not installed (scripts/setup.sh installs openssl)");
  Env etcd = {{"PET_RDZV_BACKEND", "etcd"}, {"PET_NNODES", "1:2"}, {"PET_RDZV_ID", "j"}};
  auto with = [&](const std::string& endpoint, const std::string& conf) {
    Env e = etcd;
    e["PET_RDZV_ENDPOINT"] = endpoint;
    e["PET_RDZV_CONF"] = conf;
    return parse({"/bin/true"}, e).agent.rdzv;
  };
  rounds::testing::TestPki pki;
  auto node = pki.client("node");
  auto z = with("https://etcd-0.etcd:2379,etcd-1.etcd:2379", "cacert=" + pki.ca() + ",cert=" + node.cert + ",key=" + node.key);
  CHECK(z.etcd_cacert == pki.ca());
  CHECK(z.etcd_cert == node.cert);
  CHECK(z.etcd_key == node.key);
  CHECK(with("etcd-0.etcd:2379", "protocol=https,cacert=" + pki.ca()).etcd_endpoints == "https://etcd-0.etcd:2379");
}
