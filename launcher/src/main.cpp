// ddprun: torchrun's command line over ddprun's agent. Thin: parse, run, map errors to exit codes
// (2 for usage errors, 1 for failures to run, otherwise the job's own code).

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ddprun/agent/agent.hpp"
#include "ddprun/agent/guardian_main.hpp"
#include "ddprun/launcher/cli.hpp"
#include "ddprun/launcher/full_program.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "option_table.hpp"

namespace {

// What a parent left in the signal state, undone before anything else (README: Security). The
// mask survives exec: a parent that blocked SIGCHLD left the workers' deaths unseen (zombies, a
// job that never ended), one that blocked SIGTERM or SIGINT left ddprun deaf to them. A signal
// ddprun acts on that the parent set to SIG_IGN goes back to SIG_DFL until the agent's loop
// installs its handler (a non-interactive shell's `ddprun &` ignores SIGINT and SIGQUIT). The
// workers get an empty mask and default dispositions of their own (spawn.cpp).
void reset_inherited_signals() {
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  auto restore = [](int sig) {
    struct sigaction now{};
    if (::sigaction(sig, nullptr, &now) != 0 || (now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_IGN) return;
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(sig, &dfl, nullptr);
  };
  restore(SIGCHLD);
  for (int sig : ddprun::stop_signals()) restore(sig);
}

// Descriptors 0-2 open, on /dev/null where they were closed (`ddprun ... <&- >&-`, as some
// daemons start programs): a descriptor the agent opens must not take their numbers, which its
// guardian points at /dev/null (a pipe there read as the agent's death) and its workers inherit.
void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int null = ::open("/dev/null", O_RDWR);  // the lowest number free: this one
    if (null > 2) ::close(null);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The agent's guardian is this program started again (guardian_main.hpp): it sets its own
  // signals up.
  if (ddprun::agent::is_guardian_start(argc, argv)) ddprun::agent::guardian_main(argc, argv);
  reset_inherited_signals();
  open_standard_descriptors();
  // ddprun hands some jobs to ddprun-full by exec (full_program.hpp), which keeps ddprun's name.
  [[maybe_unused]] const bool handed_off = ddprun::launcher::take_handoff_mark();
#if DDPRUN_FULL_PROGRAM
  if (handed_off) ddprun::launcher::keep_launcher_name(argv[0]);
#endif
  const auto env = ddprun::environment_map();
  ddprun::launcher::CliResult cli;
  try {
    cli = ddprun::launcher::parse_command_line(std::vector<std::string>(argv + 1, argv + argc), env,
                                               ddprun::launcher::probe_host());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", ddprun::shorten_quoted(e.what()).c_str());
    return 2;  // whatever went wrong, it came from the command line or the environment
  }
  if (cli.exit_now) {
    std::fputs(cli.text.c_str(), stdout);
    return 0;
  }
#if DDPRUN_WITHOUT_OPENSSL
  if (auto use = ddprun::launcher::openssl_use(cli.agent)) {
    if (handed_off) {  // (not an endless loop of execs)
      std::fprintf(stderr, "ddprun: error: this job uses %s, and the ddprun-full beside ddprun is not ddprun "
                           "built with OpenSSL: install ddprun whole again (or, if you set DDPRUN_HANDED_OFF "
                           "yourself, unset it)\n", use->c_str());
      return 1;
    }
    ddprun::launcher::exec_full_program(argv, *use);  // returns only when it could not
    return 1;
  }
#endif
  auto logger = spdlog::stderr_logger_st("ddprun");
  logger->set_pattern("%v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(cli.log_level));
  for (const auto& note : cli.notes) spdlog::info("{}", ddprun::shorten_quoted(note));
  std::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the launcher; workers get the default back
  std::signal(SIGXFSZ, SIG_IGN);  // a log over RLIMIT_FSIZE: EFBIG, counted as bytes lost
  try {
    ddprun::agent::Agent agent(std::move(cli.agent));
    return agent.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", ddprun::shorten_quoted(e.what()).c_str());
    return ddprun::exit_code_for(e);
  }
}
