// The command line: torchrun's flags, their PET_ fallbacks, what they turn into.
#include <catch2/catch.hpp>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/launcher/cli.hpp"
#include "launcher/parse.hpp"
#include "option_table.hpp"
#include <set>
#include <sys/stat.h>
#include <filesystem>
#include <fstream>

using namespace ddprun;

namespace {

using test::parse;

}  // namespace

TEST_CASE("nproc_per_node accepts a number, cpu, gpu and auto", "[units]") {
  CHECK(parse({"--nproc_per_node=3", "/bin/true"}).agent.nproc_per_node == 3);
  CHECK(parse({"--nproc_per_node", "cpu", "/bin/true"}).agent.nproc_per_node == 6);
  CHECK(parse({"--nproc_per_node=gpu", "/bin/true"}, {}, 8).agent.nproc_per_node == 8);
  CHECK(parse({"--nproc_per_node=auto", "/bin/true"}, {}, 0).agent.nproc_per_node == 6);
  CHECK(parse({"--nproc_per_node=auto", "/bin/true"}, {}, 2).agent.nproc_per_node == 2);
  CHECK_THROWS_WITH(parse({"--nproc_per_node=gpu", "/bin/true"}), Catch::Contains("no GPU found"));
}

TEST_CASE("the program decides how workers are started", "[units]") {
  auto py = parse({"--standalone", "/bin/true", "a"}, {{"PYTHON_EXEC", "true"}});
  CHECK(py.agent.command == std::vector<std::string>{"/bin/true", "a"});
  auto mod = parse({"-m", "pkg.train", "--lr", "1"}, {{"PYTHON_EXEC", "sh"}});
  CHECK(mod.agent.command == std::vector<std::string>{"/usr/bin/sh", "-u", "-m", "pkg.train", "--lr", "1"});
  auto path = parse({"--no_python", "true"});
  CHECK(path.agent.command == std::vector<std::string>{"/usr/bin/true"});
  // options after the program belong to the program
  auto rest = parse({"--nproc_per_node=2", "/bin/true", "--nproc_per_node=5"});
  CHECK(rest.agent.nproc_per_node == 2);
  CHECK(rest.agent.command.back() == "--nproc_per_node=5");
}

TEST_CASE("store placement follows the rendezvous flags", "[units]") {
  auto st = parse({"--master_addr=127.0.0.2", "--master_port=1234", "/bin/true"});
  CHECK(st.agent.rdzv.store_host == "127.0.0.2");
  CHECK(st.agent.rdzv.store_port == 1234);
  auto sa = parse({"--standalone", "/bin/true"});
  CHECK(sa.agent.rdzv.store_host == "127.0.0.1");
  CHECK(sa.agent.rdzv.store_port == 0);
  auto c10d = parse({"--rdzv-backend=c10d", "--rdzv-endpoint=[::1]", "/bin/true"});
  CHECK(c10d.agent.rdzv.store_host == "::1");
  CHECK(c10d.agent.rdzv.store_port == 29400);
  auto multi = parse({"--nnodes=2", "--node_rank=1", "--master_port=1234", "/bin/true"});
  CHECK(multi.agent.rdzv.backend == ddprun::rounds::BackendKind::static_ranks);
    CHECK(multi.agent.rdzv.host_role == ddprun::rounds::HostRole::never);
  CHECK(multi.agent.rdzv.endpoint_port == 1234);
  // What its messages name: the flags, or the variables they were read from.
  CHECK(multi.agent.rdzv.endpoint_host_setting == "--master_addr");
  CHECK(multi.agent.rdzv.endpoint_port_setting == "--master_port");
  auto pet = parse({"--nnodes=2", "--node_rank=1", "/bin/true"}, {{"PET_MASTER_PORT", "1234"}});
  CHECK(pet.agent.rdzv.endpoint_host_setting == "--master_addr");
  CHECK(pet.agent.rdzv.endpoint_port_setting == "PET_MASTER_PORT (read as --master_port)");
  auto pet_c10d = parse({"--nnodes=2", "--rdzv_backend=c10d", "/bin/true"}, {{"PET_RDZV_ENDPOINT", "node0:29400"}});
  CHECK(pet_c10d.agent.rdzv.endpoint_host_setting == "PET_RDZV_ENDPOINT (read as --rdzv_endpoint)");
  CHECK(pet_c10d.agent.rdzv.endpoint_port_setting == pet_c10d.agent.rdzv.endpoint_host_setting);
  auto slurm = parse({"--rdzv_backend=c10d", "/bin/true"},
                     {{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NODEID", "1"},
                      {"SLURM_STEP_NODELIST", "n[1-2]"}});
  CHECK(slurm.agent.rdzv.endpoint_host == "n1");
  CHECK(slurm.agent.rdzv.endpoint_host_setting == "SLURM_STEP_NODELIST (read as --rdzv_endpoint)");
  // Static with --rdzv_endpoint: the store is there, as torchrun's (it ignored the endpoint).
  auto at = parse({"--nnodes=2", "--node_rank=1", "--master_port=1234", "--rdzv_endpoint=127.0.0.3:5555", "/bin/true"});
  CHECK((at.agent.rdzv.endpoint_host == "127.0.0.3" && at.agent.rdzv.endpoint_port == 5555));
  CHECK(at.agent.rdzv.endpoint_host_setting == "--rdzv_endpoint");
  CHECK(at.agent.rdzv.endpoint_port_setting == "--rdzv_endpoint");
  auto elastic = parse({"--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_endpoint=node0",
                        "--rdzv_conf=join_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2,is_host=false", "/bin/true"});
  CHECK(elastic.agent.rdzv.backend == ddprun::rounds::BackendKind::c10d);
  CHECK(elastic.agent.rdzv.min_nodes == 2);
  CHECK(elastic.agent.rdzv.max_nodes == 4);
  CHECK(elastic.agent.rdzv.endpoint_port == 29400);
  CHECK(elastic.agent.rdzv.join_timeout == std::chrono::seconds(5));
  CHECK(elastic.agent.rdzv.keep_alive_max_attempt == 2);
  CHECK(elastic.agent.rdzv.host_role == ddprun::rounds::HostRole::never);
  CHECK_THROWS_WITH(parse({"--nnodes=2:4", "/bin/true"}), Catch::Contains("a range needs --rdzv_backend=c10d"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--node_rank=2", "/bin/true"}), Catch::Contains("must be below --nnodes=2"));
  CHECK_THROWS_WITH(parse({"--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_conf=bogus=1", "/bin/true"}),
                    Catch::Contains("unknown key 'bogus'"));
}

TEST_CASE("every option of the table reads PET_NAME and is validated by the table's parser", "[units]") {
  // Free text by design: names, paths, addresses, accepted-and-ignored compatibility options.
  const std::set<std::string> free_text = {"role", "local_addr", "log_dir", "events_file", "local_ranks_filter",
                                           "logs_specs", "event_log_handler", "master_addr", "rdzv_conf", "log_line_prefix_template",
                                           "duplicate_stdout_filters", "duplicate_stderr_filters"};
  int checked = 0;
  for (const auto& o : launcher::option_table()) {
    if (o.kind != launcher::OptionKind::value || o.parse == nullptr || free_text.count(o.name)) continue;
    std::string pet = launcher::pet_name(o.name);
    CAPTURE(pet);
    CHECK_THROWS_WITH(parse({"/bin/true"}, {{pet, "x y!"}}), Catch::Contains(std::string("--") + o.name));
    ++checked;
  }
  CHECK(checked >= 15);
  // Compatibility options still take only what torchrun takes.
  for (const char* m : {"spawn", "fork", "forkserver"}) CHECK_NOTHROW(parse({std::string("--start_method=") + m, "/bin/true"}));
  for (const char* l : {"trace", "off"}) CHECK(parse({std::string("--log_level=") + l, "/bin/true"}).log_level == l);
  // torchrun 2.x's plug-in flags: accepted (a 2.x command line runs), said to be ignored.
  const auto plugins = parse({"--logs-specs=my.Specs", "--event-log-handler=console", "/bin/true"}).notes;
  CHECK(std::count_if(plugins.begin(), plugins.end(), [](const std::string& n) {
          return n.find("'--logs_specs=my.Specs' names a plug-in") != std::string::npos ||
                 n.find("'--event_log_handler=console' names a handler") != std::string::npos;
        }) == 2);
  CHECK(parse({"--event_log_handler=null", "/bin/true"}).notes.empty());
  // --standalone chooses the store and run id itself (as torchrun does): what it overrides is said.
  const auto overridden = parse({"--standalone", "--master_port=29500", "--rdzv_id=job7", "--rdzv_backend=c10d", "/bin/true"}).notes;
  REQUIRE(overridden.size() == 1);
  CHECK_THAT(overridden[0], Catch::Contains("--standalone puts the store on 127.0.0.1 at a free port") &&
                                Catch::Contains("'--rdzv_id=job7', '--master_port=29500' not used") &&
                                !Catch::Contains("rdzv_backend"));  // c10d is what --standalone uses
  CHECK(parse({"--standalone", "--rdzv_backend=c10d", "/bin/true"}).notes.empty());
  CHECK(parse({"--standalone", "/bin/true"}, {{"PET_MASTER_PORT", "29500"}}).notes.empty());  // set by the platform, not the user
  // An explicit flag wins over PET_, PET_ over the default.
  CHECK(parse({"--max_restarts=2", "/bin/true"}, {{"PET_MAX_RESTARTS", "5"}}).agent.max_restarts == 2);
  CHECK(parse({"/bin/true"}, {{"PET_MAX_RESTARTS", "5"}}).agent.max_restarts == 5);
  CHECK(parse({"/bin/true"}, {{"PET_NO_PYTHON", "1"}, {"PYTHON_EXEC", "false"}}).agent.command[0] == "/bin/true");
}

TEST_CASE("in-memory state: --state_memory takes sizes, and --no_state or 0 turn the state off", "[units]") {
  CHECK(parse({"/bin/true"}).agent.state_memory == -1);  // the default: the agent's quarter of memory
  CHECK(parse({"--state_memory=4G", "/bin/true"}).agent.state_memory == 4LL << 30);
  CHECK(parse({"--state_memory", "1.5GiB", "/bin/true"}).agent.state_memory == 3LL << 29);
  CHECK(parse({"--state_memory=512m", "/bin/true"}).agent.state_memory == 512LL << 20);
  CHECK(parse({"--state_memory=65536", "/bin/true"}).agent.state_memory == 65536);
  CHECK(parse({"--state_memory=0", "/bin/true"}).agent.state_memory == 0);
  CHECK(parse({"--no_state", "--state_memory=4G", "/bin/true"}).agent.state_memory == 0);
  CHECK(parse({"/bin/true"}, {{"PET_STATE_MEMORY", "2T"}}).agent.state_memory == 2LL << 40);
  for (const char* bad : {"4X", "-1G", "G", "4GG", "1e30", "4 G"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(parse({std::string("--state_memory=") + bad, "/bin/true"}), Catch::Contains("--state_memory"));
  }
  // A fraction of a byte (0.5 was 0: the state quietly off), a share no area fits in (16K for two
  // ranks: 8K each), a share no machine has: refused at once, saying what to give.
  CHECK_THROWS_WITH(parse({"--state_memory=0.5", "/bin/true"}), Catch::Contains("whole number of bytes"));
  CHECK_THROWS_WITH(parse({"--nproc_per_node=2", "--state_memory=16K", "/bin/true"}),
                    Catch::Contains("each of the 2 local ranks 8192 bytes") && Catch::Contains("give at least 40K"));
  CHECK_THROWS_WITH(parse({"--state_memory=1e9G", "/bin/true"}), Catch::Contains("more than any machine's memory"));
  CHECK(parse({"--nproc_per_node=2", "--state_memory=40K", "/bin/true"}).agent.state_memory == 40 << 10);
}

TEST_CASE("PET_ values are parsed as strictly as flags (issue 18, case 8)", "[units]") {
  // Numbers: decimal only, whole, in range; no hex, no sign games, no spaces, no trailing junk.
  for (const char* bad : {"0x10", "1e3", " 4", "4 ", "+4", "4.0", "010x", "-1", "99999999999"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(parse({"/bin/true"}, {{"PET_NPROC_PER_NODE", bad}}), Catch::Contains("--nproc_per_node"));
    CHECK_THROWS_WITH(parse({"/bin/true"}, {{"PET_MAX_RESTARTS", bad}}), Catch::Contains("--max_restarts"));
  }
  CHECK(parse({"/bin/true"}, {{"PET_NPROC_PER_NODE", "16"}}).agent.nproc_per_node == 16);
  // A bad value from the environment names the variable it came from.
  CHECK_THROWS_WITH(parse({"/bin/true"}, {{"PET_NPROC_PER_NODE", "0x10"}}), Catch::StartsWith("PET_NPROC_PER_NODE='0x10'"));
  CHECK_THROWS_WITH(parse({"/bin/true"}, {{"PET_HANG_FLOOR", "abc"}}), Catch::StartsWith("PET_HANG_FLOOR='abc'"));
  CHECK_THROWS_WITH(parse({"/bin/true"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "abc"}}),
                    Catch::StartsWith("TORCH_ELASTIC_SHUTDOWN_TIMEOUT='abc'"));
  // Switches: 1/true, 0/false (any case); nothing else (PET_STANDALONE: empty is on).
  for (const char* on : {"1", "true", "TRUE", "True"}) {
    CHECK(parse({"/bin/true"}, {{"PET_MODULE", on}, {"PYTHON_EXEC", "/bin/sh"}}).agent.command[0] == "/bin/sh");
  }
  for (const char* off : {"0", "false", "FALSE"}) {
    CHECK(parse({"/bin/true"}, {{"PET_MODULE", off}, {"PYTHON_EXEC", "/bin/sh"}}).agent.command[0] == "/bin/true");
  }
  for (const char* bad : {"", "yes", "no", "on", "2", "tru", " 1"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(parse({"/bin/true"}, {{"PET_NO_PYTHON", bad}}),
                      Catch::Contains("PET_NO_PYTHON='" + std::string(bad) + "' is not a switch value"));
    if (*bad) CHECK_THROWS_WITH(parse({"/bin/true"}, {{"PET_STANDALONE", bad}}), Catch::Contains("PET_STANDALONE="));
  }
  // PyTorchJob's standalone: set and empty is on.
  CHECK(parse({"/bin/true"}, {{"PET_STANDALONE", ""}}).agent.rdzv.store_port == 0);
}

TEST_CASE("help and completion list every option of the table, in both spellings", "[units]") {
  auto help = parse({"--help"}).text;
  auto completion = parse({"--completion", "bash"}).text;
  for (const auto& o : launcher::option_table()) {
    std::string name = o.name, dashed = name;
    for (auto& c : dashed) c = c == '_' ? '-' : c;
    CHECK_THAT(help, Catch::Contains("--" + name));
    if (name != "completion") {
      CHECK_THAT(completion, Catch::Contains("--" + name));
      CHECK_THAT(completion, Catch::Contains("--" + dashed));
    }
  }
}

TEST_CASE("heartbeat options: auto by default, the start-up bound and the progress hook", "[units]") {
  auto a = parse({"/bin/true"});
  CHECK(a.agent.worker_timeout_auto);
  CHECK(a.agent.worker_start_timeout.count() == 0);  // auto: however long the first step takes
  CHECK(a.agent.hang_floor == std::chrono::seconds(30));
  CHECK(a.agent.hang_stop == std::chrono::seconds(120));
  CHECK_FALSE(parse({"--worker_timeout=0", "/bin/true"}).agent.worker_timeout_auto);
  CHECK(parse({"--worker_timeout=0", "/bin/true"}).agent.worker_timeout.count() == 0);
  auto d = parse({"--worker_timeout=5", "/bin/true"});
  CHECK_FALSE(d.agent.worker_timeout_auto);
  CHECK(d.agent.worker_timeout == std::chrono::seconds(5));
  CHECK(d.agent.worker_start_timeout == std::chrono::seconds(1800));
  CHECK(parse({"--worker_start_timeout=0", "/bin/true"}).agent.worker_start_timeout.count() == 0);
  CHECK(parse({"--worker_start_timeout=60", "/bin/true"}).agent.worker_start_timeout == std::chrono::seconds(60));
  // Under a millisecond would round to 0 ("off", or "at once"); hex is not a decimal number.
  CHECK_THROWS_WITH(parse({"--worker_timeout=0.0004", "/bin/true"}), Catch::Contains("under a millisecond"));
  CHECK_THROWS_WITH(parse({"--stop_timeout=0.0001", "/bin/true"}), Catch::Contains("under a millisecond"));
  CHECK_THROWS_WITH(parse({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400", "--rdzv_conf=join_timeout=0.0001", "/bin/true"}), Catch::Contains("under a millisecond"));
  CHECK_THROWS_WITH(parse({"--worker_timeout=0x10", "/bin/true"}), Catch::Contains("--worker_timeout"));
  CHECK(parse({"--worker_timeout=0.001", "/bin/true"}).agent.worker_timeout == std::chrono::milliseconds(1));
  // --hang_floor and --hang_stop shape the auto rule: given beside a fixed bound, said unused.
  auto fixed = parse({"--worker_timeout=5", "--hang_stop=10", "/bin/true"});
  CHECK(std::any_of(fixed.notes.begin(), fixed.notes.end(), [](const std::string& n) {
    return n.find("--hang_stop applies to --worker_timeout=auto only") != std::string::npos;
  }));
  CHECK(parse({"--hang_stop=10", "/bin/true"}).notes.empty());
  // This test binary sits in the build tree beside share/ddprun/python, as ddprun does.
  CHECK_FALSE(d.agent.python_site_dir.empty());
  CHECK(parse({"--no_progress_hook", "/bin/true"}).agent.python_site_dir.empty());
  CHECK(parse({"/bin/true"}, {{"PET_NO_PROGRESS_HOOK", "1"}}).agent.python_site_dir.empty());
}

// The command line is read against the option table (launcher/src/arguments.cpp), with the
// errors Boost.Program_options gave before it was dropped.
TEST_CASE("options: both spellings, values inline or next, short options, and the errors", "[units]") {
  CHECK(parse({"--nproc-per-node", "4", "/bin/true"}).agent.nproc_per_node == 4);
  CHECK(parse({"--max-restarts=3", "/bin/true"}).agent.max_restarts == 3);
  CHECK(parse({"-r3", "/bin/true"}).agent.redirects.any());
  CHECK(parse({"-r", "3", "/bin/true"}).agent.redirects.any());
  CHECK(parse({"--redirects=0:1,1:2", "/bin/true"}).agent.redirects.for_rank(1) == 2);
  CHECK_THROWS_WITH(parse({"--redirects=0:1,0:2", "/bin/true"}), Catch::Contains("--redirects='0:1,0:2' gives local rank 0 twice"));
  CHECK(parse({"--", "/bin/true", "--max_restarts=9"}).agent.command.back() == "--max_restarts=9");
  // --name= is the empty value, judged by the option's own parser (argparse's reading)
  CHECK(parse({"--local_ranks_filter=", "/bin/true"}).agent.command.back() == "/bin/true");
  CHECK_THROWS_WITH(parse({"--max_restarts=", "/bin/true"}), Catch::Contains("--max_restarts must be a non-negative integer (got '')"));
  CHECK(parse({"-m", "pkg", "-m"}, {{"PYTHON_EXEC", "sh"}}).agent.command.back() == "-m");  // the program's
  CHECK_THROWS_WITH(parse({"--max_restarts=1", "--max_restarts", "2", "/bin/true"}),
                    Catch::Contains("option '--max_restarts' cannot be specified more than once"));
  CHECK_THROWS_WITH(parse({"--standalone", "--standalone", "/bin/true"}),
                    Catch::Contains("option '--standalone' cannot be specified more than once"));
  CHECK_THROWS_WITH(parse({"--standalone=1", "/bin/true"}),
                    Catch::Contains("option '--standalone' does not take any arguments"));
  CHECK_THROWS_WITH(parse({"-mx"}), Catch::Contains("unrecognised option '-mx'"));
  auto sticky = parse({"-mr3", "pkg"}, {{"PYTHON_EXEC", "sh"}});  // -m, then -r 3 (as argparse)
  CHECK(sticky.agent.redirects.any());
  CHECK(sticky.agent.command == std::vector<std::string>{"/usr/bin/sh", "-u", "-m", "pkg"});
  CHECK_THROWS_WITH(parse({"-mm", "pkg"}), Catch::Contains("option '--module' cannot be specified more than once"));
  CHECK_THROWS_WITH(parse({"--nproc", "2", "/bin/true"}), Catch::Contains("unknown option '--nproc'"));  // no prefixes
  CHECK_THROWS_WITH(parse({"-x", "/bin/true"}), Catch::Contains("unknown option '-x'"));
  CHECK_THROWS_WITH(parse({"--max_restarts"}), Catch::Contains("option '--max_restarts' needs a value"));
}

TEST_CASE("options: --help lists every option of the table, its value and default, in columns", "[units]") {
  auto r = parse({"--help"});
  REQUIRE(r.exit_now);
  for (const auto& o : launcher::option_table()) {
    CHECK_THAT(r.text, Catch::Contains(std::string("--") + o.name));
  }
  CHECK_THAT(r.text, Catch::Contains("\n  --nproc_per_node arg (=1)             workers on this node"));
  CHECK_THAT(r.text, Catch::Contains("\n  -m [ --module ]                       run the program as a Python module"));
  CHECK_THAT(r.text, Catch::Contains("\nWorker group:\n"));
  for (const auto& line : split(r.text.substr(r.text.find("ddprun options:")), '\n')) {
    INFO(line);
    CHECK((line.size() <= 80 || line.find(' ', 42) == std::string::npos));  // a single long word may overflow
  }
}

TEST_CASE("error messages quote at most 60 characters of a long value, and leave the rest of the text whole", "[units]") {
  using ddprun::shorten_quoted;
  const std::string huge(100000, 'x'), path = "/a/b/" + std::string(1000, 'p');
  CHECK(shorten_quoted("--x must be a number (got '" + huge + "')") ==
        "--x must be a number (got '" + std::string(60, 'x') + "... (100000 bytes)')");
  CHECK(shorten_quoted("run chmod 600 '" + path + "'") == "run chmod 600 '" + path + "'");  // up to 1 KiB: whole
  // Apostrophes are no quotes: the prose between them stays, the value after them is cut.
  const std::string prose = "this node's lease " + std::string(300, '.') + " the worker's value is '" + huge + "'";
  CHECK(shorten_quoted(prose) == "this node's lease " + std::string(300, '.') + " the worker's value is '" +
                                     std::string(60, 'x') + "... (100000 bytes)'");
  // Unbalanced quotes: the message cut at 4 KiB all the same.
  const auto odd = shorten_quoted("it is '" + huge);
  CHECK(odd.size() < 4096);
  CHECK_THAT(odd, Catch::EndsWith("(the message cut: 100007 bytes)"));
}

// Issue 33: names DNS cannot hold go no further than the command line.
TEST_CASE("host names over 253 characters, with a label over 63 or a character no name has are usage errors", "[units]") {
  const std::string huge(100000, 'a');
  CHECK_THROWS_AS(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=" + huge + ":29400", "/bin/true"}),
                  ddprun::UsageError);
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=" + huge + ":29400", "/bin/true"}),
                    Catch::Contains("100000 characters, over DNS's 253"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--master_addr=" + std::string(64, 'b') + ".example", "/bin/true"}),
                    Catch::Contains("64 characters, over DNS's 63"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--local_addr=a..b", "/bin/true"}), Catch::Contains("empty label"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400,127.0.0.2:29400", "/bin/true"}),
                    Catch::Contains("take one endpoint"));
  // A character no host name has (it reached the workers as MASTER_ADDR='a b').
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--local_addr=a b", "/bin/true"}), Catch::Contains("holds ' '"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--local_addr=x/y", "/bin/true"}), Catch::Contains("holds '/'"));
  CHECK(parse({"--nnodes=2", "--local_addr=node_3.example-1", "/bin/true"}).agent.rdzv.local_addr == "node_3.example-1");
  // Digits and dots that are no IPv4 address never resolve (no name's last label is all digits):
  // refused, not waited for as a name Kubernetes has yet to create. getaddrinfo's short forms pass.
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=256.1.1.1:29400", "/bin/true"}),
                    Catch::Contains("not an IPv4 address"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--local_addr=10.0.0.1.2", "/bin/true"}), Catch::Contains("not an IPv4 address"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--local_addr=10.0.0.1.", "/bin/true"}), Catch::Contains("not an IPv4 address"));
  CHECK(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.1:29400", "/bin/true"}).agent.rdzv.endpoint_host ==
        "127.1");
  CHECK(parse({"--nnodes=2", "--local_addr=10.0.0.1", "/bin/true"}).agent.rdzv.local_addr == "10.0.0.1");
  CHECK(parse({"--nnodes=2", "--local_addr=fe80::1%eth0", "/bin/true"}).agent.rdzv.local_addr == "fe80::1%eth0");
  CHECK(parse({"--monitor_interval=0.0001", "/bin/true"}).agent.nproc_per_node == 1);  // torchrun's, unused
  // At the limits, and addresses, pass.
  std::string longest;
  for (int i = 0; i < 4; ++i) longest += std::string(i < 3 ? 63 : 61, 'c') + (i < 3 ? "." : "");
  REQUIRE(longest.size() == 253);
  CHECK(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=" + longest + ":1", "/bin/true"})
            .agent.rdzv.endpoint_host == longest);
  CHECK(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=[fd00::1]:29400", "/bin/true"})
            .agent.rdzv.endpoint_host == "fd00::1");
}

TEST_CASE("launcher: --nnodes=1 with --rdzv_backend=etcd or c10d uses that backend, as torchrun does", "[units]") {
  // (TLS settings with one node: tests/e2e/inputs_e2e_test.cpp, which has a CA to give.)
  auto etcd = parse({"--nnodes=1", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:2379",
                     "--rdzv_conf=lease_ttl=2", "/bin/true"});
  CHECK(etcd.agent.rdzv.backend == rounds::BackendKind::etcd);
  CHECK(etcd.agent.rdzv.lease_ttl == std::chrono::seconds(2));
  auto c10d = parse({"--nnodes=1", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "/bin/true"});
  CHECK(c10d.agent.rdzv.backend == rounds::BackendKind::c10d);
  CHECK(parse({"--nnodes=1", "/bin/true"}).agent.rdzv.backend == rounds::BackendKind::single_node);
  // The static one-node job has no settings; the message names it, not c10d.
  CHECK_THROWS_WITH(parse({"--nnodes=1", "--rdzv_conf=join_timeout=5", "/bin/true"}),
                    Catch::Contains("c10d or etcd") && Catch::Contains("static rendezvous"));
}

TEST_CASE("rdzv_conf: a key of the other backend, or one given twice, is refused saying what to use", "[units]") {
  auto c10d = [](const std::string& conf) {
    return parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_conf=" + conf, "/bin/true"});
  };
  auto etcd = [](const std::string& conf) {
    return parse({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:2379", "--rdzv_conf=" + conf, "/bin/true"});
  };
  CHECK_THROWS_WITH(c10d("password=x"), Catch::Contains("applies to --rdzv_backend=etcd") && Catch::Contains("secret_file"));
  CHECK_THROWS_WITH(c10d("lease_ttl=2"), Catch::Contains("applies to --rdzv_backend=etcd") && Catch::Contains("keep_alive_interval"));
  CHECK_THROWS_WITH(c10d("prefix=/x"), Catch::Contains("prefix applies to --rdzv_backend=etcd"));
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--node_rank=1", "--master_addr=h", "--rdzv_conf=protocol=https", "/bin/true"}),
                    Catch::Contains("protocol applies to --rdzv_backend=etcd"));
  CHECK_THROWS_WITH(etcd("is_host=1"), Catch::Contains("is_host applies to the c10d store") && Catch::Contains("no node hosts"));
  CHECK_THROWS_WITH(etcd("keep_alive_interval=1"), Catch::Contains("lease_ttl"));
  CHECK_THROWS_WITH(c10d("join_timeout=5,join_timeout=6"), Catch::Contains("join_timeout is given twice ('5' and '6')"));
  CHECK_THROWS_WITH(c10d("timeout=5,join_timeout=6"), Catch::Contains("one setting"));
  // From PET_RDZV_CONF (a Kubeflow pod): the variable is named.
  CHECK_THROWS_WITH(parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "/bin/true"},
                          {{"PET_RDZV_CONF", "lease_ttl=5"}}),
                    Catch::Contains("PET_RDZV_CONF (read as --rdzv_conf): --rdzv_conf lease_ttl applies to"));
  // Each backend's own keys still pass.
  CHECK(c10d("is_host=0,keep_alive_interval=1,read_timeout=9").agent.rdzv.keep_alive_interval == std::chrono::seconds(1));
  CHECK(etcd("lease_ttl=3,prefix=/p,user=u").agent.rdzv.lease_ttl == std::chrono::seconds(3));
}

TEST_CASE("the etcd password from a private file or DDPRUN_ETCD_PASSWORD, not only the command line", "[units]") {
  char dir[] = "/tmp/ddprun-pw-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string file = std::string(dir) + "/pw";
  {
    std::ofstream(file) << "s3cret\n";
  }
  ::chmod(file.c_str(), 0600);
  const std::vector<std::string> etcd = {"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:2379"};
  auto with = [&](const std::string& conf) {
    auto a = etcd;
    a.push_back("--rdzv_conf=user=root," + conf);
    a.push_back("/bin/true");
    return a;
  };
  CHECK(parse(with("password_file=" + file)).agent.rdzv.etcd_password == "s3cret");
  auto args = etcd;
  args.push_back("/bin/true");
  CHECK(parse(args, {{"DDPRUN_ETCD_PASSWORD", "fromenv"}}).agent.rdzv.etcd_password == "fromenv");
  CHECK_THROWS_WITH(parse(with("password=x,password_file=" + file)), Catch::Contains("given more than once"));
  ::chmod(file.c_str(), 0644);
  CHECK_THROWS_WITH(parse(with("password_file=" + file)),
                    Catch::Contains("the etcd password file") && Catch::Contains("mode 0644") && Catch::Contains("chmod 600"));
  CHECK_THROWS_WITH(parse(with("password_file=" + std::string(dir) + "/none")), Catch::Contains("cannot open the etcd password file"));
  std::filesystem::remove_all(dir);
}
