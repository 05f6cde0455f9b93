#include "supervisor/slurm.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "gpurun/error.hpp"

using namespace gpurun::supervisor;

namespace {
using Hosts = std::vector<std::string>;

std::string hostlist_error(std::string_view expr) {
  try {
    expand_hostlist(expr);
  } catch (const gpurun::UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

/// A two-node step's environment as srun gives it to the task on node 1.
SlurmEnv::Map step_env() {
  return {
      {"SLURM_JOB_ID", "123456"},
      {"SLURM_STEP_ID", "0"},
      {"SLURM_NNODES", "2"},
      {"SLURM_JOB_NUM_NODES", "2"},
      {"SLURM_NODEID", "1"},
      {"SLURM_STEP_NODELIST", "gpu[07-08]"},
      {"SLURM_JOB_NODELIST", "gpu[07-08]"},
      {"SLURM_NTASKS", "2"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_PROCID", "1"},
      {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
      {"SLURM_GPUS_ON_NODE", "4"},
  };
}

std::string parse_error(const SlurmEnv::Map& env) {
  try {
    SlurmEnv::parse(env);
  } catch (const gpurun::UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

Options options(std::vector<std::string> args) {
  args.push_back("./train");
  return parse(args);
}

std::string apply_error(std::vector<std::string> args, const SlurmEnv::Map& env) {
  Options o = options(std::move(args));
  try {
    apply_slurm(o, SlurmEnv::parse(env));
  } catch (const gpurun::UsageError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST_CASE("slurm: hostlist ranges, padding, lists and plain names") {
  CHECK(expand_hostlist("node1") == Hosts{"node1"});
  CHECK(expand_hostlist("gpu[01-04,07],cpu5") ==
        Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu5"});
  CHECK(expand_hostlist("n[08-11]") == Hosts{"n08", "n09", "n10", "n11"});
  // The low end's width pads; an unpadded low end grows naturally.
  CHECK(expand_hostlist("n[8-11]") == Hosts{"n8", "n9", "n10", "n11"});
  CHECK(expand_hostlist("n[098-101]") == Hosts{"n098", "n099", "n100", "n101"});
  CHECK(expand_hostlist("a[3]") == Hosts{"a3"});
  // Commas inside brackets are numbers; between hosts (also spaces) they separate hosts.
  CHECK(expand_hostlist("a[1,3],b[2-3] c") == Hosts{"a1", "a3", "b2", "b3", "c"});
  CHECK(expand_hostlist(",a1,,b2,") == Hosts{"a1", "b2"});
  // Text after a group, and Slurm's order for several groups: the leftmost varies slowest.
  CHECK(expand_hostlist("n[1-2]-ib") == Hosts{"n1-ib", "n2-ib"});
  CHECK(expand_hostlist("rack[1-2]-n[1-2]") ==
        Hosts{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(expand_hostlist("r[1,3]s[0-1]n[5]") == Hosts{"r1s0n5", "r1s1n5", "r3s0n5", "r3s1n5"});
  // Duplicates are kept (Slurm's hostlist_create does not sort or unique).
  CHECK(expand_hostlist("a1,a1") == Hosts{"a1", "a1"});
  CHECK(expand_hostlist("x[0-65535]").size() == 65536);
}

TEST_CASE("slurm: hostlist errors name the expression and the position") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gpu[01-04", "at position 4: '[' never closed"},
      {"gpu01-04]", "at position 9: ']' without a '['"},
      {"a[1-[2]]",
       "at position 5: nested '[' (brackets do not nest; the '[' at position 2 is open)"},
      {"a[]", "at position 2: empty range '[]'"},
      {"a[1,,2]", "at position 5: empty item in '[...]' (two commas or a comma at an end)"},
      {"a[1,2,]", "at position 7: empty item in '[...]' (two commas or a comma at an end)"},
      {"a[1-]", "at position 5: empty range '1-'"},
      {"a[-3]", "at position 3: empty range '-3'"},
      {"gpu[5-3]", "at position 5: reversed range '5-3' (write the low end first: 3-5)"},
      {"b,gpu[a-c]",
       "at position 7: non-numeric range 'a-c' (ranges are decimal numbers, e.g. 01-04)"},
      {"n[1-2-3]",
       "at position 5: non-numeric range '1-2-3' (ranges are decimal numbers, e.g. 01-04)"},
      {"n[ 1-2]",
       "at position 3: non-numeric range ' 1-2' (ranges are decimal numbers, e.g. 01-04)"},
      {"n[99999999999999999999]",
       "at position 3: number '99999999999999999999' in range '99999999999999999999' is too "
       "large"},
      // Over the cap: one range, a product of groups; refused before anything is built.
      {"x[0-65536]", "at position 3: range '0-65536' names more than 65536 hosts"},
      {"a[0-999999999]b[0-999999999]",
       "at position 3: range '0-999999999' names more than 65536 hosts"},
  };
  for (const auto& row : cases) {
    const auto& expr = row.first;  // named: clang 14 cannot capture a binding in CAPTURE's lambda
    const auto& what = row.second;
    CAPTURE(expr);
    CHECK(hostlist_error(expr) == "invalid hostlist '" + expr + "' " + what);
  }
  CHECK(hostlist_error("") == "invalid hostlist '': it names no host");
  CHECK(hostlist_error(" , ") == "invalid hostlist ' , ': it names no host");
  CHECK(hostlist_error("a[0-299]b[0-299]") ==
        "invalid hostlist 'a[0-299]b[0-299]': more than 65536 hosts (the host at position 1 "
        "passes the limit)");
  CHECK(hostlist_error("x[0-65535],y1") ==
        "invalid hostlist 'x[0-65535],y1': more than 65536 hosts (the host at position 12 passes "
        "the limit)");
}

TEST_CASE("slurm: detect() needs both the job id and the step id") {
  CHECK(SlurmEnv::detect(step_env()));
  CHECK_FALSE(SlurmEnv::detect({}));
  CHECK_FALSE(SlurmEnv::detect({{"SLURM_JOB_ID", "5"}}));  // a batch script, not a step
  CHECK_FALSE(SlurmEnv::detect({{"SLURM_STEP_ID", "0"}}));
  CHECK(SlurmEnv::detect({{"SLURM_JOBID", "5"}, {"SLURM_STEPID", "0"}}));  // older names
}

TEST_CASE("slurm: parse reads the step, both node-count names and the GPUs") {
  SlurmEnv s = SlurmEnv::parse(step_env());
  CHECK(s.job_id == "123456");
  CHECK(s.job_number == 123456);
  CHECK(s.step_id == "0");
  CHECK(s.nnodes == 2);
  CHECK(s.nnodes_var == "SLURM_NNODES");
  CHECK(s.node_id == 1);
  CHECK(s.nodelist_var == "SLURM_STEP_NODELIST");
  CHECK(s.nodes == Hosts{"gpu07", "gpu08"});
  CHECK(s.ntasks == 2);
  CHECK(s.local_id == 0);
  CHECK(s.step_tasks_per_node == "1(x2)");
  CHECK(s.gpus == 4);
  CHECK(s.gpus_var == "SLURM_GPUS_ON_NODE");

  SUBCASE("SLURM_JOB_NUM_NODES and SLURM_JOB_NODELIST when the others are absent") {
    auto env = step_env();
    env.erase("SLURM_NNODES");
    env.erase("SLURM_STEP_NODELIST");
    s = SlurmEnv::parse(env);
    CHECK(s.nnodes == 2);
    CHECK(s.nnodes_var == "SLURM_JOB_NUM_NODES");
    CHECK(s.nodelist_var == "SLURM_JOB_NODELIST");
  }
  SUBCASE("the step's count and list win over the job's") {
    auto env = step_env();
    env["SLURM_STEP_NUM_NODES"] = "1";
    env["SLURM_STEP_NODELIST"] = "gpu08";
    env["SLURM_NODEID"] = "0";
    env["SLURM_NTASKS"] = "1";
    s = SlurmEnv::parse(env);
    CHECK(s.nnodes == 1);
    CHECK(s.nnodes_var == "SLURM_STEP_NUM_NODES");
    CHECK(s.nodes == Hosts{"gpu08"});
  }
  SUBCASE("GPUs: CUDA_VISIBLE_DEVICES, then SLURM_STEP_GPUS, then SLURM_GPUS_ON_NODE") {
    auto env = step_env();
    env["SLURM_STEP_GPUS"] = "0,1,2";
    CHECK(SlurmEnv::parse(env).gpus == 3);
    CHECK(SlurmEnv::parse(env).gpus_var == "SLURM_STEP_GPUS");
    env["CUDA_VISIBLE_DEVICES"] = "1,2";
    CHECK(SlurmEnv::parse(env).gpus == 2);
    CHECK(SlurmEnv::parse(env).gpus_var == "CUDA_VISIBLE_DEVICES");
    env.erase("CUDA_VISIBLE_DEVICES");
    env.erase("SLURM_STEP_GPUS");
    env.erase("SLURM_GPUS_ON_NODE");
    CHECK_FALSE(SlurmEnv::parse(env).gpus.has_value());
  }
}

TEST_CASE("slurm: missing or garbage variables are named with their value") {
  auto with = [](const char* name, const char* value) {
    auto env = step_env();
    env[name] = value;
    return env;
  };
  auto without = [](std::initializer_list<const char*> names) {
    auto env = step_env();
    for (const char* n : names) env.erase(n);
    return env;
  };
  CHECK(parse_error(with("SLURM_JOB_ID", "12a")) ==
        "Slurm: SLURM_JOB_ID='12a' is not a job id (decimal digits)");
  CHECK(parse_error(with("SLURM_NNODES", "two")) ==
        "Slurm: SLURM_NNODES='two' is not a positive node count");
  CHECK(parse_error(with("SLURM_NNODES", "0")) ==
        "Slurm: SLURM_NNODES='0' is not a positive node count");
  CHECK(parse_error(with("SLURM_NODEID", "-1")) ==
        "Slurm: SLURM_NODEID='-1' is not a node index (a non-negative integer)");
  CHECK(parse_error(with("SLURM_NODEID", "2")) ==
        "Slurm: SLURM_NODEID=2 is not below SLURM_NNODES=2");
  CHECK(parse_error(with("SLURM_NTASKS", "x")) ==
        "Slurm: SLURM_NTASKS='x' is not a positive task count");
  CHECK(parse_error(with("SLURM_GPUS_ON_NODE", "4gpu")) ==
        "Slurm: SLURM_GPUS_ON_NODE='4gpu' is not a GPU count (a non-negative integer)");
  CHECK(parse_error(with("SLURM_STEP_NODELIST", "gpu[07-09]")) ==
        "Slurm: SLURM_STEP_NODELIST='gpu[07-09]' names 3 hosts, but SLURM_NNODES=2");
  CHECK(parse_error(with("SLURM_STEP_NODELIST", "gpu[08-07]")) ==
        "Slurm: SLURM_STEP_NODELIST: invalid hostlist 'gpu[08-07]' at position 5: reversed "
        "range '08-07' (write the low end first: 07-08)");
  CHECK(parse_error(without({"SLURM_NODEID"})) ==
        "Slurm: SLURM_NODEID is not set; gpurun reads it when it runs as a task of a Slurm step "
        "(srun)");
  CHECK(parse_error(without({"SLURM_NNODES", "SLURM_JOB_NUM_NODES"})) ==
        "Slurm: SLURM_STEP_NUM_NODES / SLURM_NNODES / SLURM_JOB_NUM_NODES is not set; gpurun "
        "reads it when it runs as a task of a Slurm step (srun)");
  CHECK(parse_error(without({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"})) ==
        "Slurm: SLURM_STEP_NODELIST / SLURM_NODELIST / SLURM_JOB_NODELIST is not set; gpurun "
        "reads it when it runs as a task of a Slurm step (srun)");
}

TEST_CASE("slurm: apply_slurm sets the topology, the port from the job id and --nproc") {
  CHECK(slurm_master_port(0) == 20000);
  CHECK(slurm_master_port(123456) == 23456);
  CHECK(slurm_master_port(9999) == 29999);
  CHECK(slurm_master_port(18446744073709551615ULL) == 21615);

  Options o = options({});
  const SlurmEnv s = SlurmEnv::parse(step_env());
  apply_slurm(o, s);
  CHECK(o.nnodes == 2);
  CHECK(o.node_rank == 1);
  CHECK(o.master_addr == "gpu07");
  CHECK(o.master_port == 23456);
  CHECK(o.nproc_mode == NprocMode::kCount);
  CHECK(o.nproc == 4);
  CHECK(slurm_banner(o, s) ==
        "Slurm job 123456 step 0: node 1 of 2, master gpu07:23456; --nproc 4 from "
        "SLURM_GPUS_ON_NODE");
  // No --rdzv-id: the job id is the run id (torchrun users pass --rdzv-id $SLURM_JOB_ID), never
  // "none"; still not "given", so a node from another allocation joins whatever job it names.
  CHECK(o.run_id == "123456");
  CHECK_FALSE(o.run_id_given);

  SUBCASE("explicit flags win") {
    Options e = options({"--master-addr", "gpu07-ib", "--master-port", "31000", "--nproc", "2",
                         "--nnodes", "2", "--node-rank", "1"});
    apply_slurm(e, s);
    CHECK(e.master_addr == "gpu07-ib");
    CHECK(e.master_port == 31000);
    CHECK(e.nproc == 2);
    CHECK(slurm_banner(e, s) == "Slurm job 123456 step 0: node 1 of 2, master gpu07-ib:31000");
    Options r = options({"--rdzv-id", "mine"});
    apply_slurm(r, s);
    CHECK(r.run_id == "mine");
    Options g = options({"--nproc", "gpu"});
    apply_slurm(g, s);
    CHECK(g.nproc_mode == NprocMode::kGpu);
  }
  SUBCASE("--device cpu or no GPUs from Slurm: the --nproc default stays 1") {
    Options c = options({"--device", "cpu"});
    apply_slurm(c, s);
    CHECK(c.nproc == 1);
    auto env = step_env();
    env["CUDA_VISIBLE_DEVICES"] = "";
    Options z = options({});
    apply_slurm(z, SlurmEnv::parse(env));
    CHECK(z.nproc == 1);
  }
}

TEST_CASE("slurm: conflicts with flags and more than one task per node are usage errors") {
  const auto env = step_env();
  CHECK(apply_error({"--nnodes", "4"}, env) ==
        "--nnodes 4 disagrees with Slurm's SLURM_NNODES=2; drop --nnodes (Slurm sets it) or pass "
        "--no-slurm");
  CHECK(apply_error({"--nnodes", "2", "--node-rank", "0"}, env) ==
        "--node-rank 0 disagrees with Slurm's SLURM_NODEID=1; drop --node-rank (Slurm sets it) or "
        "pass --no-slurm");
  CHECK(apply_error({"--standalone"}, env) ==
        "--standalone runs one node on a free port and cannot be combined with Slurm (job 123456 "
        "step 0, 2 nodes); drop --standalone, or pass --no-slurm");
  CHECK(apply_error({"--master-port", "0"}, env) ==
        "--master-port 0 cannot be used with Slurm's 2 nodes: node 1 cannot learn the port node 0 "
        "bound; drop --master-port (gpurun derives one from the job id) or give a number");
  const std::string rule =
      ", but gpurun must run as one task per node and starts the workers itself: srun "
      "--ntasks-per-node=1 gpurun ... (--nproc sets the workers per node)";
  auto with = [&](const char* name, const char* value) {
    auto e = env;
    e[name] = value;
    return e;
  };
  CHECK(apply_error({}, with("SLURM_NTASKS", "8")) ==
        "Slurm: SLURM_NTASKS=8 tasks run on SLURM_NNODES=2 nodes" + rule);
  CHECK(apply_error({}, with("SLURM_NTASKS_PER_NODE", "4")) ==
        "Slurm: SLURM_NTASKS_PER_NODE=4 asks for several tasks per node" + rule);
  CHECK(apply_error({}, with("SLURM_STEP_TASKS_PER_NODE", "1,2")) ==
        "Slurm: SLURM_STEP_TASKS_PER_NODE='1,2' gives a node more than one task" + rule);
  CHECK(apply_error({}, with("SLURM_STEP_TASKS_PER_NODE", "4(x2)")) ==
        "Slurm: SLURM_STEP_TASKS_PER_NODE='4(x2)' gives a node more than one task" + rule);
  CHECK(apply_error({}, with("SLURM_LOCALID", "3")) ==
        "Slurm: SLURM_LOCALID=3: this is not the node's first task" + rule);
  CHECK(apply_error({}, with("SLURM_STEP_TASKS_PER_NODE", "1,1(x1)")) == "<no error>");
}

TEST_CASE("slurm: an elastic job's --nnodes MIN:MAX holds Slurm's count and bounds later joins") {
  const SlurmEnv s = SlurmEnv::parse(step_env());  // node 1 of 2
  Options o = options({"--slurm", "--config", "c.toml", "--nnodes", "1:4"});
  apply_slurm(o, s);
  CHECK(o.nnodes == 2);
  CHECK(o.nnodes_max == 4);  // node 0's hub accepts up to 4 nodes: later allocations join
  CHECK(o.node_rank == 1);
  CHECK(o.master_addr == "gpu07");
  CHECK(slurm_banner(o, s) ==
        "Slurm job 123456 step 0: node 1 of 2, master gpu07:23456; an elastic job of up to 4 "
        "nodes (--nnodes); --nproc 4 from SLURM_GPUS_ON_NODE");
  CHECK(apply_error({"--slurm", "--config", "c.toml", "--nnodes", "3:4"}, step_env()) ==
        "--nnodes 3:4 does not hold Slurm's SLURM_NNODES=2; ask Slurm for 3 to 4 nodes or give a "
        "range that holds 2");
  CHECK(apply_error({"--slurm", "--config", "c.toml", "--nnodes", "4"}, step_env()) ==
        "--nnodes 4 disagrees with Slurm's SLURM_NNODES=2; drop --nnodes (Slurm sets it) or pass "
        "--no-slurm");
  // Without --nnodes the most is Slurm's count: node 0 says "joins it with --nnodes 2", not 2:1.
  Options plain = options({"--config", "c.toml"});
  apply_slurm(plain, s);
  CHECK(plain.nnodes == 2);
  CHECK(plain.nnodes_max == 2);
}

TEST_CASE("slurm: use_slurm decides between auto, --slurm and --no-slurm") {
  SUBCASE("auto inside a step: applied, with the banner") {
    Options o = options({});
    CHECK(use_slurm(o, step_env()) ==
          "Slurm job 123456 step 0: node 1 of 2, master gpu07:23456; --nproc 4 from "
          "SLURM_GPUS_ON_NODE");
    CHECK(o.nnodes == 2);
  }
  SUBCASE("auto outside a step, and --no-slurm: nothing") {
    Options o = options({});
    CHECK_FALSE(use_slurm(o, {{"SLURM_JOB_ID", "5"}}).has_value());
    CHECK(o.master_port == 29500);
    Options off = options({"--no-slurm"});
    CHECK_FALSE(use_slurm(off, step_env()).has_value());
    CHECK(off.nnodes == 1);
    CHECK(off.master_addr == "127.0.0.1");
  }
  SUBCASE("auto with --nnodes/--node-rank/--standalone: not used, and said so") {
    Options o = options({"--nnodes", "3", "--node-rank", "2"});
    CHECK(use_slurm(o, step_env()) ==
          "Slurm job 123456 step 0 detected but not used: --nnodes, --node-rank given (pass "
          "--slurm to check them against Slurm's, --no-slurm to silence this)");
    CHECK(o.nnodes == 3);
    Options st = options({"--standalone"});
    CHECK(use_slurm(st, step_env()) ==
          "Slurm job 123456 step 0 detected but not used: --standalone given (pass --slurm to "
          "check it against Slurm's, --no-slurm to silence this)");
  }
  SUBCASE("auto: a bad Slurm environment says how to ignore it") {
    Options o = options({});
    auto env = step_env();
    env["SLURM_NTASKS_PER_NODE"] = "4";
    CHECK_THROWS_WITH_AS(
        use_slurm(o, env),
        "Slurm: SLURM_NTASKS_PER_NODE=4 asks for several tasks per node, but gpurun must run as "
        "one task per node and starts the workers itself: srun --ntasks-per-node=1 gpurun ... "
        "(--nproc sets the workers per node) (gpurun found a Slurm step and reads it by default; "
        "--no-slurm ignores it)",
        gpurun::UsageError);
  }
  SUBCASE("--slurm outside a step, --slurm with --node-rank and no --nnodes") {
    Options o = options({"--slurm"});
    CHECK_THROWS_WITH_AS(
        use_slurm(o, {}),
        "--slurm: not inside a Slurm step (SLURM_JOB_ID and SLURM_STEP_ID must both be set); "
        "start gpurun with srun, one task per node: srun --ntasks-per-node=1 gpurun ...",
        gpurun::UsageError);
    Options r = options({"--slurm", "--node-rank", "1"});  // parse leaves the check to Slurm
    CHECK(use_slurm(r, step_env()).has_value());
    CHECK(r.node_rank == 1);
    Options bad = options({"--slurm", "--nnodes", "2", "--node-rank", "0"});
    CHECK_THROWS_AS(use_slurm(bad, step_env()), gpurun::UsageError);
  }
}

TEST_CASE("slurm: --slurm and --no-slurm on the command line") {
  CHECK(options({}).slurm == SlurmMode::kAuto);
  CHECK(options({"--slurm"}).slurm == SlurmMode::kOn);
  CHECK(options({"--no-slurm"}).slurm == SlurmMode::kOff);
  CHECK(options({"--no_slurm"}).slurm == SlurmMode::kOff);
  CHECK_THROWS_WITH_AS(options({"--slurm", "--no-slurm"}),
                       "--slurm and --no-slurm cannot be combined", gpurun::UsageError);
  CHECK_THROWS_WITH_AS(options({"--slurm=1"}), "flag --slurm takes no value, got '1'",
                       gpurun::UsageError);
  // Without --slurm a --node-rank past the default --nnodes 1 is still refused at parse time.
  CHECK_THROWS_AS(options({"--node-rank", "1"}), gpurun::UsageError);
  const Options o = options({"--nproc", "2", "--nnodes", "1", "--node-rank", "0"});
  CHECK(o.nproc_given);
  CHECK(o.nnodes_given);
  CHECK(o.node_rank_given);
  CHECK_FALSE(options({}).nproc_given);
}
