#include "cli/cli.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpurun/error.hpp"

using gpurun::UsageError;
using namespace gpurun::supervisor;

namespace {
Options p(std::vector<std::string> args) {
  return parse(args);
}

std::string error_of(std::vector<std::string> args) {
  try {
    parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST_CASE("cli: defaults") {
  Options o = p({"./train"});
  CHECK(o.nproc_mode == NprocMode::kCount);
  CHECK(o.nproc == 1);
  CHECK(o.nnodes == 1);
  CHECK(o.node_rank == 0);
  CHECK(o.master_addr == "127.0.0.1");
  CHECK(o.master_port == 29500);
  CHECK_FALSE(o.standalone);
  CHECK(o.max_restarts == 0);
  CHECK(o.grace_period == std::chrono::seconds(30));
  CHECK_FALSE(o.log_dir);
  CHECK_FALSE(o.redirects.any());
  CHECK_FALSE(o.tee.any());
  CHECK_FALSE(o.ranks_filter);
  CHECK(o.run_id == "none");
  CHECK(o.device == Device::kCuda);
  CHECK(o.log_line_prefix_template == "[rank${rank}]: ");
  CHECK(o.command == std::vector<std::string>{"./train"});
}

TEST_CASE("cli: valid command lines") {
  SUBCASE("space and equals forms, dash and underscore spellings") {
    Options a = p({"--nproc", "4", "x"});
    Options b = p({"--nproc=4", "x"});
    Options c = p({"--nproc_per_node", "4", "x"});
    Options d = p({"--nproc-per-node=4", "x"});
    for (const Options* o : {&a, &b, &c, &d}) CHECK(o->nproc == 4);
  }
  SUBCASE("symbolic nproc") {
    CHECK(p({"--nproc", "auto", "x"}).nproc_mode == NprocMode::kAuto);
    CHECK(p({"--nproc", "gpu", "x"}).nproc_mode == NprocMode::kGpu);
    CHECK(p({"--nproc", "cpu", "x"}).nproc_mode == NprocMode::kCpu);
  }
  SUBCASE("every flag") {
    Options o = p({"--nnodes=2",
                   "--node_rank",
                   "1",
                   "--master-addr",
                   "10.0.0.1",
                   "--master_port",
                   "29400",
                   "--max-restarts",
                   "3",
                   "--grace-period",
                   "0.5",
                   "--log-dir",
                   "/tmp/l",
                   "--redirects",
                   "3",
                   "--nproc",
                   "2",
                   "--tee",
                   "0:1,1:2",
                   "--ranks-filter",
                   "0, 3",
                   "--rdzv-id",
                   "job1",
                   "--config",
                   "c.toml",
                   "--event-log",
                   "ev.jsonl",
                   "--device",
                   "cpu",
                   "--log_line_prefix_template",
                   "<${local_rank}> ",
                   "--",
                   "./train",
                   "--lr",
                   "1"});
    CHECK(o.nnodes == 2);
    CHECK(o.node_rank == 1);
    CHECK(o.master_addr == "10.0.0.1");
    CHECK(o.master_port == 29400);
    CHECK(o.max_restarts == 3);
    CHECK(o.grace_period == std::chrono::milliseconds(500));
    CHECK(*o.log_dir == "/tmp/l");
    CHECK(o.redirects.all == 3);
    CHECK(o.tee.for_local_rank(0) == 1);
    CHECK(o.tee.for_local_rank(1) == 2);
    CHECK(o.tee.for_local_rank(2) == 0);
    CHECK(*o.ranks_filter == std::set<int>{0, 3});
    CHECK(o.run_id == "job1");
    CHECK(o.run_id_given);
    CHECK(*o.config == "c.toml");
    CHECK(*o.event_log == "ev.jsonl");
    CHECK(o.device == Device::kCpu);
    CHECK(o.log_line_prefix_template == "<${local_rank}> ");
    CHECK(o.command == std::vector<std::string>{"./train", "--lr", "1"});
  }
  SUBCASE("worker flags after the command are the worker's") {
    Options o = p({"--nproc", "2", "python3", "train.py", "--nproc", "9"});
    CHECK(o.nproc == 2);
    CHECK(o.command == std::vector<std::string>{"python3", "train.py", "--nproc", "9"});
  }
  SUBCASE("module, standalone, static N:N") {
    Options o = p({"--standalone", "-m", "pkg.train", "--epochs", "1"});
    CHECK(o.standalone);
    CHECK(o.module);
    CHECK(o.command.front() == "pkg.train");
    CHECK(p({"--nnodes", "3:3", "--node-rank", "2", "x"}).nnodes == 3);
    CHECK(p({"--no-python", "x.py"}).no_python);
  }
  SUBCASE("help and version need no command") {
    CHECK(p({"--help"}).help);
    CHECK(p({"-h"}).help);
    CHECK(p({"--version"}).version);
  }
}

TEST_CASE("cli: invalid command lines give exact messages") {
  struct Row {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Row> rows = {
      {{"--bogus", "x"}, "unknown flag '--bogus' (see gpurun --help)"},
      {{"-x", "x"}, "unknown flag '-x' (see gpurun --help)"},
      {{"--nproc", "zero", "x"},
       "invalid value 'zero' for --nproc: expected a positive integer, auto, gpu or cpu"},
      {{"--nproc", "0", "x"},
       "invalid value '0' for --nproc: expected a positive integer, auto, gpu or cpu"},
      {{"--nproc=", "x"},
       "invalid value '' for --nproc: expected a positive integer, auto, gpu or cpu"},
      {{"--nproc"}, "flag --nproc needs a value"},
      {{"--master-port", "70000", "x"},
       "invalid value '70000' for --master-port: expected a port number 0-65535"},
      {{"--master_port", "-1", "x"},
       "invalid value '-1' for --master-port: expected a port number 0-65535"},
      {{"--grace-period", "soon", "x"},
       "invalid value 'soon' for --grace-period: expected a number of seconds between 0 and 86400"},
      {{"--max-restarts", "2.5", "x"},
       "invalid value '2.5' for --max-restarts: expected a non-negative integer"},
      {{"--redirects", "4", "x"},
       "invalid value '4' for --redirects: expected 0-3 or a per-local-rank map like 0:1,1:2"},
      {{"--tee", "0:1,1", "x"},
       "invalid value '0:1,1' for --tee: expected 0-3 or a per-local-rank map like 0:1,1:2"},
      {{"--ranks-filter", "0,a", "x"},
       "invalid value '0,a' for --ranks-filter: piece 2 ('a') is not a rank (an integer >= 0); "
       "expected a comma-separated list of ranks like 0,3"},
      {{"--device", "tpu", "x"}, "invalid value 'tpu' for --device: expected cuda or cpu"},
      {{"--nnodes", "1:4", "x"},
       "--nnodes 1:4: a node range needs --rdzv-backend c10d (a static rendezvous has a fixed "
       "node count) or --config (an elastic job)"},
      {{"--nnodes", "2:", "x"},
       "invalid value '2:' for --nnodes: expected a positive integer N or a range MIN:MAX"},
      {{"--nnodes", "3:2", "x"},
       "invalid value '3:2' for --nnodes: the maximum 2 is below the minimum 3"},
      {{"--node-rank", "2", "--nnodes", "2", "x"},
       "invalid value '2' for --node-rank: must be below --nnodes 2"},
      {{"--standalone=1", "x"}, "flag --standalone takes no value, got '1'"},
      {{"--nproc", "2"},
       "missing worker command, e.g. gpurun --nproc 2 ./train (see gpurun --help)"},
      {{"--nproc", "2", "--"},
       "missing worker command, e.g. gpurun --nproc 2 ./train (see gpurun --help)"},
      {{"--standalone", "--nnodes", "2", "x"},
       "--standalone runs a single node, but --nnodes is 2"},
      {{"--nnodes", "2", "--node-rank", "1", "--master-port", "0", "x"},
       "--master-port 0 cannot be used on a node with --node-rank > 0: give the port that node 0 "
       "listens on"},
      {{"-m", "--no-python", "x"}, "--module and --no-python cannot be combined"},
  };
  for (const auto& row : rows) {
    CAPTURE(row.args);
    CHECK(error_of(row.args) == row.message);
  }
}

TEST_CASE("cli: help text has examples and every flag") {
  const std::string h = help_text();
  for (const char* flag :
       {"--nproc", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--standalone",
        "--max-restarts", "--grace-period", "--log-dir", "--redirects", "--tee", "--ranks-filter",
        "--run-id", "--config", "--event-log", "--device", "--version", "Examples:"}) {
    CAPTURE(flag);
    CHECK(h.find(flag) != std::string::npos);
  }
  CHECK(version_text().rfind("gpurun ", 0) == 0);
  // `gpurun status`'s usage as `gpurun status --help` prints it (control/status.cpp).
  CHECK(h.find("gpurun status [--json] [--run-id ID] [--pid PID | --run-dir DIR]") !=
        std::string::npos);
}

TEST_CASE("cli: run ids that would escape --log-dir are refused") {
  for (const std::string bad : {"../../escaped", "a/b", "/abs", ".", "..", "...", "x\ny"}) {
    CAPTURE(bad);
    const std::string err = error_of({"--run-id", bad, "x"});
    CHECK(err.rfind("invalid value '", 0) == 0);
    CHECK(err.find("for --run-id: a run id") != std::string::npos);
  }
  CHECK(error_of({"--run-id", "../x", "x"}) ==
        "invalid value '../x' for --run-id: a run id names a directory under --log-dir and "
        "cannot contain '/'");
  CHECK(error_of({"--rdzv-id", std::string("a\x01", 2), "x"}) ==
        "invalid value 'a\\x01' for --rdzv-id: a run id cannot contain NUL or other control "
        "characters");
  CHECK(error_of({"--run-id", std::string("a\0b", 3), "x"}).find("control characters") !=
        std::string::npos);
  CHECK(p({"--run-id", "job-1.2_x..y", "x"}).run_id == "job-1.2_x..y");
}

TEST_CASE("cli: integers beyond the range say too large") {
  CHECK(error_of({"--max-restarts", "99999999999", "x"}) ==
        "invalid value '99999999999' for --max-restarts: too large (at most 2147483647)");
  CHECK(error_of({"--nproc", "99999999999999999999999", "x"}) ==
        "invalid value '99999999999999999999999' for --nproc: too large (at most 1048576)");
  CHECK(error_of({"--max-restarts", "-1", "x"}) ==
        "invalid value '-1' for --max-restarts: expected a non-negative integer");
  CHECK(p({"--max-restarts", "2147483647", "x"}).max_restarts == 2147483647);
}

TEST_CASE("cli: --standalone picks its own port") {
  CHECK(error_of({"--standalone", "--master-port", "1234", "x"}) ==
        "--standalone picks a free port itself and cannot be combined with --master-port 1234; "
        "drop one of them");
  CHECK(p({"--standalone", "--master-port", "0", "x"}).standalone);
  CHECK(p({"--standalone", "x"}).standalone);
  CHECK_FALSE(p({"x"}).master_port_given);
}

TEST_CASE("cli: --ranks-filter names an empty piece") {
  CHECK(error_of({"--ranks-filter", "1,,x", "x"}) ==
        "invalid value '1,,x' for --ranks-filter: piece 2 is empty; expected a comma-separated "
        "list of ranks like 0,3");
  CHECK(error_of({"--ranks-filter", "1,", "x"}) ==
        "invalid value '1,' for --ranks-filter: piece 2 is empty; expected a comma-separated "
        "list of ranks like 0,3");
  CHECK(error_of({"--ranks-filter", "", "x"}) ==
        "invalid value '' for --ranks-filter: piece 1 is empty; expected a comma-separated "
        "list of ranks like 0,3");
}

TEST_CASE("cli: --redirects/--tee maps refuse a local rank given twice or out of range") {
  CHECK(error_of({"--nproc", "2", "--redirects", "0:1,0:2", "x"}) ==
        "invalid value '0:1,0:2' for --redirects: local rank 0 is given twice (pieces 1 and 2)");
  CHECK(error_of({"--nproc", "4", "--tee", "1:1, 2:3 ,1:2", "x"}) ==
        "invalid value '1:1, 2:3 ,1:2' for --tee: local rank 1 is given twice (pieces 1 and 3)");
  CHECK(error_of({"--redirects", "5:1", "--nproc", "2", "x"}) ==
        "invalid value '5:1' for --redirects: piece 1 ('5:1') names local rank 5, but --nproc 2 "
        "has local ranks 0-1");
  CHECK(error_of({"--tee", "0:3,1:1", "x"}) ==
        "invalid value '0:3,1:1' for --tee: piece 2 ('1:1') names local rank 1, but --nproc 1 "
        "has only local rank 0");
  CHECK(error_of({"--redirects", "0:1,,1:2", "--nproc", "2", "x"}) ==
        "invalid value '0:1,,1:2' for --redirects: piece 2 is empty");
  // In range: accepted. With --nproc gpu|cpu|auto the count is known only later (main checks).
  CHECK(p({"--nproc", "2", "--redirects", "1:3", "x"}).redirects.for_local_rank(1) == 3);
  CHECK(p({"--nproc", "cpu", "--redirects", "7:3", "x"}).redirects.for_local_rank(7) == 3);
  // Elastic mode on GPUs: every visible GPU is a slot, --nproc only picks how many start.
  CHECK(p({"--config", "c.toml", "--nproc", "1", "--tee", "3:1", "x"}).tee.for_local_rank(3) == 1);
}

TEST_CASE("cli: check_master_addr takes literals and names, refuses what cannot resolve") {
  using R = AddressCheck::Result;
  for (const std::string ok : {"127.0.0.1", "10.1.2.3", "::1", "[::1]", "fe80::1", "localhost"}) {
    CAPTURE(ok);
    const AddressCheck c = check_master_addr(ok);
    CHECK(c.result == R::kOk);
    CHECK(c.reason.empty());
  }
  for (const std::string bad : {"nosuchhost.invalid", "NoSuchHost.INVALID.", "invalid"}) {
    CAPTURE(bad);
    const AddressCheck c = check_master_addr(bad);
    CHECK(c.result == R::kUnresolvable);
    CHECK(c.reason == "Name or service not known");
  }
  for (const std::string bad : {"[127.0.0.1]", "[node0]", "node[0]"}) {
    CAPTURE(bad);
    const AddressCheck c = check_master_addr(bad);
    CHECK(c.result == R::kUnresolvable);
    CHECK(c.reason == "brackets enclose only an IPv6 address, e.g. [::1]");
  }
  CHECK(p({"--master-addr", "node0", "x"}).master_addr_given);
  CHECK_FALSE(p({"x"}).master_addr_given);
}

TEST_CASE("cli: --store-memory-budget takes bytes with binary suffixes, 0, and refuses < 16 MiB") {
  CHECK_FALSE(p({"./train"}).store_memory_budget.has_value());
  CHECK(*p({"--store-memory-budget", "2GiB", "./train"}).store_memory_budget == (2ULL << 30));
  CHECK(*p({"--store-memory-budget=64M", "./train"}).store_memory_budget == (64ULL << 20));
  CHECK(*p({"--store-memory-budget", "0", "./train"}).store_memory_budget == 0);
  CHECK(*p({"--store-memory-budget", "33554432", "./train"}).store_memory_budget == (32ULL << 20));
  CHECK(error_of({"--store-memory-budget", "1MiB", "./train"})
            .find("1048576 bytes is under the 16 MiB minimum") != std::string::npos);
  CHECK(error_of({"--store-memory-budget", "4TB", "./train"})
            .find("invalid value '4TB' for --store-memory-budget: expected a size in bytes") !=
        std::string::npos);
  CHECK(error_of({"--store-memory-budget", "", "./train"}).find("--store-memory-budget") !=
        std::string::npos);
}

// torch 2.11's torchrun parser (torch.distributed.run.get_args_parser, read on the GPU machine):
// every flag in both spellings, `--flag value` and `--flag=value`, and from its PET_* variable.
TEST_CASE("cli: every torchrun 2.11 flag, both spellings, = forms and PET_* variables") {
  struct Row {
    std::vector<std::string> spellings;  ///< torchrun's option strings
    std::string value;                   ///< "" for a switch
    std::string pet;                     ///< torchrun's PET_<DEST>; "" when it reads none
    std::function<void(const Options&)> check;
    std::vector<std::string> before = {};  ///< other flags the row needs
  };
  const std::vector<Row> rows = {
      {{"--nnodes"},
       "3:3",
       "PET_NNODES",
       [](const Options& o) {
         CHECK(o.nnodes == 3);
         CHECK(o.nnodes_max == 3);
       }},
      {{"--nproc-per-node", "--nproc_per_node"},
       "4",
       "PET_NPROC_PER_NODE",
       [](const Options& o) { CHECK(o.nproc == 4); }},
      {{"--rdzv-backend", "--rdzv_backend"},
       "c10d",
       "PET_RDZV_BACKEND",
       [](const Options& o) { CHECK(o.rdzv_backend == RdzvBackend::kC10d); }},
      {{"--rdzv-endpoint", "--rdzv_endpoint"},
       "node7:29411",
       "PET_RDZV_ENDPOINT",
       [](const Options& o) {
         CHECK(o.master_addr == "node7");
         CHECK(o.master_port == 29411);
       }},
      {{"--rdzv-id", "--rdzv_id"},
       "job9",
       "PET_RDZV_ID",
       [](const Options& o) { CHECK(o.run_id == "job9"); }},
      {{"--rdzv-conf", "--rdzv_conf"},
       "join_timeout=90,last_call_timeout=5,is_host=false",
       "PET_RDZV_CONF",
       [](const Options& o) {
         CHECK(o.join_timeout == std::chrono::seconds(90));
         CHECK(o.last_call_timeout == std::chrono::seconds(5));
         CHECK(o.is_host == false);
         CHECK(o.warnings.empty());
       }},
      {{"--standalone"}, "", "PET_STANDALONE", [](const Options& o) { CHECK(o.standalone); }},
      {{"--max-restarts", "--max_restarts"},
       "3",
       "PET_MAX_RESTARTS",
       [](const Options& o) { CHECK(o.max_restarts == 3); }},
      {{"--monitor-interval", "--monitor_interval"},
       "0.5",
       "PET_MONITOR_INTERVAL",
       [](const Options& o) { CHECK(o.command == std::vector<std::string>{"x"}); }},
      {{"--start-method", "--start_method"},
       "fork",
       "PET_START_METHOD",
       [](const Options& o) { CHECK(o.command == std::vector<std::string>{"x"}); }},
      {{"--event-log-handler", "--event_log_handler"},
       "null",
       "PET_EVENT_LOG_HANDLER",
       [](const Options& o) { CHECK_FALSE(o.event_log); }},
      {{"--role"}, "trainer", "PET_ROLE", [](const Options& o) { CHECK(o.role == "trainer"); }},
      {{"-m", "--module"}, "", "PET_MODULE", [](const Options& o) { CHECK(o.module); }},
      {{"--no-python", "--no_python"},
       "",
       "PET_NO_PYTHON",
       [](const Options& o) { CHECK(o.no_python); }},
      {{"--run-path", "--run_path"},
       "",
       "PET_RUN_PATH",
       [](const Options& o) { CHECK(o.run_path); }},
      {{"--log-dir", "--log_dir"},
       "/tmp/l",
       "PET_LOG_DIR",
       [](const Options& o) { CHECK(o.log_dir == "/tmp/l"); }},
      {{"-r", "--redirects"},
       "3",
       "PET_REDIRECTS",
       [](const Options& o) { CHECK(o.redirects.all == 3); }},
      {{"-t", "--tee"},
       "0:1,1:2",
       "PET_TEE",
       [](const Options& o) {
         CHECK(o.tee.for_local_rank(0) == 1);
         CHECK(o.tee.for_local_rank(1) == 2);
       },
       {"--nproc", "2"}},
      {{"--local-ranks-filter", "--local_ranks_filter"},
       "0,2",
       "PET_LOCAL_RANKS_FILTER",
       [](const Options& o) {
         CHECK(o.local_ranks_filter == std::set<int>{0, 2});
       }},
      {{"--node-rank", "--node_rank"},
       "1",
       "PET_NODE_RANK",
       [](const Options& o) {
         CHECK(o.node_rank == 1);
         CHECK(o.node_rank_given);
       },
       {"--nnodes", "2"}},
      {{"--master-addr", "--master_addr"},
       "10.1.2.3",
       "PET_MASTER_ADDR",
       [](const Options& o) { CHECK(o.master_addr == "10.1.2.3"); }},
      {{"--master-port", "--master_port"},
       "29600",
       "PET_MASTER_PORT",
       [](const Options& o) { CHECK(o.master_port == 29600); }},
      {{"--local-addr", "--local_addr"},
       "10.1.2.4",
       "PET_LOCAL_ADDR",
       [](const Options& o) { CHECK(o.local_addr == "10.1.2.4"); }},
      {{"--signals-to-handle", "--signals_to_handle"},
       "SIGTERM,SIGUSR1",
       "PET_SIGNALS_TO_HANDLE",
       [](const Options& o) { CHECK(o.signals_to_handle == "SIGTERM,SIGUSR1"); }},
      {{"--virtual-local-rank", "--virtual_local_rank"},
       "",
       "PET_VIRTUAL_LOCAL_RANK",
       [](const Options& o) { CHECK(o.virtual_local_rank); }},
      // not in 2.11 (a later torchrun's name for the SIGTERM -> SIGKILL delay)
      {{"--shutdown-timeout", "--shutdown_timeout"},
       "7",
       "PET_SHUTDOWN_TIMEOUT",
       [](const Options& o) { CHECK(o.grace_period == std::chrono::seconds(7)); }},
  };
  for (const Row& row : rows) {
    for (const std::string& flag : row.spellings) {
      CAPTURE(flag);
      std::vector<std::string> spaced = row.before, joined = row.before;
      spaced.push_back(flag);
      if (row.value.empty()) {
        joined.push_back(flag);
      } else {
        spaced.push_back(row.value);
        joined.push_back(flag + "=" + row.value);
      }
      spaced.push_back("x");
      joined.push_back("x");
      row.check(p(spaced));
      if (flag.size() > 2) row.check(p(joined));  // argparse takes -r=3 as "=3": not checked
    }
    if (!row.pet.empty()) {
      CAPTURE(row.pet);
      std::vector<std::string> args = row.before;
      args.push_back("x");
      row.check(parse(args, {{row.pet, row.value.empty() ? "1" : row.value}}));
    }
  }
}

TEST_CASE("cli: torchrun's PET_* variables: the command line wins, bad values name the variable") {
  CHECK(parse({"--nproc-per-node", "2", "x"}, {{"PET_NPROC_PER_NODE", "3"}}).nproc == 2);
  // MASTER_PORT in gpurun's environment is the port when nothing else names one (issue 44).
  {
    const Options o = parse({"x"}, {{"MASTER_PORT", "29642"}});
    CHECK(o.master_port == 29642);
    CHECK(o.master_port_given);
  }
  CHECK(parse({"--master-port", "29601", "x"}, {{"MASTER_PORT", "29642"}}).master_port == 29601);
  CHECK(parse({"x"}, {{"PET_MASTER_PORT", "29602"}, {"MASTER_PORT", "29642"}}).master_port ==
        29602);
  CHECK_FALSE(parse({"--standalone", "x"}, {{"MASTER_PORT", "29642"}}).master_port_given);
  CHECK_THROWS_WITH_AS(parse({"x"}, {{"MASTER_PORT", "http"}}),
                       "invalid value 'http' for MASTER_PORT in gpurun's environment: expected a "
                       "port number 0-65535",
                       gpurun::UsageError);
  CHECK(parse({"x"}, {{"PET_NPROC_PER_NODE", "3"}}).nproc == 3);
  // An elastic job takes a node range with a static rendezvous (--node-rank 0 hosts).
  CHECK(p({"--nnodes", "1:4", "--config", "c.toml", "x"}).nnodes_max == 4);
  // Kubeflow's PyTorchJob (v1) spells it PET_N_PROC_PER_NODE; torchrun's name wins over it.
  CHECK(parse({"x"}, {{"PET_N_PROC_PER_NODE", "4"}}).nproc == 4);
  CHECK(parse({"x"}, {{"PET_N_PROC_PER_NODE", "4"}, {"PET_NPROC_PER_NODE", "3"}}).nproc == 3);
  CHECK_THROWS_WITH_AS(parse({"x"}, {{"PET_N_PROC_PER_NODE", "many"}}),
                       doctest::Contains("PET_N_PROC_PER_NODE"), gpurun::UsageError);
  // A variable the command line overrides is never parsed (torchrun: only argparse's default).
  CHECK(parse({"--nproc", "2", "x"}, {{"PET_NPROC_PER_NODE", "abc"}}).nproc == 2);
  CHECK(parse({"-r3", "x"}, {{"PET_REDIRECTS", "9"}}).redirects.all == 3);
  // --standalone: the rendezvous flags are not used (torchrun ignores them too).
  const Options sa =
      p({"--standalone", "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29400", "x"});
  CHECK(sa.rdzv_backend == RdzvBackend::kStatic);
  CHECK_FALSE(sa.master_port_given);
  REQUIRE(sa.warnings.size() == 1);
  CHECK_FALSE(parse({"x"}, {{"PET_STANDALONE", "0"}}).standalone);
  CHECK(p({"-r3", "x"}).redirects.all == 3);  // a short flag's value in the same word
  CHECK(p({"-t2", "x"}).tee.all == 2);
  const auto env_error = [](std::map<std::string, std::string> env) {
    try {
      parse(std::vector<std::string>{"x"}, env);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  CHECK(env_error({{"PET_NPROC_PER_NODE", "abc"}}) ==
        "invalid value 'abc' for --nproc-per-node (from PET_NPROC_PER_NODE): expected a positive "
        "integer, auto, gpu or cpu");
  CHECK(env_error({{"PET_STANDALONE", "yes"}}) ==
        "invalid value 'yes' for PET_STANDALONE: expected an integer (1 = --standalone, 0 = off), "
        "as torchrun reads it");
}

TEST_CASE("cli: torchrun flags gpurun cannot honour are refused with what to use instead") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> rows = {
      {{"--logs-specs", "mine", "x"},
       "--logs-specs: loads a torchrun Python plug-in (entry point group torchrun.logs_specs), "
       "which gpurun cannot run; use --log-dir, --redirects, --tee and --log-line-prefix-template"},
      {{"--numa-binding", "node", "x"},
       "--numa-binding: is not implemented by gpurun; bind in the worker command instead (e.g. "
       "numactl --cpunodebind=0 --membind=0 ./train) or with Slurm's --cpu-bind"},
      {{"--duplicate-stdout-filters", "loss", "x"},
       "--duplicate-stdout-filters: is not implemented by gpurun yet; use --tee 1 --log-dir DIR "
       "and grep the workers' stdout.log files"},
      {{"--duplicate_stderr_filters=err", "x"},
       "--duplicate-stderr-filters: is not implemented by gpurun yet; use --tee 2 --log-dir DIR "
       "and grep the workers' stderr.log files"},
      {{"--rdzv-backend", "etcd-v2", "x"},
       "--rdzv-backend etcd-v2: gpurun hosts the rendezvous store itself and needs no etcd server; "
       "use --rdzv-backend c10d --rdzv-endpoint HOST:PORT"},
      {{"--rdzv-backend", "zk", "x"},
       "invalid value 'zk' for --rdzv-backend: expected c10d or static"},
      {{"--event-log-handler", "console", "x"},
       "--event-log-handler console: torchrun's event handlers are Python plug-ins; gpurun writes "
       "its events as JSON lines with --event-log FILE (only 'null' is accepted here)"},
      {{"--start-method", "thread", "x"},
       "invalid value 'thread' for --start-method: expected spawn, fork or forkserver"},
      {{"--signals-to-handle", "SIGTERM,SIGKILL", "x"},
       "invalid value 'SIGTERM,SIGKILL' for --signals-to-handle: SIGKILL cannot be handled by any "
       "process"},
      {{"--signals-to-handle", "SIGTERM,,SIGINT", "x"},
       "invalid value 'SIGTERM,,SIGINT' for --signals-to-handle: piece 2 ('') is not a signal "
       "name; expected a list like SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
      {{"--rdzv-conf", "join_timeout", "x"},
       "invalid value 'join_timeout' for --rdzv-conf: piece 1 ('join_timeout') is not KEY=VALUE; "
       "expected key1=value1,key2=value2,..."},
      {{"--rdzv-conf", "is_host=maybe", "x"},
       "invalid value 'maybe' for --rdzv-conf is_host: expected true or false (1/0, yes/no)"},
      {{"--rdzv-conf", "last_call_timeout=-1", "x"},
       "invalid value '-1' for --rdzv-conf last_call_timeout: expected a number of seconds "
       "between 0 and 86400"},
      {{"--rdzv-endpoint", "[::1", "x"},
       "invalid value '[::1' for --rdzv-endpoint: expected HOST[:PORT], with an IPv6 address in "
       "brackets: [::1]:29400"},
      {{"--rdzv-endpoint", "host:99999", "x"},
       "invalid value 'host:99999' for --rdzv-endpoint: expected HOST[:PORT], with an IPv6 "
       "address in brackets: [::1]:29400"},
  };
  for (const auto& row : rows) {
    const auto& args = row.first;  // named: clang 14 cannot capture a binding in CAPTURE's lambda
    const auto& message = row.second;
    CAPTURE(args);
    CHECK(error_of(args) == message);
  }
  // An unknown --rdzv-conf key is passed over with a warning (torchrun hands it to its backend).
  const Options o = p({"--rdzv-conf", "keep_alive_interval=5", "x"});
  REQUIRE(o.warnings.size() == 1);
  CHECK(o.warnings[0].find("keep_alive_interval=5") != std::string::npos);
}

TEST_CASE("cli: --rdzv-endpoint HOST[:PORT] names the store") {
  using detail::parse_endpoint;
  CHECK(parse_endpoint("f", "[::1]:29401", 1).host == "::1");
  CHECK(parse_endpoint("f", "[::1]:29401", 1).port == 29401);
  CHECK(parse_endpoint("f", "[fe80::1%eth0]", 7).port == 7);
  CHECK(parse_endpoint("f", "::1", 7).host == "::1");
  CHECK(parse_endpoint("f", "node3", 7).port == 7);
  Options c10d = p({"--rdzv-backend", "c10d", "--rdzv-endpoint", "node3", "x"});
  CHECK(c10d.master_port == 29400);  // torchrun's c10d default port
  Options both = p({"--master-addr", "a", "--rdzv-endpoint", "b:5", "x"});
  CHECK(both.master_addr == "b");
  REQUIRE(both.warnings.size() == 1);
  CHECK(both.warnings[0] == "--master-addr a is not used: --rdzv-endpoint b:5 names the store");
  for (const char* bad : {"", ":5", "[]:5", "h:", "[::1]x", "localhost:0:1", "http://h:5"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_endpoint("f", bad, 1), UsageError);
  }
}

TEST_CASE("cli: python -m torch.distributed.launch lines, gpurun in place of python") {
  // `python -m torch.distributed.launch --nproc_per_node=2 train.py --lr 1` with gpurun in
  // place of `python`, or the whole line after gpurun.
  for (const std::vector<std::string>& head :
       {std::vector<std::string>{"-m", "torch.distributed.launch"},
        std::vector<std::string>{"--module", "torch.distributed.launch"},
        std::vector<std::string>{"python3", "-m", "torch.distributed.launch"},
        std::vector<std::string>{"/opt/venv/bin/python3.11", "-m", "torch.distributed.launch"}}) {
    std::vector<std::string> line = head;
    for (const char* w : {"--nproc_per_node=2", "train.py", "--lr", "1"}) line.emplace_back(w);
    const Options o = p(line);
    CHECK(o.launch_shape);
    CHECK_FALSE(o.use_env);
    CHECK_FALSE(o.module);  // the -m was python's, not torchrun's --module
    CHECK(o.nproc == 2);
    CHECK(o.command == std::vector<std::string>{"train.py", "--lr", "1"});
    CHECK(o.python == (head.size() == 3 ? std::optional<std::string>(head[0]) : std::nullopt));
  }
  // --use-env / --use_env: the local rank only in LOCAL_RANK; -m after it is torchrun's.
  for (const char* flag : {"--use-env", "--use_env"}) {
    const Options o = p({"-m", "torch.distributed.launch", flag, "-m", "pkg.train"});
    CHECK(o.launch_shape);
    CHECK(o.use_env);
    CHECK(o.module);
    CHECK(o.command == std::vector<std::string>{"pkg.train"});
  }
  // torch.distributed.run is torchrun: its shape, no argument added.
  const Options run = p({"python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"});
  CHECK_FALSE(run.launch_shape);
  CHECK(run.python == std::optional<std::string>("python"));
  CHECK(run.command == std::vector<std::string>{"t.py"});
  // Anything else is a torchrun line as before: -m runs a module, python runs python.
  const Options mod = p({"-m", "torch.distributed.launcher_of_mine"});
  CHECK_FALSE(mod.launch_shape);
  CHECK(mod.module);
  const Options py = p({"python3", "-m", "http.server"});
  CHECK_FALSE(py.launch_shape);
  CHECK_FALSE(py.python);
  CHECK(py.command == std::vector<std::string>{"python3", "-m", "http.server"});
  // The launcher words after some of gpurun's own flags (the natural place for --device cpu).
  const Options after = p({"--device", "cpu", "--master-port", "0", "--use-env", "-m",
                           "torch.distributed.launch", "--nproc_per_node=2", "t.py", "--lr", "1"});
  CHECK(after.launch_shape);
  CHECK(after.use_env);
  CHECK_FALSE(after.module);
  CHECK(after.nproc == 2);
  CHECK(after.device == Device::kCpu);
  CHECK(after.command == std::vector<std::string>{"t.py", "--lr", "1"});
  const Options after_py = p({"-r", "3", "python3", "-m", "torch.distributed.launch", "t.py"});
  CHECK(after_py.launch_shape);
  CHECK(after_py.python == std::optional<std::string>("python3"));
  CHECK(after_py.command == std::vector<std::string>{"t.py"});
  // Past the worker command the words are the script's: a module named like torch's launcher
  // only after the script is not a launcher line.
  const Options late = p({"-m", "pkg.train", "-m", "torch.distributed.launch"});
  CHECK_FALSE(late.launch_shape);
  CHECK(late.module);
  CHECK(late.command == std::vector<std::string>{"pkg.train", "-m", "torch.distributed.launch"});
  // --use-env on a torchrun line changes nothing (torchrun passes LOCAL_RANK only anyway).
  CHECK(p({"--use_env", "t.py"}).use_env);
  CHECK_FALSE(p({"--use_env", "t.py"}).launch_shape);
}

TEST_CASE("cli: --simulate-gpus puts the workers on the CPU and the energy monitor on") {
  const Options o = p({"--simulate-gpus", "2", "./train"});
  CHECK(o.simulate_gpus == std::optional<std::string>("2"));
  CHECK(o.device == Device::kCpu);
  CHECK(o.energy == EnergyMode::kOn);
  CHECK(p({"--simulate-gpus=gpus.txt", "--device", "cpu", "./train"}).device == Device::kCpu);
  CHECK(error_of({"--simulate-gpus", "2", "--device", "cuda", "./train"}) ==
        "--simulate-gpus simulates NVML, not CUDA: its workers run on the CPU; drop --device cuda");
  CHECK(error_of({"--simulate-gpus", "2", "--energy", "off", "./train"}) ==
        "--simulate-gpus is for the energy features; drop --energy off");
}

TEST_CASE("cli: --metrics-port [ADDRESS:]PORT and --dcgm-job-dir (docs/metrics.md)") {
  const Options none = p({"./train"});
  CHECK_FALSE(none.metrics_port.has_value());
  CHECK_FALSE(none.dcgm_job_dir.has_value());
  const Options o = p({"--metrics-port", "9401", "--dcgm-job-dir", "/run/dcgm", "./train"});
  CHECK(o.metrics_port == std::optional<uint16_t>(9401));
  CHECK(o.metrics_address == "127.0.0.1");
  CHECK(o.dcgm_job_dir == std::optional<std::string>("/run/dcgm"));
  const Options any = p({"--metrics-port=0.0.0.0:0", "./train"});
  CHECK(any.metrics_port == std::optional<uint16_t>(0));
  CHECK(any.metrics_address == "0.0.0.0");
  CHECK(p({"--metrics-port", "[::1]:9401", "./train"}).metrics_address == "::1");
  CHECK(error_of({"--metrics-port", "70000", "./train"}).find("--metrics-port") !=
        std::string::npos);
  CHECK(error_of({"--metrics-port", ":9401", "./train"}) ==
        "invalid value ':9401' for --metrics-port: expected [ADDRESS:]PORT, e.g. 9401 or "
        "0.0.0.0:9401");
  const std::string h = help_text();
  CHECK(h.find("--metrics-port [ADDR:]PORT") != std::string::npos);
  CHECK(h.find("--dcgm-job-dir DIR") != std::string::npos);
}
