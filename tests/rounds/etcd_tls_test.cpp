// The etcd client over TLS, against a TLS-only 3-member etcd cluster on loopback that requires
// client certificates, with certificates made here by openssl. Each thing an operator can get
// wrong (the CA, the name, the dates, the client certificate, the scheme) is a clear error that
// names the endpoint and what to check. Skipped, with a message, without etcd or openssl.
#include <catch2/catch.hpp>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "etcd_cluster.hpp"
#include "etcd_transport.hpp"
#include "skip.hpp"
#include "test_pki.hpp"

using namespace ddprun::rounds;
using namespace ddprun::rounds::testing;
using namespace std::chrono_literals;

#define SKIP_WITHOUT_TOOLS()                                                                                   \
  do {                                                                                                         \
    SKIP_UNLESS(EtcdCluster::available(), "etcd is not installed (scripts/setup.sh installs etcd-server)");    \
    SKIP_UNLESS(TestPki::available(), "openssl is not installed (scripts/setup.sh installs openssl)");         \
  } while (0)

namespace {

const std::string kLoopback = "IP:127.0.0.1";

EtcdClient client(std::vector<EtcdEndpoint> endpoints, EtcdTls tls, std::chrono::milliseconds timeout = 2s) {
  EtcdOptions o(std::move(endpoints), timeout);
  o.tls = std::move(tls);
  return EtcdClient(o);
}

std::string failure(EtcdClient c) {
  try {
    c.get("x");
  } catch (const ddprun::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("etcd TLS: schemes choose TLS - a mismatch with cacert is a usage error", "[etcd][tls]") {
  auto e = parse_etcd_endpoints("https://h1:2379, http://h2,h3:1,https://[::1]:2/");
  REQUIRE(e.size() == 4);
  CHECK(e[0].tls);
  CHECK_FALSE(e[1].tls);
  CHECK(e[1].port == 2379);
  CHECK_FALSE(e[2].tls);
  CHECK(e[3].host == "::1");
  CHECK(e[3].tls);
  CHECK(parse_etcd_endpoints("h3:1", true)[0].tls);
  CHECK_FALSE(parse_etcd_endpoints("http://h3:1", true)[0].tls);
  CHECK_THROWS_WITH(parse_etcd_endpoints("ftp://h"), Catch::Contains("http:// or https://"));
  CHECK_THROWS_WITH(parse_etcd_endpoints("fd00::1:2379"), Catch::Contains("IPv6 addresses need brackets"));
  CHECK_THROWS_WITH(parse_etcd_endpoints("https://h:"), Catch::Contains("1-65535"));
  CHECK_THROWS_WITH(check_etcd_tls(parse_etcd_endpoints("https://h1:2379"), {}),
                    Catch::Contains("https://h1:2379 uses TLS: give --rdzv_conf cacert=PATH"));
  CHECK_THROWS_WITH(check_etcd_tls(parse_etcd_endpoints("http://h1:2379", true), {"ca.pem", "", ""}),
                    Catch::Contains("http://h1:2379 is plain HTTP but --rdzv_conf cacert is given"));
  CHECK_THROWS_WITH(check_etcd_tls(parse_etcd_endpoints("h1", true), {"ca.pem", "c.pem", ""}),
                    Catch::Contains("cert and key go together"));
  CHECK_NOTHROW(check_etcd_tls(parse_etcd_endpoints("h1", true), {"ca.pem", "c.pem", "c.key"}));
}

TEST_CASE("etcd TLS: files that cannot be loaded are named", "[etcd][tls]") {
  SKIP_UNLESS(TestPki::available(), "openssl is not installed (scripts/setup.sh installs openssl)");
  TestPki pki;
  auto mine = pki.client("node"), other = pki.client("other");
  CHECK_THROWS_WITH(make_tls_context({pki.dir() + "/none.pem", "", ""}),
                    Catch::Contains("cacert=" + pki.dir() + "/none.pem: cannot be read"));
  CHECK_THROWS_WITH(make_tls_context({mine.key, "", ""}), Catch::Contains("not PEM CA certificates"));
  CHECK_THROWS_WITH(make_tls_context({pki.ca(), mine.cert, other.key}),
                    Catch::Contains("key=" + other.key + ": does not belong to the certificate"));
  CHECK_NOTHROW(make_tls_context({pki.ca(), mine.cert, mine.key}));
}

TEST_CASE("etcd TLS: a TLS-only 3-member cluster with client certificates - keys, transactions, leases, watches",
          "[etcd][tls]") {
  SKIP_WITHOUT_TOOLS();
  TestPki pki;
  auto server = pki.server("etcd", kLoopback + ",DNS:localhost");
  EtcdCluster cluster(3, {server.cert, server.key, pki.ca(), true});
  auto node = pki.client("node");
  auto c = client(cluster.endpoints(), {pki.ca(), node.cert, node.key}, 5s);
  auto rev = c.put("/tls/a", "1");
  CHECK(c.get("/tls/a")->value == "1");
  CHECK(c.create("/tls/b", "first"));
  CHECK_FALSE(c.create("/tls/b", "second"));
  auto lease = c.grant_lease(2s);
  CHECK(c.keep_alive(lease));
  // A watch is a long-lived chunked answer: over TLS too, it delivers the events after `rev`.
  auto events = c.watch("/tls/", true, rev + 1, 3s);
  REQUIRE(events.size() == 1);
  CHECK(events[0].kv.key == "/tls/b");
  // The name is checked as written: "localhost" is in the certificate too.
  auto by_name = client({{"localhost", cluster.client_port(0), true}}, {pki.ca(), node.cert, node.key});
  CHECK(by_name.get("/tls/a")->value == "1");
  // The leader dies: another member serves, over TLS.
  cluster.kill(cluster.leader());
  CHECK(c.get("/tls/b")->value == "first");
}

TEST_CASE("etcd TLS: a wrong CA, a name not in the certificate, no client certificate, http:// - each says what to check",
          "[etcd][tls]") {
  SKIP_WITHOUT_TOOLS();
  TestPki pki;
  auto server = pki.server("etcd", kLoopback);
  EtcdCluster cluster(1, {server.cert, server.key, pki.ca(), true});
  auto node = pki.client("node");
  const auto port = cluster.client_port(0);
  const std::string at = "127.0.0.1:" + std::to_string(port);
  auto wrong_ca = failure(client(cluster.endpoints(), {pki.ca("other"), node.cert, node.key}));
  CHECK_THAT(wrong_ca, Catch::Contains("cannot reach etcd at " + at));
  CHECK_THAT(wrong_ca, Catch::Contains("is not signed by the CA in --rdzv_conf cacert"));
  CHECK_THAT(wrong_ca, Catch::Contains("ddprun test ca"));  // the issuer it names
  auto wrong_name = failure(client({{"localhost", port, true}}, {pki.ca(), node.cert, node.key}));
  CHECK_THAT(wrong_name, Catch::Contains("TLS to localhost:" + std::to_string(port)));
  CHECK_THAT(wrong_name, Catch::Contains("is not issued for 'localhost'"));
  auto no_cert = failure(client(cluster.endpoints(), {pki.ca(), "", ""}));
  CHECK_THAT(no_cert, Catch::Contains("requires a client certificate"));
  CHECK_THAT(no_cert, Catch::Contains("--rdzv_conf cert=PATH,key=PATH"));
  auto stranger = pki.client("stranger", "other");
  auto foreign_cert = failure(client(cluster.endpoints(), {pki.ca(), stranger.cert, stranger.key}));
  CHECK_THAT(foreign_cert, Catch::Contains("refused this node's client certificate"));
  auto plain = failure(client({{"127.0.0.1", port, false}}, {}));
  CHECK_THAT(plain, Catch::Contains("cannot reach etcd at " + at));
  CHECK_THAT(plain, Catch::Contains("etcd with TLS does that: write https://" + at + " and give --rdzv_conf cacert"));
}

TEST_CASE("etcd pointed at a c10d store: the message says it may not be etcd at all, and what to use then", "[etcd][tls]") {
  ddprun::rendezvous::StoreServer store(ddprun::rendezvous::StoreServerOptions{});
  store.start();
  const std::string at = "127.0.0.1:" + std::to_string(store.port());
  auto said = failure(client({{"127.0.0.1", store.port(), false}}, {}));
  CHECK_THAT(said, Catch::Contains("cannot reach etcd at " + at));
  CHECK_THAT(said, Catch::Contains("a server that is not etcd (a c10d store there: --rdzv_backend=c10d)"));
}

TEST_CASE("etcd TLS: an expired server certificate, and https:// to a plain member - each says what to check",
          "[etcd][tls]") {
  SKIP_WITHOUT_TOOLS();
  TestPki pki;
  auto old = pki.server("old", kLoopback, TestPki::Validity::expired);
  EtcdCluster expired(1, {old.cert, old.key, pki.ca(), false}, EtcdCluster::Ready::listening);
  auto e = failure(client(expired.endpoints(), {pki.ca(), "", ""}, 5s));
  CHECK_THAT(e, Catch::Contains("TLS to 127.0.0.1:" + std::to_string(expired.client_port(0))));
  CHECK_THAT(e, Catch::Contains("expired on Jan  2 00:00:00 2020 GMT: renew etcd's server certificate"));
  EtcdCluster plain(1);
  auto p = failure(client({{"127.0.0.1", plain.client_port(0), true}}, {pki.ca(), "", ""}));
  CHECK_THAT(p, Catch::Contains("closed the connection during the TLS handshake"));
  CHECK_THAT(p, Catch::Contains("etcd without TLS does that: write http://127.0.0.1:" +
                                std::to_string(plain.client_port(0)) + " without cacert"));
}
