// What an unusual parent or command line hands ddprun (issue 33), end to end: PyTorch 1.x's NCCL
// variable for workers the hook cannot reach, port 0 on a node that does not host the store, host
// names DNS cannot hold, a one-node job asked to use etcd, and etcd's password kept off the
// command line.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "e2e/agents.hpp"
#include "etcd_cluster.hpp"
#include "skip.hpp"

using namespace ddprun::test;
using ddprun::rounds::testing::EtcdCluster;

namespace {

const std::string kShowNccl = "echo OLD=${NCCL_ASYNC_ERROR_HANDLING-unset} NEW=${TORCH_NCCL_ASYNC_ERROR_HANDLING-unset}";

}  // namespace

TEST_CASE("inputs: --no_python workers get NCCL_ASYNC_ERROR_HANDLING too (PyTorch 1.13 reads only that name)", "[inputs]") {
  std::map<std::string, std::string> clean = {{"NCCL_ASYNC_ERROR_HANDLING", ""}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", ""}};
  auto unset = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"env", "-u", "NCCL_ASYNC_ERROR_HANDLING", "-u", "TORCH_NCCL_ASYNC_ERROR_HANDLING"});
    return args;
  };
  auto r = Launch(unset(cmd({"--standalone", "--nproc_per_node=1", "--no_python", "/bin/sh", "-c", kShowNccl}))).finish(30s);
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("OLD=1 NEW=1"));
  // The user's choice of either name stands alone.
  auto mine = Launch(unset({"env", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0", kDdprun, "--standalone", "--nproc_per_node=1",
                            "--no_python", "/bin/sh", "-c", kShowNccl})).finish(30s);
  CHECK_THAT(mine.out, Catch::Contains("OLD=unset NEW=0"));
}

TEST_CASE("a Python worker under the hook: torch 1.13 gets the old name once imported, 2.x never has it", "[inputs]") {
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/python3"), "needs /usr/bin/python3");
  const auto dir = temp_dir();
  std::filesystem::create_directories(dir + "/torch1/torch");
  std::ofstream(dir + "/torch1/torch/__init__.py") << "from .version import __version__\n";
  std::ofstream(dir + "/torch1/torch/version.py") << "__version__ = '1.13.1+cu117'\n";
  std::ofstream(dir + "/env.py") << "import os\nbefore = os.environ.get('NCCL_ASYNC_ERROR_HANDLING', 'unset')\n"
                                    "import torch\nafter = os.environ.get('NCCL_ASYNC_ERROR_HANDLING', 'unset')\n"
                                    "print('TORCH', torch.__version__[0], before, after, flush=True)\n";
  auto run = [&](const std::string& torch_dir) {
    return Launch({"env", "-u", "NCCL_ASYNC_ERROR_HANDLING", "-u", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                   "PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + torch_dir, kDdprun, "--standalone",
                   "--nproc_per_node=1", dir + "/env.py"})
        .finish(60s);
  };
  auto one = run(dir + "/torch1");
  INFO(one.out << one.err);
  CHECK_THAT(one.out, Catch::Contains("TORCH 1 unset 1"));
  auto two = run(std::string(TESTS_SOURCE_DIR) + "/python/fake_torch2");
  INFO(two.out << two.err);
  CHECK_THAT(two.out, Catch::Contains("TORCH 2 unset unset"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("port 0 in the endpoint of a node that does not host the store is a usage error, at once", "[inputs]") {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=192.0.2.1:0"},
           {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:0", "--rdzv_conf=is_host=0"},
           {"--nnodes=2", "--node_rank=1", "--master_port=0"}}) {
    auto a = args;
    a.insert(a.end(), {"--nproc_per_node=1", kWorker, "env"});
    auto r = Launch(cmd(a)).finish(60s);
    INFO(args[2] << ": " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("names no port, and this node does not host the store"));
    CHECK_THAT(r.err, Catch::Contains(args[2].find("master") != std::string::npos ? "--master_port gives port 0"
                                                                                  : "--rdzv_endpoint gives port 0"));
    CHECK(r.seconds < 10);
  }
  // Read from PET_MASTER_PORT (Kubeflow's): that is what is named.
  auto r = Launch(cmd({"--nnodes=2", "--node_rank=1", "--nproc_per_node=1", kWorker, "env"}), {{"PET_MASTER_PORT", "0"}})
               .finish(60s);
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("PET_MASTER_PORT (read as --master_port) gives port 0"));
  // ... and the node rank read from PET_NODE_RANK is named as such.
  auto pet = Launch(cmd({"--nnodes=2", "--nproc_per_node=1", kWorker, "env"}), {{"PET_MASTER_PORT", "0"}, {"PET_NODE_RANK", "1"}})
                 .finish(60s);
  INFO(pet.err);
  CHECK(pet.code == 2);
  CHECK_THAT(pet.err, Catch::Contains("does not host the store (PET_NODE_RANK (read as --node_rank) is not 0)"));
}

TEST_CASE("a 100,000-character host name exits 2 at once, without asking DNS", "[inputs]") {
  const std::string huge(100000, 'h');
  for (const auto& flag : {"--rdzv_endpoint=" + huge + ":29400", "--master_addr=" + huge}) {
    auto r = Launch(cmd({"--nnodes=2", flag.rfind("--rdzv", 0) == 0 ? "--rdzv_backend=c10d" : "--node_rank=1", flag,
                         "--nproc_per_node=1", kWorker, "env"}))
                 .finish(30s);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("over DNS's 253"));
    CHECK(r.err.size() < 2000);  // the name is not printed whole
    CHECK(r.seconds < 5);
  }
  auto etcd = Launch(cmd({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=http://" + huge + ":2379",
                          "--nproc_per_node=1", kWorker, "env"}))
                  .finish(30s);
  CHECK(etcd.code == 2);
  CHECK_THAT(etcd.err, Catch::Contains("over DNS's 253"));
}

TEST_CASE("inputs: --nnodes=1 --rdzv_backend=etcd contacts etcd (run id, TLS), and no message names c10d", "[inputs]") {
  auto port = std::to_string(ddprun::rounds::testing::free_port());
  auto r = Launch(cmd({"--nnodes=1", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:" + port,
                       "--rdzv_conf=lease_ttl=1,join_timeout=3", "--nproc_per_node=1", kWorker, "env"}))
               .finish(60s);
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot reach etcd at 127.0.0.1:" + port));
  auto tls = Launch(cmd({"--nnodes=1", "--rdzv_backend=etcd", "--rdzv_endpoint=https://127.0.0.1:" + port,
                         "--rdzv_conf=cacert=/nonexistent/ca.pem", "--nproc_per_node=1", kWorker, "env"}))
                 .finish(60s);
  INFO(tls.err);
  CHECK(tls.code == 2);
  CHECK_THAT(tls.err, Catch::Contains("/nonexistent/ca.pem"));
  CHECK_THAT(tls.err, !Catch::Contains("c10d"));
}

TEST_CASE("the etcd password from a file of mode 0600, or DDPRUN_ETCD_PASSWORD, reaches etcd", "[inputs][etcd]") {
  SKIP_UNLESS(EtcdCluster::available(), "etcd is not installed (scripts/setup.sh installs etcd-server)");
  SKIP_UNLESS(std::filesystem::exists("/usr/bin/etcdctl"), "etcdctl is not installed (scripts/setup.sh installs etcd-client)");
  EtcdCluster cluster(1);
  std::string ctl = "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=" + cluster.endpoint_list();
  REQUIRE(std::system((ctl + " user add root:s3cret >/dev/null 2>&1 && " + ctl + " auth enable >/dev/null 2>&1").c_str()) == 0);
  const auto dir = temp_dir();
  const std::string file = dir + "/password";
  std::ofstream(file) << "s3cret\n";
  ::chmod(file.c_str(), 0600);
  int runs = 0;  // (a run id that finished is not started again within close_timeout)
  auto job = [&](const std::string& conf) {
    return cmd({"--nnodes=1:2", "--rdzv_backend=etcd", "--rdzv_endpoint=" + cluster.endpoint_list(),
                "--rdzv_id=pw" + std::to_string(runs++),
                "--rdzv_conf=lease_ttl=1,last_call_timeout=0.2,user=root" + conf, "--nproc_per_node=1", kWorker, "env"});
  };
  auto from_file = Launch(job(",password_file=" + file)).finish(60s);
  INFO(from_file.err);
  CHECK(from_file.code == 0);
  auto from_env = Launch(job(""), {{"DDPRUN_ETCD_PASSWORD", "s3cret"}}).finish(60s);
  INFO(from_env.err);
  CHECK(from_env.code == 0);
  ::chmod(file.c_str(), 0640);
  auto open_file = Launch(job(",password_file=" + file)).finish(60s);
  CHECK(open_file.code == 2);
  CHECK_THAT(open_file.err, Catch::Contains("mode 0640"));
  std::filesystem::remove_all(dir);
}
