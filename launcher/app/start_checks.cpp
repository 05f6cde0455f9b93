#include "app/start_checks.hpp"

#include <sys/stat.h>

#include <fmt/format.h>

#include "app/energy_setup.hpp"  // print_err
#include "gpurun/error.hpp"
#include "nodes/master_address.hpp"
#include "supervisor/worker_command.hpp"

namespace gpurun::app {

namespace sv = gpurun::supervisor;

std::optional<int> place_master(const sv::Options& opt, sv::JobPlan& plan, bool host_by_address,
                                std::vector<std::string>& store_hosts) {
  store_hosts = sv::store_listen_hosts(plan.nnodes, {});
  if (!opt.standalone) {
    const std::string what = opt.master_addr_given || plan.master_addr == "127.0.0.1"
                                 ? "--master-addr"
                                 : "the master address (the first host of Slurm's node list)";
    const sv::AddressCheck addr = sv::check_master_addr(plan.master_addr);
    const bool named_locally = opt.local_addr && *opt.local_addr == plan.master_addr;
    if (host_by_address && addr.result != sv::AddressCheck::Result::kOk && !named_locally)
      plan.node_rank = 1;
    if (addr.result == sv::AddressCheck::Result::kUnresolvable) {
      print_err(
          fmt::format("error: {} '{}' does not resolve: {}", what, plan.master_addr, addr.reason));
      return kExitUsage;
    }
    if (addr.result == sv::AddressCheck::Result::kTimedOut)
      print_err(fmt::format(
          "warning: {} '{}' could not be resolved yet ({}); starting anyway: the workers look it "
          "up again{}",
          what, plan.master_addr, addr.reason,
          plan.node_rank == 0 && plan.nnodes == 1 ? "; the store listens on loopback only" : ""));
    if (plan.node_rank == 0 && addr.result == sv::AddressCheck::Result::kOk) {
      std::vector<std::string> local = addr.addresses;  // when the interfaces cannot be read
      try {
        const std::vector<sv::InterfaceAddress> interfaces = sv::interface_addresses();
        local = sv::local_addresses(addr.addresses, interfaces);
        if (local.empty() && host_by_address && !named_locally) {
          plan.node_rank = 1;  // another host's address: join the node there
        } else if (local.empty()) {
          print_err(
              fmt::format("error: {} '{}' is not this host: {}", what, plan.master_addr,
                          sv::not_this_host_reason(plan.master_addr, addr.addresses, interfaces)));
          return kExitUsage;
        }
      } catch (const gpurun::Error& e) {
        if (host_by_address && !named_locally) {
          plan.node_rank = 1;  // this host's addresses cannot be read: not taken for the host
        } else {
          print_err(fmt::format("warning: {}; not checking that {} '{}' is this host", e.what(),
                                what, plan.master_addr));
        }
      }
      if (plan.node_rank == 0) store_hosts = sv::store_listen_hosts(plan.nnodes, local);
    }
  }
  return std::nullopt;
}

std::optional<int> resolve_worker_command(const sv::Options& opt, const sv::EnvMap& inherited,
                                          std::vector<std::string>& argv) {
  const auto path_it = inherited.find("PATH");
  const auto exe = sv::find_executable(
      argv[0], path_it != inherited.end() ? path_it->second : "/usr/local/bin:/usr/bin:/bin");
  if (!exe) {
    // A path that exists but cannot run is named for what it is (docs/errors.md).
    struct stat st {};
    std::string what = "not found or not executable";
    if (argv[0].find('/') != std::string::npos && ::stat(argv[0].c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode))
        what = "is a directory, not a program";
      else if (!S_ISREG(st.st_mode))
        what = "is not a regular file";
      else
        what = fmt::format(
            "is not executable (mode {:04o}: chmod +x it, or name its interpreter first, e.g. "
            "python3 {})",
            st.st_mode & 07777, argv[0]);
    }
    print_err(fmt::format("error: worker command '{}' {}", argv[0], what));
    return kExitNotFound;
  }
  if (const auto script = sv::missing_script(opt)) {
    print_err(fmt::format("error: worker script '{}' not found or not readable", *script));
    return kExitNotFound;
  }
  argv[0] = *exe;
  return std::nullopt;
}

}  // namespace gpurun::app
