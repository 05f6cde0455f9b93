// Turns the command line's worker command into an argv with a resolved executable.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "supervisor/options.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

/// The worker argv before executable resolution:
///  -m mod args      -> python3 -u -m mod args   (torchrun's --module)
///  script.py args   -> python3 -u script.py args (unless --no-python)
///  anything else    -> as given (a binary, or `python3 train.py`).
/// The interpreter is worker_python().
std::vector<std::string> worker_argv(const Options& options, const EnvMap& env);

/// The interpreter of the workers' Python: the one the line named before `-m
/// torch.distributed.launch` (Options::python), else $PYTHON_EXEC (torchrun's), else $PYTHON,
/// else python3 (found on the PATH).
std::string worker_python(const Options& options, const EnvMap& env);

/// torch.distributed.launch's local-rank argument for the torch version `torch_version`
/// ("2.1.0", "1.13.0a0+git…"): "--local_rank" before 2.0, "--local-rank" from 2.0 on (torch
/// 2.0 renamed it; its scripts' argparse takes both) and when the version is unknown ("").
std::string local_rank_argument(std::string_view torch_version);

/// Options::local_rank_argument for this line: "" in torchrun's shape or with --use-env, else
/// local_rank_argument() of the torch that worker_python() imports. Finding that runs the
/// interpreter once (importlib.metadata, no torch import: ~0.1 s), bounded by 10 s; an
/// interpreter that cannot say (no torch, not found, too slow) gets "--local-rank". Blocks.
std::string local_rank_argument_for(const Options& options, const EnvMap& env);

/// Resolves `name` like execvp: a name containing '/' is used as is (it must
/// be an executable file), else each directory of `path_env` is searched.
/// Returns nullopt when nothing executable is found.
std::optional<std::string> find_executable(const std::string& name, const std::string& path_env);

/// The script a `script.py` command runs through the interpreter (not with -m or
/// --no-python), when it is not a readable file relative to the current directory;
/// nullopt otherwise. gpurun then exits 127 like for a missing executable, instead of
/// starting every worker only for python to exit 2.
std::optional<std::string> missing_script(const Options& options);

}  // namespace gpurun::supervisor
