// ddprun-store: a standalone rendezvous store, for dedicated rendezvous hosts, tests and
// benchmarks. Prints "listening on HOST:PORT" as its first line, serves until SIGINT/SIGTERM.

#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <vector>

#include <boost/program_options.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/build_info.hpp"
#include "ddprun/rendezvous/auth.hpp"
#include "peer_access.hpp"

namespace po = boost::program_options;

namespace {

// "64M", "1G", "4096": sizes with an optional K/M/G suffix (powers of 1024).
std::size_t parse_size(const std::string& name, const std::string& text) {
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (const std::exception&) {
    throw ddprun::UsageError("--" + name + " '" + text + "' is not a size (examples: 4096, 64K, 8M, 1G)");
  }
  std::string unit = text.substr(pos);
  unsigned long long mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mult = 1ULL << 10;
  else if (unit == "M" || unit == "MiB") mult = 1ULL << 20;
  else if (unit == "G" || unit == "GiB") mult = 1ULL << 30;
  else if (!unit.empty()) throw ddprun::UsageError("--" + name + " '" + text + "': unknown unit '" + unit + "' (K, M or G)");
  if (text[0] == '-' || v > (~0ULL) / mult) throw ddprun::UsageError("--" + name + " '" + text + "' is out of range");
  return static_cast<std::size_t>(v * mult);
}

// What the command line sets: the server's options and the values checked after parsing.
struct Config {
  ddprun::rendezvous::StoreServerOptions opts;
  int port = 0;
  std::string log_level, allow, secret_file;
  bool same_user = true;
  bool count_requests = false;
  bool secret_file_given = false;
  long keepalive = 0;
  std::map<std::string, std::size_t*> sizes;
  std::map<std::string, std::string> size_text;

  Config() {
    opts.host = "127.0.0.1";
    keepalive = opts.tcp_keepalive_idle.count();
    sizes = {
        {"max_key_bytes", &opts.limits.max_key_bytes},
        {"max_value_bytes", &opts.limits.max_value_bytes},
        {"max_request_bytes", &opts.limits.max_request_bytes},
        {"max_reply_bytes", &opts.max_reply_bytes},
        {"max_store_bytes", &opts.max_store_bytes},
        {"output_high_water_bytes", &opts.output_high_water_bytes},
        {"max_pending_output_bytes", &opts.max_pending_output_bytes},
    };
    auto human = [](std::size_t v) {
      if (v % (1ULL << 30) == 0) return std::to_string(v >> 30) + "G";
      if (v % (1ULL << 20) == 0) return std::to_string(v >> 20) + "M";
      if (v % (1ULL << 10) == 0) return std::to_string(v >> 10) + "K";
      return std::to_string(v);
    };
    for (auto& [name, ptr] : sizes) size_text[name] = human(*ptr);
  }
  po::typed_value<std::string>* size(const char* name) {
    return po::value(&size_text[name])->default_value(size_text[name]);
  }
};

po::options_description describe(Config& c) {
  auto& o = c.opts;
  po::options_description desc(
      "Usage: ddprun-store [--host H] [--port P] [options]\n"
      "Serves a PyTorch-compatible TCPStore (1.13 and 2.x clients) until SIGINT or SIGTERM.\n"
      "Sizes take K, M or G (powers of 1024). A client over a limit loses its connection, with one\n"
      "log line naming the limit; every other client goes on.\n\nOptions");
  desc.add_options()
      ("help,h", "show this help")
      ("version", "show the version and exit")
      ("host", po::value(&o.host)->default_value(o.host), "address to bind; \"\" = every interface (then give --allow)")
      ("port", po::value(&c.port)->default_value(0), "port to bind; 0 picks a free one (printed on the first line)")
      ("allow", po::value(&c.allow)->default_value("127.0.0.0/8,::1/128"),
       "CIDR blocks clients on other hosts must be in, comma-separated; '*' = any address")
      ("same_user", po::value(&c.same_user)->default_value(true),
       "clients on this host must be processes of this user or root (kernel sock_diag)")
      ("secret_file", po::value(&c.secret_file)->default_value(""),
       "require ddprun's HMAC handshake with the secret in this file (mode 0600); PyTorch clients are then refused")
      ("max_key_bytes", c.size("max_key_bytes"), "longest key")
      ("max_value_bytes", c.size("max_value_bytes"), "longest value, also as APPEND grows it")
      ("max_request_bytes", c.size("max_request_bytes"), "largest request")
      ("max_keys_per_request", po::value(&o.limits.max_keys_per_request)->default_value(o.limits.max_keys_per_request),
       "keys in one CHECK, WAIT, MULTI_GET or MULTI_SET")
      ("max_reply_bytes", c.size("max_reply_bytes"), "largest reply (MULTI_GET)")
      ("max_store_bytes", c.size("max_store_bytes"),
       "the memory budget: keys, values, queues, waits, watches and the clients' buffers, with their "
       "overhead; a request over it fails for its client only")
      ("max_waits_per_connection", po::value(&o.max_waits_per_connection)->default_value(o.max_waits_per_connection),
       "keys one connection may wait on at once")
      ("max_watches_per_connection",
       po::value(&o.max_watches_per_connection)->default_value(o.max_watches_per_connection),
       "WATCH_KEY registrations per connection (PyTorch 1.13)")
      ("max_queue_length", po::value(&o.max_queue_length)->default_value(o.max_queue_length), "items in one queue")
      ("output_high_water_bytes", c.size("output_high_water_bytes"),
       "unsent replies at which a client is not read from until they drain to half")
      ("max_pending_output_bytes", c.size("max_pending_output_bytes"),
       "unsent replies (WAIT wake-ups, watch events) beyond which a client is disconnected")
      ("max_connections", po::value(&o.max_connections)->default_value(o.max_connections),
       "clients connected at once; more are refused (logged at most once a second)")
      ("max_unauthenticated_connections",
       po::value(&o.max_unauthenticated_connections)->default_value(o.max_unauthenticated_connections),
       "with --secret_file: connections still authenticating; a newcomer closes the oldest (told to retry)")
      ("max_unauthenticated_per_address",
       po::value(&o.max_unauthenticated_per_address)->default_value(o.max_unauthenticated_per_address),
       "with --secret_file: the same, from one source address")
      ("reserved_fds", po::value(&o.reserved_fds)->default_value(o.reserved_fds),
       "descriptors kept free under the open-file limit")
      ("tcp_keepalive_s", po::value(&c.keepalive)->default_value(c.keepalive),
       "probe a silent client after this many seconds and drop it if it vanished; 0 = off")
      ("count_requests", po::bool_switch(&c.count_requests),
       "at exit (and at each SIGUSR1, the tally so far), print to stdout the requests served, by operation and key "
       "pattern (numbers in keys as <n>), with their key and value bytes and reply bytes, and how many WAITs a set woke")
      ("log_level", po::value(&c.log_level)->default_value("info"), "trace, debug, info, warn, error or off");
  return desc;
}

// Checks what parsing could not and fills the server's options. Throws UsageError.
void finish(Config& c) {
  for (auto& [name, ptr] : c.sizes) *ptr = parse_size(name, c.size_text[name]);
  if (c.port < 0 || c.port > 65535) {
    throw ddprun::UsageError("--port " + std::to_string(c.port) + " is out of range (0-65535; 0 picks a free port)");
  }
  if (c.keepalive < 0) throw ddprun::UsageError("--tcp_keepalive_s must be 0 (off) or positive");
  if (c.allow != "*") {
    c.opts.allow = std::vector<std::string>{c.allow};
    ddprun::rendezvous::parse_cidr_list(c.allow);  // validate now, with the flag's name
  }
  if (c.secret_file_given && c.secret_file.empty()) {  // ("$SECRET_FILE" unset): not a store open to all
    throw ddprun::UsageError("--secret_file needs a path (it was given empty); leave it out to serve without a secret");
  }
  if (!c.secret_file.empty()) c.opts.secret = ddprun::rendezvous::auth::read_secret_file(c.secret_file);
  auto level = spdlog::level::from_str(c.log_level);
  if (level == spdlog::level::off && c.log_level != "off") {
    throw ddprun::UsageError("unknown --log_level '" + c.log_level + "'");
  }
  c.opts.port = static_cast<std::uint16_t>(c.port);
  c.opts.same_user = c.same_user;
  c.opts.tcp_keepalive_idle = std::chrono::seconds(c.keepalive);
}

// --count_requests: the requests served, by operation and key pattern.
struct Tally {
  std::size_t count = 0, request_bytes = 0, reply_bytes = 0;
};
using Tallies = std::map<std::pair<std::string, std::string>, Tally>;

// At most this many patterns are told apart (clients choose the keys: a tally of each one's
// patterns would grow without bound, outside --max_store_bytes); the rest count as "<other>".
constexpr std::size_t kMostPatterns = 4096;

// "ddprun/rdzv/job/r12/node/3" -> "ddprun/rdzv/job/r<n>/node/<n>": a key's pattern, its first
// 64 bytes, escaped (printable, one line).
std::string key_pattern(std::string_view key) {
  std::string out;
  for (std::size_t i = 0; i < key.size() && out.size() < 64;) {
    if (key[i] >= '0' && key[i] <= '9') {
      while (i < key.size() && key[i] >= '0' && key[i] <= '9') ++i;
      out += "<n>";
    } else {
      out += key[i++];
    }
  }
  return ddprun::escape_for_log(out, 1024);  // (whole: a cut's "... (N bytes)" would split the column)
}

void print_tallies(const Tallies& t, std::size_t woken) {
  std::printf("%-12s %-48s %10s %14s %14s\n", "op", "key", "requests", "request_bytes", "reply_bytes");
  Tally all;
  for (const auto& [k, v] : t) {
    std::printf("%-12s %-48s %10zu %14zu %14zu\n", k.first.c_str(), k.second.c_str(), v.count, v.request_bytes,
                v.reply_bytes);
    all.count += v.count, all.request_bytes += v.request_bytes, all.reply_bytes += v.reply_bytes;
  }
  std::printf("%-12s %-48s %10zu %14zu %14zu\n", "total", "", all.count, all.request_bytes, all.reply_bytes);
  std::printf("waits_woken %zu\n", woken);
  std::fflush(stdout);
}

// Serves until SIGINT or SIGTERM; with count_requests, SIGUSR1 prints the tally so far (a
// benchmark's snapshot between phases: bench/fleet_bench.cpp).
int serve(ddprun::rendezvous::StoreServerOptions opts, bool count_requests) {
  Tallies tallies;  // written on the I/O thread, read on this one under tallies_mu
  std::mutex tallies_mu;
  if (count_requests) {
    opts.on_applied = [&tallies, &tallies_mu](std::string_view op, std::string_view key, std::size_t in, std::size_t out) {
      std::pair<std::string, std::string> row{std::string(op), key_pattern(key)};
      std::lock_guard<std::mutex> lk(tallies_mu);
      if (tallies.size() >= kMostPatterns && !tallies.count(row)) row.second = "<other>";
      Tally& t = tallies[row];
      ++t.count;
      t.request_bytes += in;
      t.reply_bytes += out;
    };
  }
  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  if (count_requests) sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  ddprun::rendezvous::StoreServer server(opts);
  const auto& host = server.host();
  std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::printf("listening on %s:%u\n", shown.c_str(), server.port());
  std::fflush(stdout);
  if ((opts.host.empty() || (host != "127.0.0.1" && host != "::1")) && !opts.allow) {
    spdlog::warn("store: any host that can reach port {} may connect (--allow '*'){}", server.port(),
                 opts.secret.empty() ? " and read or change every key" : "");
  }
  server.start();
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGUSR1) {
    const std::size_t woken = server.stats().waits_woken;
    std::unique_lock<std::mutex> lk(tallies_mu);
    const Tallies now = tallies;  // printed without the lock: a stdout nobody reads must not stall the clients
    lk.unlock();
    print_tallies(now, woken);
  }
  spdlog::info("store: stopping on signal {}", sig);
  const std::size_t woken = count_requests ? server.stats().waits_woken : 0;
  server.stop();
  if (count_requests) print_tallies(tallies, woken);
  return 0;
}

// An error about the command line, on one line: a long quoted value cut, control bytes escaped.
std::string said(const std::string& what) { return ddprun::escape_for_log(ddprun::shorten_quoted(what), 8192); }

}  // namespace

int main(int argc, char** argv) {
  Config c;
  auto desc = describe(c);
  po::variables_map vm;
  try {
    // Words that are no option are refused, named: `ddprun-store 29500` listened on another port.
    po::options_description all;
    all.add(desc).add_options()("stray", po::value<std::vector<std::string>>());
    po::store(po::command_line_parser(argc, argv).options(all).positional(po::positional_options_description().add("stray", -1)).run(), vm);
    po::notify(vm);
    if (vm.count("stray")) {
      throw ddprun::UsageError("'" + vm["stray"].as<std::vector<std::string>>()[0] +
                               "' is not an option: ddprun-store takes options only (a port: --port 29500; "
                               "several --allow blocks: one value, comma-separated)");
    }
    c.secret_file_given = !vm["secret_file"].defaulted();
    finish(c);
  } catch (const po::error& e) {
    std::cerr << "ddprun-store: " << said(e.what()) << "\n(see ddprun-store --help)\n";
    return 2;
  } catch (const ddprun::Error& e) {
    std::cerr << "ddprun-store: " << said(e.what()) << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (vm.count("version")) {
    std::cout << "ddprun-store " << DDPRUN_VERSION << "\n";
    return 0;
  }
  // Large buffers (values, queued replies) get their own mappings, returned to the system when
  // freed: glibc would otherwise raise this threshold after the first free of one, and keep
  // freed megabytes in its heap, out of the memory budget's sight.
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  auto logger = spdlog::stderr_color_mt("ddprun-store");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(c.log_level));
  try {
    return serve(c.opts, c.count_requests);
  } catch (const std::exception& e) {
    std::cerr << "ddprun-store: " << said(e.what()) << "\n";
    return ddprun::exit_code_for(e);
  }
}
