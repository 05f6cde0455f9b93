#include "supervisor/worker_env.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/cli.hpp"
#include "gpurun/error.hpp"
#include "gpurun_process.hpp"  // TempDir
#include "supervisor/gpu_inventory.hpp"
#include "supervisor/slurm.hpp"
#include "supervisor/worker_command.hpp"

using namespace gpurun::supervisor;

namespace {
JobPlan plan_for(std::vector<std::string> args, const EnvMap& env, int gpus = 0) {
  args.push_back("./train");
  Options o = parse(args);
  return make_plan(
      o, env, [gpus] { return gpus; }, [] { return 6; }, [] { return std::string("uuid-1"); });
}
}  // namespace

TEST_CASE("env: torchrun's variables per rank") {
  JobPlan plan = plan_for({"--nproc", "4", "--device", "cpu", "--max-restarts", "2"},
                          {{"PATH", "/bin"}, {"RANK", "99"}});
  plan.master_port = 41000;
  plan.run_dir = "/tmp/run";
  EnvMap env = build_worker_env(plan, 3, 1, {{"PATH", "/bin"}, {"RANK", "99"}});
  const EnvMap expected_subset = {
      {"PATH", "/bin"},
      {"RANK", "3"},
      {"LOCAL_RANK", "3"},
      {"WORLD_SIZE", "4"},
      {"LOCAL_WORLD_SIZE", "4"},
      {"GROUP_RANK", "0"},
      {"GROUP_WORLD_SIZE", "1"},
      {"ROLE_RANK", "3"},
      {"ROLE_WORLD_SIZE", "4"},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "41000"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_RUN_ID", "none"},
      {"TORCHELASTIC_RESTART_COUNT", "1"},
      {"TORCHELASTIC_MAX_RESTARTS", "2"},
      {"TORCHELASTIC_ERROR_FILE", "/tmp/run/attempt_1/3/error.json"},
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "1"},
      {"GPURUN_RUN_ID", "none"},
      {"GPURUN_STORE_ADDR", "127.0.0.1"},
      {"GPURUN_STORE_PORT", "41000"},
      {"GPURUN_SLOT", "3"},
      {"GPURUN_LOCAL_SLOT", "3"},
      {"GPURUN_DEVICE", "cpu"},
      {"GPURUN_RUN_DIR", "/tmp/run"},
      // /dev/shm here (a writable directory on Linux); the run dir where there is none
      {"GPURUN_SNAPSHOT_PATH", gpurun::supervisor::snapshot_path("/tmp/run")},
  };
  for (const auto& kv : expected_subset) {
    const auto& k = kv.first;  // named: clang 14 cannot capture a binding in CAPTURE's lambda
    const auto& v = kv.second;
    CAPTURE(k);
    REQUIRE(env.count(k));
    CHECK(env.at(k) == v);
  }
  CHECK_FALSE(env.count("GPURUN_GPU_ID"));  // --device cpu has no GPU
  const bool shm = ::access("/dev/shm", W_OK) == 0;
  CHECK(env.count("GPURUN_SNAPSHOT_FALLBACK_PATH") == (shm ? 1u : 0u));
  CHECK(env.size() == expected_subset.size() + (shm ? 1 : 0));
  CHECK(env.at("GPURUN_SNAPSHOT_PATH") ==
        (::access("/dev/shm", W_OK) == 0
             ? "/dev/shm/gpurun-" + std::to_string(::getuid()) + "-run.snapshot"
             : "/tmp/run/state.snapshot"));
}

TEST_CASE("env: the pause snapshot falls back from /dev/shm to the run directory") {
  // The bug this covers: with a full /dev/shm the pause snapshot could not be written and the
  // worker had nowhere else to put it (the state was lost at the resume).
  JobPlan plan = plan_for({"--nproc", "1", "--device", "cpu"}, {});
  gpurun::testing::TempDir run("gpurun-envrun");
  plan.run_dir = run.path.string();
  const EnvMap env = build_worker_env(plan, 0, 0, {{"GPURUN_SNAPSHOT_FALLBACK_PATH", "/stale"}});
  const std::string primary = env.at("GPURUN_SNAPSHOT_PATH");
  const std::string in_run_dir = plan.run_dir + "/state.snapshot";
  if (primary.rfind("/dev/shm/", 0) == 0) {
    REQUIRE(env.count("GPURUN_SNAPSHOT_FALLBACK_PATH"));
    CHECK(env.at("GPURUN_SNAPSHOT_FALLBACK_PATH") == in_run_dir);
    CHECK(snapshot_fallback_path(plan.run_dir) == in_run_dir);
  } else {  // no /dev/shm: the primary is the run directory's file already
    CHECK(primary == in_run_dir);
    CHECK_FALSE(env.count("GPURUN_SNAPSHOT_FALLBACK_PATH"));  // the inherited one is dropped
    CHECK(snapshot_fallback_path(plan.run_dir).empty());
  }

  // gpurun's exit removes both files and the writer's temporaries next to each.
  const std::vector<std::string> files = {primary, primary + ".tmp.12.0", in_run_dir,
                                          in_run_dir + ".tmp.34.1"};
  for (const auto& f : files) std::ofstream(f) << "state";
  std::ofstream(plan.run_dir + "/rank0.log") << "kept";
  remove_snapshot(plan.run_dir);
  for (const auto& f : files) {
    CAPTURE(f);
    CHECK_FALSE(std::filesystem::exists(f));
  }
  CHECK(std::filesystem::exists(plan.run_dir + "/rank0.log"));
}

TEST_CASE("env: inherited values win where torchrun lets them") {
  const EnvMap inherited = {{"OMP_NUM_THREADS", "8"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}};
  JobPlan plan = plan_for({"--nproc", "2", "--device", "cpu"}, inherited);
  CHECK_FALSE(plan.set_omp_num_threads);
  EnvMap env = build_worker_env(plan, 0, 0, inherited);
  CHECK(env.at("OMP_NUM_THREADS") == "8");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "3");
}

TEST_CASE("env: OMP_NUM_THREADS only set for nproc > 1") {
  CHECK_FALSE(plan_for({"--nproc", "1", "--device", "cpu"}, {}).set_omp_num_threads);
  CHECK(plan_for({"--nproc", "2", "--device", "cpu"}, {}).set_omp_num_threads);
  JobPlan one = plan_for({"--nproc", "1", "--device", "cpu"}, {});
  CHECK_FALSE(build_worker_env(one, 0, 0, {}).count("OMP_NUM_THREADS"));
}

TEST_CASE("env: multi-node ranks and standalone") {
  JobPlan plan = plan_for({"--nnodes", "3", "--node-rank", "2", "--nproc", "2", "--device", "cpu",
                           "--master-addr", "node0"},
                          {});
  EnvMap env = build_worker_env(plan, 1, 0, {});
  CHECK(env.at("RANK") == "5");
  CHECK(env.at("LOCAL_RANK") == "1");
  CHECK(env.at("WORLD_SIZE") == "6");
  CHECK(env.at("GROUP_RANK") == "2");
  CHECK(env.at("GROUP_WORLD_SIZE") == "3");
  CHECK(env.at("MASTER_ADDR") == "node0");

  JobPlan sa = plan_for({"--standalone", "--device", "cpu"}, {});
  CHECK(sa.master_addr == "localhost");
  CHECK(sa.master_port == 0);
  CHECK(sa.run_id == "uuid-1");
  CHECK(plan_for({"--standalone", "--run-id", "r7", "--device", "cpu"}, {}).run_id == "r7");
}

TEST_CASE("env: CUDA_VISIBLE_DEVICES maps slots to entries verbatim") {
  const EnvMap inherited = {
      {"CUDA_VISIBLE_DEVICES", " 3, GPU-8f1e2d3c-aaaa-bbbb-cccc-0123456789ab ,MIG-1b2c3d4e-5f60 "}};
  JobPlan plan = plan_for({"--nproc", "3"}, inherited, /*gpus=*/0);
  REQUIRE(plan.gpu_ids.size() == 3);
  CHECK(plan.gpu_ids[0] == "3");
  CHECK(plan.gpu_ids[1] == "GPU-8f1e2d3c-aaaa-bbbb-cccc-0123456789ab");
  CHECK(plan.gpu_ids[2] == "MIG-1b2c3d4e-5f60");
  EnvMap env = build_worker_env(plan, 1, 0, inherited);
  CHECK(env.at("GPURUN_GPU_ID") == "GPU-8f1e2d3c-aaaa-bbbb-cccc-0123456789ab");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == inherited.at("CUDA_VISIBLE_DEVICES"));  // unchanged
  CHECK(env.at("GPURUN_DEVICE") == "cuda");

  SUBCASE("fewer slots than entries use the first ones") {
    JobPlan two = plan_for({"--nproc", "2"}, {{"CUDA_VISIBLE_DEVICES", "5,6,7"}});
    CHECK(two.gpu_ids == std::vector<std::string>{"5", "6"});
  }
  SUBCASE("nproc gpu counts the entries") {
    CHECK(plan_for({"--nproc", "gpu"}, {{"CUDA_VISIBLE_DEVICES", "5,6,7"}}).nproc == 3);
    CHECK(plan_for({"--nproc", "auto"}, {{"CUDA_VISIBLE_DEVICES", "5"}}).nproc == 1);
    CHECK(plan_for({"--nproc", "auto", "--device", "cpu"}, {{"CUDA_VISIBLE_DEVICES", "5"}}).nproc ==
          6);
    CHECK_THROWS_WITH_AS(plan_for({"--nproc", "auto"}, {{"CUDA_VISIBLE_DEVICES", ""}}),
                         "--nproc auto: no GPU visible (CUDA_VISIBLE_DEVICES empty or no "
                         "driver); use --device cpu",
                         gpurun::UsageError);
  }
}

TEST_CASE("env: without CUDA_VISIBLE_DEVICES slots are physical GPU ids") {
  JobPlan plan = plan_for({"--nproc", "2"}, {}, /*gpus=*/4);
  CHECK(plan.gpu_ids == std::vector<std::string>{"0", "1"});
  CHECK(plan_for({"--nproc", "gpu"}, {}, 4).nproc == 4);
  CHECK(plan_for({"--nproc", "cpu", "--device", "cpu"}, {}).nproc == 6);
}

TEST_CASE("env: more slots than GPUs is a usage error, not with --device cpu") {
  CHECK_THROWS_WITH_AS(
      plan_for({"--nproc", "3"}, {{"CUDA_VISIBLE_DEVICES", "0,1"}}),
      "--nproc 3 needs 3 GPUs but only 2 are visible (CUDA_VISIBLE_DEVICES='0,1'); lower --nproc "
      "or use --device cpu",
      gpurun::UsageError);
  CHECK_THROWS_WITH_AS(plan_for({"--nproc", "2"}, {}, 0),
                       "--nproc 2 needs 2 GPUs but only 0 are visible (counted with nvidia-smi -L "
                       "/ /proc/driver/nvidia/gpus); lower --nproc or use --device cpu",
                       gpurun::UsageError);
  CHECK_THROWS_AS(plan_for({"--nproc", "gpu"}, {{"CUDA_VISIBLE_DEVICES", ""}}), gpurun::UsageError);
  CHECK(plan_for({"--nproc", "8", "--device", "cpu"}, {{"CUDA_VISIBLE_DEVICES", "0"}}).nproc == 8);
}

TEST_CASE("env: a GPU named twice in CUDA_VISIBLE_DEVICES is a usage error naming it") {
  CHECK_THROWS_WITH_AS(plan_for({"--nproc", "2"}, {{"CUDA_VISIBLE_DEVICES", "0,0"}}),
                       "CUDA_VISIBLE_DEVICES='0,0' names GPU 0 twice (entries 0 and 1): every "
                       "worker needs a GPU of its own; list each GPU once",
                       gpurun::UsageError);
  CHECK_THROWS_WITH_AS(plan_for({"--nproc", "gpu"}, {{"CUDA_VISIBLE_DEVICES", "3, 1,3"}}),
                       "CUDA_VISIBLE_DEVICES='3, 1,3' names GPU 3 twice (entries 0 and 2): every "
                       "worker needs a GPU of its own; list each GPU once",
                       gpurun::UsageError);
  CHECK_THROWS_WITH_AS(plan_for({"--nproc", "2"}, {{"CUDA_VISIBLE_DEVICES", "0,00"}}),
                       "CUDA_VISIBLE_DEVICES='0,00' names GPU 0 twice (entries 0 and 1): every "
                       "worker needs a GPU of its own; list each GPU once",
                       gpurun::UsageError);  // an index is a number to CUDA
  CHECK(plan_for({"--nproc", "2"}, {{"CUDA_VISIBLE_DEVICES", "1,0"}}).gpu_ids ==
        std::vector<std::string>{"1", "0"});
  // --device cpu trains on no GPU: the list is not used.
  CHECK(plan_for({"--nproc", "2", "--device", "cpu"}, {{"CUDA_VISIBLE_DEVICES", "0,0"}}).nproc ==
        2);
}

TEST_CASE("gpu inventory: parsing CUDA_VISIBLE_DEVICES") {
  CHECK(parse_visible_devices("").empty());
  CHECK(parse_visible_devices("  ").empty());
  CHECK(parse_visible_devices("0") == std::vector<std::string>{"0"});
  CHECK(parse_visible_devices("1,0, 2 ") == std::vector<std::string>{"1", "0", "2"});
  CHECK(parse_visible_devices("MIG-a,GPU-b") == std::vector<std::string>{"MIG-a", "GPU-b"});
  int calls = 0;
  auto count = [&] {
    ++calls;
    return 2;
  };
  CHECK(slot_gpu_ids(std::string("7"), count) == std::vector<std::string>{"7"});
  CHECK(calls == 0);  // the driver is not asked when the user chose the GPUs
  CHECK(slot_gpu_ids(std::nullopt, count) == std::vector<std::string>{"0", "1"});
  CHECK(calls == 1);
}

TEST_CASE("env: workers keep only the job-level SLURM_* variables (docs/cli.md#slurm)") {
  const EnvMap inherited = {
      {"PATH", "/bin"},
      {"SLURM_JOB_ID", "123456"},
      {"SLURM_JOB_NAME", "train"},
      {"SLURM_ARRAY_JOB_ID", "123400"},
      {"SLURM_ARRAY_TASK_ID", "56"},
      {"SLURM_CLUSTER_NAME", "c1"},
      {"SLURM_SUBMIT_DIR", "/home/u"},
      {"SLURM_CONF", "/etc/slurm/slurm.conf"},
      // what makes a worker look like a Slurm task (Lightning's SLURMEnvironment.detect()
      // reads SLURM_NTASKS; its ranks come from SLURM_PROCID/SLURM_LOCALID/SLURM_NODEID)
      {"SLURM_NTASKS", "2"},
      {"SLURM_NPROCS", "2"},
      {"SLURM_PROCID", "1"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_NODEID", "1"},
      {"SLURM_STEP_ID", "0"},
      {"SLURM_STEP_NODELIST", "gpu[07-08]"},
      {"SLURM_NTASKS_PER_NODE", "1"},
      {"SLURM_GPUS_ON_NODE", "4"},
      {"SLURM_", "x"},
      {"SLURMD_NODENAME", "gpu08"},  // not SLURM_*: kept
      {"MY_SLURM_NTASKS", "7"},      // not SLURM_*: kept
  };
  JobPlan plan = plan_for({"--nproc", "2", "--device", "cpu"}, inherited);
  plan.run_dir = "/tmp/run";
  const EnvMap env = build_worker_env(plan, 1, 0, inherited);
  std::vector<std::string> slurm;
  for (const auto& [k, v] : env)
    if (k.rfind("SLURM", 0) == 0 || k.find("SLURM_") != std::string::npos) slurm.push_back(k);
  CHECK(slurm == std::vector<std::string>{"MY_SLURM_NTASKS", "SLURMD_NODENAME",
                                          "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                                          "SLURM_CLUSTER_NAME", "SLURM_CONF", "SLURM_JOB_ID",
                                          "SLURM_JOB_NAME", "SLURM_SUBMIT_DIR"});
  CHECK(env.at("SLURM_JOB_ID") == "123456");
  CHECK(env.at("PATH") == "/bin");
  CHECK(env.at("RANK") == "1");
  // Same list, in the order slurm_vars_for_workers() documents (sorted).
  CHECK(slurm_vars_for_workers() ==
        std::vector<std::string>{"SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_CLUSTER_NAME",
                                 "SLURM_CONF", "SLURM_JOB_ID", "SLURM_JOB_NAME",
                                 "SLURM_SUBMIT_DIR"});
}

TEST_CASE("env: --role, --signals-to-handle and --virtual-local-rank reach the workers") {
  JobPlan plan = plan_for({"--nproc", "2", "--role", "trainer", "--signals-to-handle",
                           "SIGTERM,SIGUSR1", "--virtual-local-rank"},
                          {{"CUDA_VISIBLE_DEVICES", "3,5"}}, 8);
  plan.master_port = 41000;
  plan.run_dir = "/tmp/run";
  const EnvMap env = build_worker_env(plan, 1, 0, {{"CUDA_VISIBLE_DEVICES", "3,5"}});
  CHECK(env.at("ROLE_NAME") == "trainer");
  CHECK(env.at("TORCHELASTIC_SIGNALS_TO_HANDLE") == "SIGTERM,SIGUSR1");
  CHECK(env.at("LOCAL_RANK") == "0");            // torchrun's virtual local rank
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "5");  // only its own GPU
  CHECK(env.at("RANK") == "1");
  JobPlan plain = plan_for({"--nproc", "2"}, {{"CUDA_VISIBLE_DEVICES", "3,5"}}, 8);
  plain.run_dir = "/tmp/run";
  const EnvMap p1 = build_worker_env(plain, 1, 0, {{"CUDA_VISIBLE_DEVICES", "3,5"}});
  CHECK(p1.at("LOCAL_RANK") == "1");
  CHECK(p1.at("CUDA_VISIBLE_DEVICES") == "3,5");
  CHECK(p1.at("ROLE_NAME") == "default");
}

TEST_CASE("env: elastic spawn — a joiner of a known generation gets that generation's values") {
  using gpurun::control::Decision;
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 3;
  d.active = {1, 3};  // not a prefix 0..k-1: slot 3 is rank 1 of 2
  d.joiners = {3};
  d.park_mode = gpurun::control::ParkMode::kHold;
  ElasticSpawn s;
  s.slot = 3;
  s.generation = 3;
  s.config_path = "/jobs/a/config.toml";
  const EnvMap env = elastic_worker_env(d, s);
  const EnvMap want = {{"RANK", "1"},
                       {"WORLD_SIZE", "2"},
                       {"LOCAL_WORLD_SIZE", "2"},
                       {"GROUP_RANK", "0"},
                       {"GROUP_WORLD_SIZE", "1"},
                       {"ROLE_RANK", "1"},
                       {"ROLE_WORLD_SIZE", "2"},
                       {"GPURUN_SLOT", "3"},
                       {"GPURUN_ELASTIC", "1"},
                       {"GPURUN_JOIN_GENERATION", "3"},
                       {"GPURUN_ACTIVE_GPUS", "1,3"},
                       {"GPURUN_PARK_MODE", "hold"},
                       {"GPURUN_CONFIG", "/jobs/a/config.toml"}};
  CHECK(env == want);
  // The same values the runtimes set at every generation: one rule; but LOCAL_RANK at the
  // start is the slot's device index (cuda:LOCAL_RANK must be this slot's GPU).
  for (const auto& [k, v] : gpurun::control::generation_env(d, 3))
    if (k != "LOCAL_RANK") CHECK(env.at(k) == v);
  // build_worker_env's slot values are overridden by the overlay (Supervisor::launch).
  JobPlan plan = plan_for({"--nproc", "4", "--device", "cpu"}, {});
  EnvMap full = build_worker_env(plan, 3, 0, {});
  for (const auto& [k, v] : env) full[k] = v;
  CHECK(full.at("RANK") == "1");
  CHECK(full.at("LOCAL_RANK") == "3");   // the device index at the start: slot 3's GPU
  CHECK(full.at("GPURUN_SLOT") == "3");  // the device stays the slot's
}

TEST_CASE("env: elastic spawn — a warm joiner or standby keeps the provisional world") {
  using gpurun::control::Decision;
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 2;
  d.active = {0, 2};
  d.joiners = {2};
  ElasticSpawn s;
  s.slot = 2;
  s.warm = 5;
  s.standby = true;
  const EnvMap env = elastic_worker_env(d, s);
  CHECK(env.at("RANK") == "1");
  CHECK(env.at("WORLD_SIZE") == "2");
  CHECK(env.at("GPURUN_WARM") == "5");
  CHECK(env.at("GPURUN_STANDBY") == "1");
  CHECK(env.count("LOCAL_RANK") == 0);  // the slot's, from build_worker_env
  CHECK(env.count("GPURUN_JOIN_GENERATION") == 0);
  CHECK(env.count("GPURUN_CONFIG") == 0);  // no config path given
}

TEST_CASE("env: elastic spawn — another node's slot: job slot id for keys, local one for the GPU") {
  using gpurun::control::Decision;
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 6;
  d.active = {0, 1, 1001};  // node 1's local slot 0 is out: 1001 is the first of its node
  d.joiners = {1001};
  ElasticSpawn s;
  s.slot = 1001;  // node 1's local slot 1, spawned by node 1's gpurun as its local slot 1
  s.generation = 6;
  JobPlan plan = plan_for({"--nproc", "2", "--device", "cpu"}, {});
  EnvMap env = build_worker_env(plan, 1, 0, {});
  for (const auto& [k, v] : elastic_worker_env(d, s)) env[k] = v;
  CHECK(env.at("GPURUN_SLOT") == "1001");     // its keys: gpurun/slot/1001/…
  CHECK(env.at("GPURUN_LOCAL_SLOT") == "1");  // its device: cuda:1 on its node
  CHECK(env.at("LOCAL_RANK") == "1");         // at the start, the device index
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("WORLD_SIZE") == "3");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "1");  // node 1's active slots
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("GROUP_WORLD_SIZE") == "2");
  CHECK(env.at("GPURUN_ACTIVE_GPUS") == "0,1,1001");

  // A warm joiner of node 1: its provisional LOCAL_WORLD_SIZE counts its node's slots only.
  d.active = {0, 1, 1000, 1001};
  s.slot = 1000;
  s.warm = 2;
  env = build_worker_env(plan, 0, 0, {});
  for (const auto& [k, v] : elastic_worker_env(d, s)) env[k] = v;
  CHECK(env.at("GPURUN_SLOT") == "1000");
  CHECK(env.at("GPURUN_LOCAL_SLOT") == "0");
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("WORLD_SIZE") == "4");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
}

TEST_CASE("launch lines: the local-rank argument follows the workers' torch, as torch's did") {
  // torch 2.0 renamed torch.distributed.launch's --local_rank to --local-rank.
  CHECK(local_rank_argument("1.13.0a0+gitunknown") == "--local_rank");
  CHECK(local_rank_argument("1.9.0") == "--local_rank");
  CHECK(local_rank_argument("2.0.0") == "--local-rank");
  CHECK(local_rank_argument("2.11.0+cu130\n") == "--local-rank");
  CHECK(local_rank_argument("") == "--local-rank");
  CHECK(local_rank_argument("garbage") == "--local-rank");

  // The interpreter the line names is asked, once; it prints the version importlib finds.
  gpurun::testing::TempDir dir("gpurun-launch");
  auto python_printing = [&](const std::string& name, const std::string& body) {
    const std::string path = dir.str() + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path;
  };
  Options o = parse({"-m", "torch.distributed.launch", "train.py"});
  o.python = python_printing("python-113", "echo 1.13.1");
  CHECK(local_rank_argument_for(o, {}) == "--local_rank");
  o.python = python_printing("python-25", "echo 2.5.1+cu124");
  CHECK(local_rank_argument_for(o, {}) == "--local-rank");
  o.python = python_printing("python-notorch", "echo 'No module named torch' >&2; exit 1");
  CHECK(local_rank_argument_for(o, {}) == "--local-rank");
  o.python = dir.str() + "/no-such-python";
  CHECK(local_rank_argument_for(o, {}) == "--local-rank");
  // $PYTHON_EXEC, as for the workers, when the line names no interpreter.
  Options bare = parse({"-m", "torch.distributed.launch", "train.py"});
  CHECK(local_rank_argument_for(
            bare, {{"PYTHON_EXEC", python_printing("exec-113", "echo 1.13.0")}}) == "--local_rank");
  // --use-env and torchrun's shape: no argument, and the interpreter is not run.
  const std::string marker = dir.str() + "/ran";
  o = parse({"-m", "torch.distributed.launch", "--use_env", "train.py"});
  o.python = python_printing("python-marks", "touch " + marker + "; echo 1.13.0");
  CHECK(local_rank_argument_for(o, {}) == "");
  o.launch_shape = false;
  o.use_env = false;
  CHECK(local_rank_argument_for(o, {}) == "");
  CHECK_FALSE(std::filesystem::exists(marker));
  // The workers run the interpreter the line named, ahead of $PYTHON_EXEC.
  Options named = parse({"/opt/py/python3.11", "-m", "torch.distributed.launch", "train.py"});
  CHECK(worker_argv(named, {{"PYTHON_EXEC", "/usr/bin/python3"}}) ==
        std::vector<std::string>{"/opt/py/python3.11", "-u", "train.py"});
  CHECK(worker_argv(bare, {{"PYTHON_EXEC", "/usr/bin/python3"}, {"PYTHON", "/x/python"}}) ==
        std::vector<std::string>{"/usr/bin/python3", "-u", "train.py"});
}
