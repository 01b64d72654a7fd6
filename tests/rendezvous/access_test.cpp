// Access control: the same-user rule for peers on this host (kernel sock_diag), address
// allow-lists, and ddprun's HMAC handshake with a per-job secret.

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "ddprun/rendezvous/auth.hpp"
#include "skip.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "helpers.hpp"
#include "peer_access.hpp"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::test;

namespace {

TcpStoreOptions options(std::uint16_t port, std::string secret = "") {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = 3s;
  o.secret = std::move(secret);
  return o;
}

// In a child process running as `uid`: connect, VALIDATE, SET "intruder", PING. Exit 0 when
// the PING was answered (the SET was served), 1 when the server closed the connection.
int try_as_user(uid_t uid, std::uint16_t port) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(3);
    try {
      auto raw = Raw::speaking(Dialect::kV2, port);
      raw.send(Frame(Dialect::kV2, Op::kSet).str("intruder").str("was here"));
      ::_exit(raw.ping_is_next() ? 0 : 2);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

std::string write_secret(const std::string& text, mode_t mode) {
  char tmpl[] = "/tmp/ddprun-secret-XXXXXX";
  int fd = ::mkstemp(tmpl);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  ::chmod(tmpl, mode);
  return tmpl;
}

}  // namespace

TEST_CASE("same_user: a process of another user on this host is refused - the job's own are served",
          "[access]") {
  SKIP_UNLESS(::geteuid() == 0, "needs root to run a client as another user");
  LogCapture logs;
  auto o = TestServer::with_loopback();
  o.same_user = true;
  TestServer server(o);
  CHECK(try_as_user(65534, server.port()) == 1);  // nobody
  CHECK(try_as_user(65534, server.port()) == 1);
  CHECK(try_as_user(0, server.port()) == 0);  // root, as the job
  auto own = Raw::speaking(Dialect::kV2, server.port());
  own.send(Frame(Dialect::kV2, Op::kGet).str("intruder"));
  CHECK(own.str() == "was here");  // root's SET above; nobody's never applied
  CHECK(logs.await_lines_with({"refused a connection from 127.0.0.1", "uid 65534"}).size() == 1);  // once per peer
  CHECK(server.stats().refused_connections == 2);
}

TEST_CASE("without same_user any local user gets in (the old behaviour - now opt-in)", "[access]") {
  if (::geteuid() != 0) return;
  TestServer server;
  CHECK(try_as_user(65534, server.port()) == 0);
}

TEST_CASE("CIDR allow-lists parse and match", "[access]") {
  auto list = parse_cidr_list("10.0.0.0/8, 192.168.1.7,fd00::/8");
  REQUIRE(list.size() == 3);
  auto a = [](const char* s) { return *IpAddress::parse(s); };
  CHECK(list[0].contains(a("10.200.3.4")));
  CHECK_FALSE(list[0].contains(a("11.0.0.1")));
  CHECK(list[1].contains(a("192.168.1.7")));
  CHECK_FALSE(list[1].contains(a("192.168.1.8")));
  CHECK(list[2].contains(a("fd12::1")));
  CHECK_FALSE(list[2].contains(a("fe80::1")));
  CHECK(list[0].contains(a("::ffff:10.1.1.1")));  // IPv4-mapped
  CHECK(Cidr::parse("0.0.0.0/0").contains(a("8.8.8.8")));
  CHECK_THROWS_AS(parse_cidr_list("10.0.0.0/33"), ddprun::UsageError);
  CHECK_THROWS_AS(parse_cidr_list("nonsense"), ddprun::UsageError);
  CHECK(a("127.0.0.5").is_loopback());
  CHECK(a("::1").is_loopback());
}

TEST_CASE("the secret handshake: right secret served - wrong or missing refused with a clear error", "[access]") {
  LogCapture logs;
  auto o = TestServer::with_loopback();
  o.secret = "s3cret-of-this-job";
  TestServer server(o);
  TcpStore good(options(server.port(), "s3cret-of-this-job"));
  good.set("round", "1");
  CHECK(good.get("round") == "1");

  SECTION("wrong secret") {
    auto t0 = Clock::now();
    try {
      TcpStore bad(options(server.port(), "guess"));
      FAIL("a wrong secret was accepted");
    } catch (const ddprun::AuthError& e) {
      CHECK_THAT(e.what(), Catch::Contains("refused this client: wrong or missing secret"));
    }
    CHECK(Clock::now() - t0 < 2s);  // not retried until the timeout
    CHECK(logs.await_lines_with({"refused 127.0.0.1:", "wrong or missing secret"}).size() == 1);
  }
  SECTION("no secret (a ddprun client)") {
    try {
      TcpStore none(options(server.port()));
      FAIL("a client without the secret was accepted");
    } catch (const ddprun::AuthError& e) {
      CHECK_THAT(e.what(), Catch::Contains("refused this client: wrong or missing secret"));
    }
  }
  SECTION("a plain TCPStore client (as PyTorch's) cannot set a key") {
    auto raw = Raw(server.port());
    raw.send(Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic).bytes() +
             Frame(Dialect::kV2, Op::kSet).str("/round").str("999").bytes() +
             Frame(Dialect::kV2, Op::kPing).u32(1).bytes());
    CHECK(raw.read<std::uint32_t>() == auth::kRefusedMarker);
    CHECK(raw.closed_by_server());
    CHECK(good.get("round") == "1");
    CHECK(logs.await_lines_with({"refused 127.0.0.1:", "did not authenticate"}).size() == 1);
  }
  SECTION("a client that says nothing is closed after auth_timeout") {
    // (the server above uses the default 10 s; a second one with 300 ms)
    auto quick = TestServer::with_loopback();
    quick.secret = "x";
    quick.auth_timeout = 300ms;
    TestServer s2(quick);
    auto idle = Raw(s2.port());
    auto t0 = Clock::now();
    CHECK(idle.closed_by_server());
    CHECK(Clock::now() - t0 < 3s);
  }
  // The good client was never disturbed.
  CHECK(good.add("n", 1) == 1);
}

TEST_CASE("a client with a secret refuses a server that does not authenticate", "[access]") {
  TestServer plain;
  try {
    TcpStore c(options(plain.port(), "s3cret"));
    FAIL("connected to a server that cannot prove it knows the secret");
  } catch (const ddprun::AuthError& e) {
    CHECK_THAT(e.what(), Catch::Contains("does not authenticate"));
  }
}

TEST_CASE("secret files: private - non-empty - bounded - trailing newline ignored", "[access]") {
  auto good = write_secret("abc\n", 0600);
  CHECK(auth::read_secret_file(good) == "abc");
  auto open = write_secret("abc", 0644);
  try {
    auth::read_secret_file(open);
    FAIL("a world-readable secret file was accepted");
  } catch (const ddprun::UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("accessible by other users (mode 0644)") && Catch::Contains("chmod 600"));
  }
  auto empty = write_secret("\n", 0600);
  CHECK_THROWS_WITH(auth::read_secret_file(empty), Catch::Contains("is empty"));
  auto big = write_secret(std::string(5000, 'x'), 0600);
  CHECK_THROWS_WITH(auth::read_secret_file(big), Catch::Contains("more than 4096 bytes"));
  CHECK_THROWS_WITH(auth::read_secret_file("/nonexistent/secret"),
                    Catch::Contains("cannot open the secret file") && Catch::Contains("(create it with: "));
  // Another user's 0600 file: the hint says whose it is, not how to create it (read as nobody).
  if (::geteuid() == 0) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t child = ::fork();
    if (child == 0) {
      std::string said = "read it";
      if (::setresgid(65534, 65534, 65534) == 0 && ::setresuid(65534, 65534, 65534) == 0) {
        try {
          auth::read_secret_file(good);
        } catch (const std::exception& e) {
          said = e.what();
        }
      }
      (void)!::write(fds[1], said.data(), said.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string said;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) said.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    ::waitpid(child, nullptr, 0);
    CHECK_THAT(said, Catch::Contains("Permission denied (this user may not read it, or a folder on its path") &&
                         !Catch::Contains("create it with"));
  }
  for (const auto& p : {good, open, empty, big}) ::unlink(p.c_str());
}
