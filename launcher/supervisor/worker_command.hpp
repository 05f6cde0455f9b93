// Turns the command line's worker command into an argv with a resolved executable.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "supervisor/options.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

/// The worker argv before executable resolution:
///  -m mod args      -> python3 -u -m mod args   (torchrun's --module)
///  script.py args   -> python3 -u script.py args (unless --no-python)
///  anything else    -> as given (a binary, or `python3 train.py`).
/// The interpreter is $PYTHON from `env` when set, else python3.
std::vector<std::string> worker_argv(const Options& options, const EnvMap& env);

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
