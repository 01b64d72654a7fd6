#include "rdzv_flags.hpp"

#include <set>

#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/auth.hpp"

namespace ddprun::launcher {
namespace {

std::string random_run_id() { return random_hex(12); }

// Option `name` with `value` as the user gave it: its flag, or the variable it was read from.
std::string given_as(const Settings& s, const std::string& name, const std::string& value) {
  const auto it = s.origin.find(name);
  return it == s.origin.end() ? "--" + name + "=" + value : it->second + "=" + value + " (read as --" + name + ")";
}

// Option `name` as the user set it, without its value: its flag, or the variable read for it.
std::string setting_of(const Settings& s, const std::string& name) {
  const auto it = s.origin.find(name);
  return it == s.origin.end() ? "--" + name : it->second + " (read as --" + name + ")";
}

// The --rdzv_conf values that are not settings of their own: where the job's secret is, and
// torchrun's etcd protocol (http or https) for endpoints written without a scheme.
struct ConfExtras {
  std::string secret_file;
  std::string password_file;
  std::string protocol;
};

// A key that has no effect on this job's backend is refused: the user meant something by it
// (a password the store would not ask for, a TTL no lease has).
void check_backend(const std::string& k, const rounds::RendezvousOptions& z) {
  const bool etcd = z.backend == rounds::BackendKind::etcd;
  static const std::set<std::string> etcd_only = {"prefix", "lease_ttl", "user", "password", "password_file",
                                                   "protocol", "cacert", "cert", "key"};
  if (!etcd && etcd_only.count(k)) {
    usage("--rdzv_conf " + k + " applies to --rdzv_backend=etcd" +
          (k == "cacert" || k == "cert" || k == "key" ? std::string(" (TLS to etcd)") : std::string()) +
          "; this job meets in a c10d store" +
          (k == "lease_ttl" ? std::string(", where a node is lost after keep_alive_interval x keep_alive_max_attempt")
           : k.rfind("password", 0) == 0 || k == "user" ? std::string(", whose clients prove themselves with secret_file=PATH")
                                                         : std::string()));
  }
  if (etcd && (k == "is_host" || k == "keep_alive_interval" || k == "keep_alive_max_attempt")) {
    usage("--rdzv_conf " + k + " applies to the c10d store; with --rdzv_backend=etcd " +
          (k == "is_host" ? "no node hosts the records (every node is etcd's client)"
                          : "a node is lost when its lease runs out: set lease_ttl (seconds)"));
  }
}

void apply_rdzv_conf(const std::map<std::string, std::string>& conf, rounds::RendezvousOptions& z, ConfExtras& x) {
  if (conf.count("timeout") && conf.count("join_timeout")) {
    usage("--rdzv_conf timeout and join_timeout are one setting (timeout is torchrun's name for it): give one");
  }
  for (const auto& [k, v] : conf) {
    check_backend(k, z);
    if (k == "join_timeout" || k == "timeout") z.join_timeout = parse_seconds("rdzv_conf " + k, v, false);
    else if (k == "last_call_timeout") z.last_call_timeout = parse_seconds("rdzv_conf " + k, v, true);
    else if (k == "close_timeout") z.close_timeout = parse_seconds("rdzv_conf " + k, v, true);
    else if (k == "keep_alive_interval") z.keep_alive_interval = parse_seconds("rdzv_conf " + k, v, false);
    else if (k == "read_timeout") z.read_timeout = parse_seconds("rdzv_conf " + k, v, false);
    else if (k == "keep_alive_max_attempt") z.keep_alive_max_attempt = parse_count("rdzv_conf keep_alive_max_attempt", v, false);
    else if (k == "is_host") {
      const std::string b = lower(v);
      if (b == "1" || b == "true" || b == "yes") z.host_role = rounds::HostRole::always;
      else if (b == "0" || b == "false" || b == "no") z.host_role = rounds::HostRole::never;
      else usage("--rdzv_conf is_host must be true or false (got '" + v + "')");
    } else if (k == "prefix") {
      if (v.empty() || v[0] != '/') usage("--rdzv_conf prefix must start with '/' (got '" + v + "')");
      z.etcd_prefix = v;
    } else if (k == "lease_ttl") {
      auto n = parse_int(v, 1, 3600);
      if (!n) usage("--rdzv_conf lease_ttl must be 1-3600 seconds (got '" + v + "')");
      z.lease_ttl = std::chrono::seconds(*n);
    } else if (k == "user") {
      z.etcd_user = v;
    } else if (k == "password") {
      z.etcd_password = v;  // seen by every local user in ps: password_file or DDPRUN_ETCD_PASSWORD instead
    } else if (k == "password_file") {
      if (v.empty()) usage("--rdzv_conf password_file needs a path");
      x.password_file = v;
    } else if (k == "cacert" || k == "cert" || k == "key") {
      if (v.empty()) usage("--rdzv_conf " + k + " needs a path (a PEM file, as etcdctl --" + k + ")");
      (k == "cacert" ? z.etcd_cacert : k == "cert" ? z.etcd_cert : z.etcd_key) = v;
    } else if (k == "protocol") {
      if (v != "http" && v != "https") usage("--rdzv_conf protocol must be http or https (got '" + v + "')");
      x.protocol = v;
    } else if (k == "secret_file") {
      if (v.empty()) usage("--rdzv_conf secret_file needs a path");
      x.secret_file = v;
    } else {
      usage("--rdzv_conf: unknown key '" + k + "' (known: join_timeout, last_call_timeout, close_timeout, "
            "keep_alive_interval, keep_alive_max_attempt, read_timeout, is_host, timeout, secret_file; etcd: prefix, lease_ttl, "
            "user, password, password_file, cacert, cert, key, protocol)");
    }
  }
}

// etcd's password from a file of mode 0600 (password_file=) or DDPRUN_ETCD_PASSWORD: both keep it
// out of the command line, which ps shows to every local user. Only one source may give it.
void etcd_password(const ConfExtras& x, const std::map<std::string, std::string>& env, rounds::RendezvousOptions& z) {
  const auto from_env = env.find("DDPRUN_ETCD_PASSWORD");
  const int sources = !z.etcd_password.empty() + !x.password_file.empty() + (from_env != env.end());
  if (sources > 1) {
    usage("the etcd password is given more than once (--rdzv_conf password=, password_file=, DDPRUN_ETCD_PASSWORD): keep one "
          "(password_file or DDPRUN_ETCD_PASSWORD: ps shows the command line to every local user)");
  }
  if (!x.password_file.empty()) {
    z.etcd_password = rendezvous::auth::read_private_file(x.password_file, "the etcd password file",
                                                          "printf %s PASSWORD > FILE; chmod 600 FILE");
  } else if (from_env != env.end() && z.backend == rounds::BackendKind::etcd) {
    z.etcd_password = from_env->second;
  }
}

// torchrun's protocol=https: the etcd endpoints written without a scheme get one.
std::string with_scheme(const std::string& endpoints, const std::string& protocol) {
  std::string out;
  for (const auto& item : split(endpoints, ',')) {
    std::string v = trim(item);
    if (v.empty()) continue;
    out += (out.empty() ? "" : ",") + (v.find("://") == std::string::npos ? protocol + "://" + v : v);
  }
  return out;
}

// A c10d or static endpoint is HOST[:PORT]: a URL is etcd's way of writing one.
std::pair<std::string, std::uint16_t> store_endpoint(const std::string& v) {
  if (v.find("://") != std::string::npos) {
    usage("--rdzv_endpoint='" + v + "': http:// and https:// are for --rdzv_backend=etcd; the c10d store takes HOST[:PORT]");
  }
  return parse_endpoint(v.empty() ? "127.0.0.1" : v, 29400);
}

// Where the store is: --standalone binds a free port on loopback (bound first, then published: no
// free-port race), as does etcd's node for its workers (etcd runs on machines of its own); c10d at
// --rdzv_endpoint; static there too where given, as torchrun does, else at --master_addr.
void locate_store(const Settings& s, rounds::RendezvousOptions& z) {
  if (s.standalone) {
    if (s.max_nodes != 1) usage("--standalone runs a single node: drop --nnodes or set it to 1");
    z.store_host = "127.0.0.1";
    z.store_port = 0;
    z.run_id = random_run_id();
  } else if (s.rdzv_backend == "etcd") {
    // (not the first host of a Slurm step: etcd runs on machines of its own)
    if (s.rdzv_endpoint.empty() || s.rdzv_endpoint_from_slurm) {
      usage("--rdzv_backend=etcd needs --rdzv_endpoint=HOST:PORT[,HOST:PORT...] (etcd's members)");
    }
    z.etcd_endpoints = s.rdzv_endpoint;
    z.store_host = "127.0.0.1";
    z.store_port = 0;
    z.endpoint_host_setting = z.endpoint_port_setting = setting_of(s, "rdzv_endpoint");
  } else if (s.rdzv_backend == "c10d" || (!s.rdzv_endpoint.empty() && !s.rdzv_endpoint_from_slurm)) {
    std::tie(z.store_host, z.store_port) = store_endpoint(s.rdzv_endpoint);
    z.endpoint_host_setting = z.endpoint_port_setting = setting_of(s, "rdzv_endpoint");
  } else {
    z.store_host = s.master_addr;
    z.store_port = s.master_port;
    z.endpoint_host_setting = setting_of(s, "master_addr");
    z.endpoint_port_setting = setting_of(s, "master_port");
  }
}

// The static rendezvous' fixed number of nodes and this node's rank among them.
void check_static(const Settings& s, rounds::RendezvousOptions& z) {
  if (s.min_nodes != s.max_nodes) {
    usage(given_as(s, "nnodes", s.nnodes_text) + ": a range needs --rdzv_backend=c10d (static rendezvous has a fixed number of nodes)");
  }
  if (z.node_rank >= s.max_nodes) {
    usage(given_as(s, "node_rank", std::to_string(z.node_rank)) + " must be below " + given_as(s, "nnodes", s.nnodes_text));
  }
  // Node 0 hosts the store (at --master_addr:--master_port, or at --rdzv_endpoint).
  z.host_role = z.node_rank == 0 ? rounds::HostRole::always : rounds::HostRole::never;
}

// --rdzv_conf (from PET_RDZV_CONF, Kubeflow's: named, it is what to change), the job's secret and
// etcd's password.
void apply_settings(const Settings& s, const std::map<std::string, std::string>& env, rounds::RendezvousOptions& z) {
  ConfExtras x;
  try {
    if (!s.rdzv_conf_twice.empty()) usage(s.rdzv_conf_twice);
    apply_rdzv_conf(s.rdzv_conf, z, x);
  } catch (const UsageError& e) {
    const auto from = s.origin.find("rdzv_conf");
    if (from == s.origin.end()) throw;
    usage(from->second + " (read as --rdzv_conf): " + e.what());
  }
  if (!x.protocol.empty()) z.etcd_endpoints = with_scheme(z.etcd_endpoints, x.protocol);
  if (x.secret_file.empty()) x.secret_file = get_env(env, "DDPRUN_SECRET_FILE", "");
  if (!x.secret_file.empty()) z.secret = rendezvous::auth::read_secret_file(x.secret_file);
  etcd_password(x, env, z);
}

}  // namespace

void place_store(const Settings& s, const std::map<std::string, std::string>& env, agent::AgentOptions& a) {
  using rounds::BackendKind;
  auto& z = a.rdzv;
  z.run_id = s.rdzv_id;
  z.node_rank = s.node_rank;
  z.node_rank_setting = setting_of(s, "node_rank");
  z.min_nodes = s.min_nodes;
  z.max_nodes = s.max_nodes;
  z.local_addr = s.local_addr;
  z.max_restarts = s.max_restarts;
  z.max_same_failures = s.max_same_failures;
  locate_store(s, z);
  // One node meets nobody: the static rendezvous (and --standalone) is skipped. A c10d or etcd
  // backend asked for by name is used, as torchrun does: etcd checks the run id's exclusivity and
  // its TLS even for one node.
  if (s.max_nodes == 1 && (s.standalone || s.rdzv_backend == "static")) {
    if (z.node_rank != 0) {
      usage(given_as(s, "node_rank", std::to_string(z.node_rank)) + " needs --nnodes > " + std::to_string(z.node_rank) +
            " (this job: " + given_as(s, "nnodes", s.nnodes_text) + ")");
    }
    if (!s.rdzv_conf.empty() && !s.standalone) {
      usage("--rdzv_conf applies to --rdzv_backend=c10d or etcd (this one-node job uses the static rendezvous, which has "
            "no settings)");
    }
    z.backend = BackendKind::single_node;
    return;
  }
  z.backend = s.rdzv_backend == "static" ? BackendKind::static_ranks : s.rdzv_backend == "etcd" ? BackendKind::etcd : BackendKind::c10d;
  z.endpoint_host = z.store_host;
  z.endpoint_port = z.store_port;
  if (z.backend == BackendKind::static_ranks) check_static(s, z);
  apply_settings(s, env, z);
  rounds::validate(z);
}

}  // namespace ddprun::launcher
