// What each worker's environment says about the progress hook, the NCCL error-handling variable
// and the signals to handle (the controller with the fake runner, which keeps each environment).
#include <set>

#include "controller_job.hpp"

using namespace ddprun::agent;
using namespace ddprun::agent::testing;

namespace {

std::map<std::string, std::string> first_env(AgentOptions o) {
  Job j(std::move(o));
  j.ctl->start();
  j.ready(0, 0);
  return j.runner.started.at(j.pids().at(0)).env;
}

}  // namespace

TEST_CASE("worker environment: ddprun's sitecustomize first on PYTHONPATH, only the 2.x NCCL name", "[units]") {
  auto o = options(1, 0);
  o.python_site_dir = "/opt/ddprun/share/ddprun/python";
  o.hook_sees_torch = true;
  o.base_env["PYTHONPATH"] = "/home/me/lib";
  auto env = first_env(o);
  CHECK(env["PYTHONPATH"] == "/opt/ddprun/share/ddprun/python:/home/me/lib");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK_FALSE(env.count("NCCL_ASYNC_ERROR_HANDLING"));  // the module sets it for PyTorch 1.x only
  o.base_env["PYTHONPATH"] = o.python_site_dir + ":/home/me/lib";  // a ddprun inside a worker
  CHECK(first_env(o)["PYTHONPATH"] == "/opt/ddprun/share/ddprun/python:/home/me/lib");
  o.base_env.erase("PYTHONPATH");
  CHECK(first_env(o)["PYTHONPATH"] == "/opt/ddprun/share/ddprun/python");
}

TEST_CASE("worker environment: without the hook, both NCCL names and PYTHONPATH as inherited", "[units]") {
  auto o = options(1, 0);
  o.base_env["PYTHONPATH"] = "/home/me/lib";
  auto env = first_env(o);
  CHECK(env["PYTHONPATH"] == "/home/me/lib");
  CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
  o.base_env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0";  // the user's choice stands, and no other name is added
  env = first_env(o);
  CHECK_FALSE(env.count("NCCL_ASYNC_ERROR_HANDLING"));
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0");
  o.base_env.erase("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  o.base_env["NCCL_ASYNC_ERROR_HANDLING"] = "0";  // the old name alone: 2.x must not read a 1 of ours first
  env = first_env(o);
  CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "0");
  CHECK_FALSE(env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING"));
}

// Issue 33: a --no_python worker (or python -E/-I behind it) never runs the hook, and PyTorch
// 1.13 reads only the old name: without knowing torch's version, ddprun sets both.
TEST_CASE("worker environment: the hook present but not reaching the worker (--no_python) - both NCCL names", "[units]") {
  auto o = options(1, 0);
  o.python_site_dir = "/opt/ddprun/share/ddprun/python";
  o.hook_sees_torch = false;
  auto env = first_env(o);
  CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(env["PYTHONPATH"] == "/opt/ddprun/share/ddprun/python");  // a wrapper's own Python still gets the hook
}

TEST_CASE("worker environment: TORCHELASTIC_SIGNALS_TO_HANDLE names the forwarded signals as torchrun 2.x does",
          "[units]") {
  auto o = options(1, 0);
  CHECK(first_env(o)["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  o.forward_signals.insert(SIGUSR2);
  o.forward_signals.insert(SIGUSR1);
  CHECK(first_env(o)["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2");
}

TEST_CASE("worker environment: each worker's own variables replace inherited ones, each key once", "[units]") {
  auto o = options(3, 0);
  o.base_env["RANK"] = "99";
  o.base_env["LOCAL_RANK"] = "7";
  o.base_env["DDPRUN_HEARTBEAT_FILE"] = "/elsewhere";
  o.base_env["WORLD_SIZE"] = "1000";
  o.base_env["KEEP_ME"] = "yes";
  Job j(std::move(o));
  j.ctl->start();
  j.ready(0, 0);
  std::set<std::string> heartbeats;
  for (pid_t pid : j.pids()) {
    const auto& p = j.runner.started.at(pid);
    CHECK(p.env_entries == p.env.size());
    CHECK(p.env.at("RANK") == p.env.at("LOCAL_RANK"));
    CHECK(p.env.at("RANK") != "99");
    CHECK(p.env.at("WORLD_SIZE") == "3");
    CHECK(p.env.at("KEEP_ME") == "yes");
    heartbeats.insert(p.env.at("DDPRUN_HEARTBEAT_FILE"));
  }
  CHECK(heartbeats.size() == 3);
  CHECK_FALSE(heartbeats.count("/elsewhere"));
}
