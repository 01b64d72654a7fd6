// Slurm without glue: host-list expansion, and the settings derived from a step's environment.

#include <catch2/catch.hpp>

#include "ddprun/launcher/cli.hpp"
#include "ddprun/common/error.hpp"
#include "slurm.hpp"

using namespace ddprun::launcher;

namespace {
using V = std::vector<std::string>;
}

TEST_CASE("Slurm host lists expand as Slurm does", "[slurm]") {
  CHECK(expand_hostlist("node01") == V{"node01"});
  CHECK(expand_hostlist("node[01-04,07],gpu-a[1-2]") ==
        V{"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"});
  CHECK(expand_hostlist("n[8-11]") == V{"n8", "n9", "n10", "n11"});         // no padding
  CHECK(expand_hostlist("n[098-101]") == V{"n098", "n099", "n100", "n101"});  // padding kept
  CHECK(expand_hostlist("rack[1-2]-node[01-02]") == V{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"});
  CHECK(expand_hostlist("a,b,c[3]") == V{"a", "b", "c3"});
  CHECK(expand_hostlist("127.0.0.[1-2]") == V{"127.0.0.1", "127.0.0.2"});
  CHECK(expand_hostlist("x[5]y") == V{"x5y"});
  for (const char* badlist : {"", "a,,b", "n[1-", "n]1[", "n[a-b]", "n[3-1]", "n[[1]]", "a b", "n[1-9999999999]", ","}) {
    INFO(badlist);
    CHECK_THROWS_AS(expand_hostlist(badlist), ddprun::UsageError);
  }
  CHECK_THROWS_WITH(expand_hostlist("n[1-200000]"), Catch::Contains("more than 100000 hosts"));
}

TEST_CASE("inside a Slurm step the multi-node settings are derived - flags and PET_ win", "[slurm]") {
  std::map<std::string, std::string> env = {{"SLURM_JOB_ID", "4242"},
                                            {"SLURM_NNODES", "4"},
                                            {"SLURM_NODEID", "2"},
                                            {"SLURM_JOB_NODELIST", "gpu[07-10]"}};
  HostInfo host;
  host.cpus = 8;
  auto r = parse_command_line({"--nproc_per_node=2", "/bin/true"}, env, host);
  CHECK(r.agent.rdzv.max_nodes == 4);
  CHECK(r.agent.rdzv.node_rank == 2);
  CHECK(r.agent.rdzv.run_id == "4242");
  CHECK(r.agent.rdzv.store_host == "gpu07");
  REQUIRE(r.notes.size() == 1);
  CHECK_THAT(r.notes[0], Catch::Contains("inside Slurm job 4242") && Catch::Contains("--master_addr=gpu07"));
  // explicit flags and PET_ variables win
  auto env2 = env;
  env2["PET_NODE_RANK"] = "1";
  auto r2 = parse_command_line({"--nnodes=4", "--master_addr=head", "/bin/true"}, env2, host);
  CHECK(r2.agent.rdzv.node_rank == 1);
  CHECK(r2.agent.rdzv.store_host == "head");
  CHECK(r2.agent.rdzv.run_id == "4242");
  // a requeued run (SLURM_RESTART_COUNT) gets a run id of its own
  auto env3 = env;
  env3["SLURM_RESTART_COUNT"] = "2";
  CHECK(parse_command_line({"/bin/true"}, env3, host).agent.rdzv.run_id == "4242-r2");
  // c10d: the first host is the endpoint
  auto r3 = parse_command_line({"--rdzv_backend=c10d", "/bin/true"}, env, host);
  CHECK(r3.agent.rdzv.endpoint_host == "gpu07");
  CHECK(r3.agent.rdzv.endpoint_port == 29400);
  // outside Slurm, or with --standalone: nothing derived
  CHECK(parse_command_line({"/bin/true"}, {}, host).notes.empty());
  CHECK(parse_command_line({"--standalone", "/bin/true"}, env, host).agent.rdzv.max_nodes == 1);
  // a malformed node list is a clear error, unless the flag it would stand in for is given
  env["SLURM_JOB_NODELIST"] = "gpu[07-";
  CHECK_THROWS_WITH(parse_command_line({"/bin/true"}, env, host),
                    Catch::Contains("SLURM_JOB_NODELIST") && Catch::Contains("give --master_addr"));
  CHECK(parse_command_line({"--master_addr=head", "/bin/true"}, env, host).agent.rdzv.store_host == "head");
  CHECK_THROWS_WITH(parse_command_line({"--master_addr=head", "--rdzv_backend=c10d", "/bin/true"}, env, host),
                    Catch::Contains("give --rdzv_endpoint"));
}

TEST_CASE("inside an srun step the step's nodes count, not the allocation's, and each step has its own run id", "[slurm]") {
  // srun -N2 -r2 in a 4-node allocation: the step runs on gpu09 and gpu10.
  std::map<std::string, std::string> env = {{"SLURM_JOB_ID", "4242"},         {"SLURM_JOB_NUM_NODES", "4"},
                                            {"SLURM_JOB_NODELIST", "gpu[07-10]"}, {"SLURM_NNODES", "2"},
                                            {"SLURM_NODELIST", "gpu[09-10]"},  {"SLURM_STEP_NUM_NODES", "2"},
                                            {"SLURM_STEP_NODELIST", "gpu[09-10]"}, {"SLURM_NODEID", "1"},
                                            {"SLURM_STEP_ID", "3"}};
  HostInfo host;
  host.cpus = 8;
  auto r = parse_command_line({"/bin/true"}, env, host);
  CHECK(r.agent.rdzv.max_nodes == 2);
  CHECK(r.agent.rdzv.node_rank == 1);
  CHECK(r.agent.rdzv.store_host == "gpu09");  // not gpu07, which another step may use
  CHECK(r.agent.rdzv.run_id == "4242-s3");     // a step running beside it meets its own nodes only
  env["SLURM_RESTART_COUNT"] = "1";
  CHECK(parse_command_line({"/bin/true"}, env, host).agent.rdzv.run_id == "4242-r1-s3");
  // The allocation's list beside the step's count (a launcher that kept only SLURM_JOB_*): the
  // first host may not be in the step, said at once, not a wait for a store nobody hosts.
  auto job_only = env;
  job_only.erase("SLURM_STEP_NODELIST");
  job_only.erase("SLURM_NODELIST");
  CHECK_THROWS_WITH(parse_command_line({"/bin/true"}, job_only, host),
                    Catch::Contains("SLURM_JOB_NODELIST names 4 hosts but SLURM_STEP_NUM_NODES=2") &&
                        Catch::Contains("give --nnodes and --master_addr"));
  CHECK(parse_command_line({"--nnodes=2", "--master_addr=gpu09", "/bin/true"}, job_only, host).agent.rdzv.store_host == "gpu09");
  // c10d: the endpoint, not --master_addr or --node_rank, which it does not use; followed, the
  // advice works.
  CHECK_THROWS_WITH(parse_command_line({"--rdzv_backend=c10d", "/bin/true"}, job_only, host),
                    Catch::Contains("give --nnodes and --rdzv_endpoint (flags win"));
  auto c10d = parse_command_line({"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=gpu09", "/bin/true"}, job_only, host);
  CHECK(c10d.agent.rdzv.endpoint_host == "gpu09");
  CHECK_THAT(c10d.notes.at(0), !Catch::Contains("--node_rank") && !Catch::Contains("--master_addr"));  // (not used)
  // etcd: never the first host of the step; --rdzv_endpoint is needed.
  CHECK_THROWS_WITH(parse_command_line({"--rdzv_backend=etcd", "/bin/true"}, env, host),
                    Catch::Contains("--rdzv_backend=etcd needs --rdzv_endpoint"));
  CHECK(parse_command_line({"--rdzv_backend=etcd", "--nnodes=2", "--rdzv_endpoint=etcd0:2379", "/bin/true"}, job_only, host)
            .agent.rdzv.etcd_endpoints == "etcd0:2379");
  // --nnodes=1 on each node of a step: one-node jobs, each with its store on its own machine (not
  // the step's first host, nor node rank SLURM_NODEID).
  auto one = parse_command_line({"--nnodes=1", "/bin/true"}, env, host);
  CHECK(one.agent.rdzv.node_rank == 0);
  CHECK(one.agent.rdzv.store_host != "gpu09");
  // Each its own run id: on etcd one shared run would hold one node's job and keep the others waiting.
  CHECK(one.agent.rdzv.run_id == "4242-r1-s3-n1");
  CHECK_THAT(one.notes.at(0), !Catch::Contains("--master_addr") && Catch::Contains("--rdzv_id=4242-r1-s3-n1"));
  CHECK(parse_command_line({"--nnodes=1", "--rdzv_backend=etcd", "--rdzv_endpoint=e:2379", "/bin/true"}, env, host)
            .agent.rdzv.run_id == "4242-r1-s3-n1");
  // A count Slurm gives wrongly: every flag it spoils at once (static: the node rank and address too).
  auto bad = env;
  bad["SLURM_STEP_NUM_NODES"] = "two";
  CHECK_THROWS_WITH(parse_command_line({"/bin/true"}, bad, host), Catch::Contains("give --nnodes and --node_rank"));
  // --standalone ignores --rdzv_conf, a key given twice too (PET_RDZV_CONF in a Kubeflow pod).
  CHECK_NOTHROW(parse_command_line({"--standalone", "--rdzv_conf=join_timeout=5,join_timeout=6", "/bin/true"}, {}, host));
  // SLURM_NODEID beyond the count: named as Slurm's, not as a flag the user did not give.
  auto beyond = env;
  beyond["SLURM_NODEID"] = "2";
  CHECK_THROWS_WITH(parse_command_line({"/bin/true"}, beyond, host),
                    Catch::Contains("SLURM_NODEID=2 is not below SLURM_STEP_NUM_NODES=2"));
  CHECK_THROWS_WITH(parse_command_line({"--nnodes=2", "/bin/true"}, beyond, host),
                    Catch::Contains("SLURM_NODEID=2 is not below"));
  CHECK_THROWS_WITH(parse_command_line({"--nnodes=2", "/bin/true"}, {{"PET_NODE_RANK", "3"}}, host),
                    Catch::Contains("PET_NODE_RANK=3 (read as --node_rank) must be below --nnodes=2"));
}
