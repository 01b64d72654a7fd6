#pragma once
// Certificates for TLS tests, made with the openssl command line in a temporary directory: CAs,
// server certificates for chosen subjectAltNames (valid for 30 days, or expired in 2020), client
// certificates. EC P-256 keys: quick to make. Removed with the object.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ddprun::rounds::testing {

class TestPki {
 public:
  static bool available() { return std::filesystem::exists("/usr/bin/openssl"); }

  struct Pair {
    std::string cert, key;
  };
  enum class Validity { valid, expired };

  TestPki() {
    char tmpl[] = "/tmp/ddprun-pki-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    make_ca("ca");
  }
  ~TestPki() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  // The CA certificate `name` (made on first use; "ca" signs everything unless told otherwise).
  std::string ca(const std::string& name = "ca") {
    if (!std::filesystem::exists(dir_ + "/" + name + "/ca.pem")) make_ca(name);
    return dir_ + "/" + name + "/ca.pem";
  }
  // A server certificate for `san` ("IP:127.0.0.1,DNS:localhost"), usable as a client one too
  // (etcd's gateway presents it to etcd itself when client certificates are required).
  Pair server(const std::string& name, const std::string& san, Validity v = Validity::valid, const std::string& by = "ca") {
    return issue(name, "subjectAltName=" + san + "\nextendedKeyUsage=serverAuth,clientAuth\n", v, by);
  }
  Pair client(const std::string& name, const std::string& by = "ca") {
    return issue(name, "extendedKeyUsage=clientAuth\n", Validity::valid, by);
  }
  const std::string& dir() const { return dir_; }

 private:
  void run(const std::string& what, const std::string& cmd) {
    const std::string log = dir_ + "/openssl.log";
    if (std::system((cmd + " >" + log + " 2>&1").c_str()) != 0) {
      std::stringstream text;
      text << std::ifstream(log).rdbuf();
      throw std::runtime_error("openssl could not make " + what + ": " + cmd + "\n" + text.str());
    }
  }

  void make_ca(const std::string& name) {
    const std::string d = dir_ + "/" + name;
    std::filesystem::create_directories(d + "/issued");
    std::ofstream(d + "/index.txt").close();
    std::ofstream(d + "/ca.cnf") << "[req]\ndistinguished_name=dn\nprompt=no\n[dn]\nCN=ddprun test " << name
                                 << "\n[v3_ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
                                 << "[ca]\ndefault_ca=this\n[this]\ndir=" << d << "\ndatabase=$dir/index.txt\n"
                                 << "new_certs_dir=$dir/issued\nrand_serial=yes\ndefault_md=sha256\npolicy=any\n"
                                 << "unique_subject=no\n[any]\ncommonName=supplied\n";
    run("the CA " + name, "openssl req -x509 -config " + d + "/ca.cnf -extensions v3_ca -newkey ec -pkeyopt "
        "ec_paramgen_curve:prime256v1 -nodes -keyout " + d + "/ca.key -out " + d + "/ca.pem -days 30");
  }

  Pair issue(const std::string& name, const std::string& extensions, Validity v, const std::string& by) {
    ca(by);
    const std::string ca_dir = dir_ + "/" + by, base = dir_ + "/" + name;
    std::ofstream(base + ".ext") << "[x]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                                 << extensions;
    run(name + "'s request", "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" +
                                 name + " -keyout " + base + ".key -out " + base + ".csr");
    const std::string dates = v == Validity::valid ? "-days 30" : "-startdate 20200101000000Z -enddate 20200102000000Z";
    run(name + "'s certificate", "openssl ca -batch -config " + ca_dir + "/ca.cnf -cert " + ca_dir + "/ca.pem -keyfile " +
                                     ca_dir + "/ca.key -in " + base + ".csr -out " + base + ".pem -extfile " + base +
                                     ".ext -extensions x -notext " + dates);
    return {base + ".pem", base + ".key"};
  }

  std::string dir_;
};

}  // namespace ddprun::rounds::testing
