#include "control/dcgm_job_files.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::control {

namespace fs = std::filesystem;

DcgmJobFiles::DcgmJobFiles(std::string dir, std::string job)
    : dir_(std::move(dir)), job_(std::move(job)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw Error(
        fmt::format("--dcgm-job-dir {}: cannot use it as a directory for DCGM exporter's "
                    "job files: {}",
                    dir_, ec ? ec.message() : "it is not a directory"));
}

DcgmJobFiles::~DcgmJobFiles() {
  for (const std::string& gpu : std::set<std::string>(written_)) remove(gpu);
}

std::string DcgmJobFiles::remove(const std::string& gpu) {
  const fs::path path = fs::path(dir_) / gpu;
  std::optional<FileContent> now;
  try {
    now = read_regular_file_if_exists(path, 4096, "the DCGM job file");
  } catch (const Error&) {  // not ours any more (replaced by something else): left alone
  }
  written_.erase(gpu);
  if (!now || now->bytes != job_ + "\n") return {};  // gone, or another job's id now
  std::error_code ec;
  fs::remove(path, ec);
  return ec ? fmt::format("cannot remove the DCGM job file {}: {}", path.string(), ec.message())
            : std::string();
}

std::string DcgmJobFiles::update(const std::set<std::string>& gpus) {
  std::string error;
  for (const std::string& gpu : std::set<std::string>(written_))
    if (gpus.count(gpu) == 0)
      if (std::string e = remove(gpu); !e.empty() && error.empty()) error = e;
  for (const std::string& gpu : gpus) {
    if (written_.count(gpu) != 0) continue;
    const fs::path path = fs::path(dir_) / gpu;
    const fs::path tmp = fs::path(dir_) / fmt::format(".{}.gpurun-tmp.{}", gpu, ::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << job_ << '\n';
      out.close();
      if (!out) {
        std::error_code ignored;
        fs::remove(tmp, ignored);
        if (error.empty())
          error = fmt::format("cannot write the DCGM job file {}: {}", tmp.string(),
                              std::generic_category().message(errno));
        continue;
      }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
      if (error.empty())
        error = fmt::format("cannot write the DCGM job file {}: {}", path.string(), ec.message());
      continue;
    }
    written_.insert(gpu);
  }
  return error;
}

}  // namespace gpurun::control
