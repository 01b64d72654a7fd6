// A multi-node job secured with a per-job secret: agents that know it form the job; an agent
// with a wrong or missing secret is refused with a clear error and exit code 1; a secret file
// others can read is a usage error (exit 2).

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <regex>

#include "e2e/agents.hpp"

using namespace ddprun::test;

namespace {

// A secret file in a fresh private directory, removed at the end of the test.
class SecretFile {
 public:
  SecretFile(const std::string& text, mode_t mode = 0600) {
    dir_ = temp_dir();
    path_ = dir_ + "/secret";
    FILE* f = std::fopen(path_.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    ::chmod(path_.c_str(), mode);
  }
  ~SecretFile() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

}  // namespace

TEST_CASE("agents sharing a secret form the job - the host warns when there is none", "[security]") {
  SecretFile secret("0123456789abcdef\n");
  std::string conf = "--rdzv_conf=join_timeout=20,last_call_timeout=20,secret_file=" + secret.path();
  Launch a(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=sec", conf,
                "--nproc_per_node=1", kWorker, "env"}));
  auto port = host_port(a);
  // The second agent takes the secret from the environment instead.
  Launch b(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_id=sec",
                "--rdzv_conf=join_timeout=20,last_call_timeout=20", "--nproc_per_node=1", kWorker, "env"}),
           {{"DDPRUN_SECRET_FILE", secret.path()}});
  auto rb = b.finish(60s);
  auto ra = a.finish(60s);
  INFO(ra.err << rb.err);
  CHECK(ra.code == 0);
  CHECK(rb.code == 0);
  CHECK(ra.out.find("WORLD_SIZE=2") != std::string::npos);
  CHECK(ra.err.find("accepts any client") == std::string::npos);
}

TEST_CASE("an agent with a wrong or missing secret is refused and exits 1 - the host logs it once", "[security]") {
  SecretFile secret("the-real-secret");
  SecretFile wrong("a-guess");
  std::string conf = "join_timeout=5,last_call_timeout=5";
  Launch host(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=sec2",
                   "--rdzv_conf=" + conf + ",secret_file=" + secret.path(), "--nproc_per_node=1", kWorker, "env"}));
  auto port = host_port(host);
  const std::string ep = "--rdzv_endpoint=127.0.0.1:" + port;
  for (const std::string& variant : {std::string("wrong"), std::string("missing")}) {
    INFO(variant << " secret");
    std::string c = "--rdzv_conf=" + conf + (variant == "wrong" ? ",secret_file=" + wrong.path() : "");
    Launch intruder(cmd({"--nnodes=2", "--rdzv_backend=c10d", ep, "--rdzv_id=sec2", c, "--nproc_per_node=1",
                         kWorker, "env"}));
    auto r = intruder.finish(30s);
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(r.seconds < 4);  // refused at once, not after the join timeout
    CHECK(r.err.find("the rendezvous store at 127.0.0.1:" + port + " refused this node: wrong or missing secret") !=
          std::string::npos);
    CHECK(r.out.find("WORLD_SIZE") == std::string::npos);  // no worker ran
  }
  auto h = host.finish(30s);  // alone: its join times out
  INFO(h.err);
  CHECK(h.code != 0);
  CHECK(Launch::occurrences(h.err, "wrong or missing secret") == 1);
  CHECK(Launch::occurrences(h.err, "did not authenticate") == 1);
}

TEST_CASE("a secret file others can read is refused before anything starts (exit 2)", "[security]") {
  SecretFile open("s", 0644);
  auto r = Launch(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0",
                       "--rdzv_conf=secret_file=" + open.path(), "--nproc_per_node=1", kWorker, "env"}))
               .finish(20s);
  CHECK(r.code == 2);
  CHECK(r.err.find("accessible by other users (mode 0644)") != std::string::npos);
  auto missing = Launch(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--nproc_per_node=1",
                             kWorker, "env"}),
                        {{"DDPRUN_SECRET_FILE", "/nonexistent/ddprun-secret"}})
                     .finish(20s);
  CHECK(missing.code == 2);
  CHECK(missing.err.find("cannot open the secret file '/nonexistent/ddprun-secret'") != std::string::npos);
}
