// ddprun-store: a standalone rendezvous store, for dedicated rendezvous hosts, tests and
// benchmarks. Prints "listening on HOST:PORT" as its first line, serves until SIGINT/SIGTERM.

#include <csignal>
#include <cstdio>
#include <iostream>

#include <boost/program_options.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ddprun/rendezvous/error.hpp"
#include "ddprun/rendezvous/store_server.hpp"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  ddprun::rendezvous::StoreServerOptions opts;
  int port = 0;
  std::string log_level;
  po::options_description desc(
      "Usage: ddprun-store [--host H] [--port P]\n"
      "Serves a PyTorch-compatible TCPStore (1.13 and 2.x clients) until SIGINT or SIGTERM.\n\nOptions");
  desc.add_options()
      ("help,h", "show this help")
      ("host", po::value(&opts.host)->default_value(""), "address to bind (default: every interface, IPv6 and IPv4)")
      ("port", po::value(&port)->default_value(0), "port to bind; 0 picks a free one (printed on the first line)")
      ("max_key_bytes", po::value(&opts.limits.max_key_bytes)->default_value(opts.limits.max_key_bytes),
       "longest key accepted; longer closes the connection")
      ("max_value_bytes", po::value(&opts.limits.max_value_bytes)->default_value(opts.limits.max_value_bytes),
       "longest value accepted")
      ("max_pending_output_bytes",
       po::value(&opts.max_pending_output_bytes)->default_value(opts.max_pending_output_bytes),
       "replies queued for a client that does not read them before it is disconnected")
      ("log_level", po::value(&log_level)->default_value("info"), "trace, debug, info, warn, error or off");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "ddprun-store: " << e.what() << "\n(see ddprun-store --help)\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (port < 0 || port > 65535) {
    std::cerr << "ddprun-store: --port " << port << " is out of range (0-65535; 0 picks a free port)\n";
    return 2;
  }
  opts.port = static_cast<std::uint16_t>(port);
  auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    std::cerr << "ddprun-store: unknown --log_level '" << log_level << "'\n";
    return 2;
  }
  auto logger = spdlog::stderr_color_mt("ddprun-store");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(level);

  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  try {
    ddprun::rendezvous::StoreServer server(opts);
    const auto& host = server.host();
    std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    std::printf("listening on %s:%u\n", shown.c_str(), server.port());
    std::fflush(stdout);
    server.start();
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("store: stopping on signal {}", sig);
    server.stop();
  } catch (const ddprun::Error& e) {
    std::cerr << "ddprun-store: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
