// One rule, one place: the control protocol's keys are spelled and parsed only in the keys
// module (launcher/protocol/keys.cpp, gpurun/control/keys.hpp). This test reads the launcher's
// and the worker runtime's sources and fails on a key literal or a parse of one anywhere else.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;

namespace {

// What only the keys module may write: the literals of the key families gpurun and its workers
// share (docs/control-protocol.md#keys), the path pieces a parser of them would match, and the
// parsers the module absorbed.
constexpr std::string_view kForbidden[] = {
    R"("gpurun/gen)",
    R"("gpurun/slot)",
    R"("gpurun/static)",
    R"("gpurun/generation)",
    R"("gpurun/energy)",
    R"("/joined/)",
    R"("/report/)",
    R"("/decision)",
    R"("/start")",
    R"("/timing/)",
    R"("/parked/)",
    R"("/wake/)",
    R"("/ready/)",
    R"("/admit/)",
    R"("/go/)",
    R"("/error/)",
    "parse_gen_key(",
    "parse_slot_key(",
    "ResizeTimeline::parse_key(",
};

bool keys_module(const fs::path& p) {
  const std::string s = p.generic_string();
  return s.size() >= 28 && (s.ends_with("launcher/protocol/keys.cpp") ||
                            s.ends_with("include/gpurun/control/keys.hpp"));
}

// "path:line: text" for every line of `root`'s C++ sources outside the keys module that holds
// a forbidden string outside a comment.
std::vector<std::string> offences(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const fs::path& p = entry.path();
    const std::string ext = p.extension().string();
    if (!entry.is_regular_file() ||
        (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".c" && ext != ".cc"))
      continue;
    if (keys_module(p)) continue;
    std::ifstream in(p);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::string_view code = line;
      const size_t first = code.find_first_not_of(" \t");
      if (first == std::string_view::npos) continue;
      code.remove_prefix(first);
      if (code.starts_with("//") || code.starts_with("*") || code.starts_with("/*")) continue;
      if (const size_t c = code.find(" //"); c != std::string_view::npos) code = code.substr(0, c);
      for (std::string_view bad : kForbidden)
        if (code.find(bad) != std::string_view::npos) {
          out.push_back(p.string() + ":" + std::to_string(n) + ": " + line);
          break;
        }
    }
  }
  std::sort(out.begin(), out.end());  // the directory's order is unspecified
  return out;
}

}  // namespace

TEST_CASE("no control-protocol key is spelled or parsed outside the keys module") {
  const fs::path src = GPURUN_SOURCE_DIR;
  std::vector<std::string> found;
  for (const char* dir : {"launcher", "worker_runtime"}) {
    REQUIRE(fs::is_directory(src / dir));
    for (std::string& o : offences(src / dir)) found.push_back(std::move(o));
  }
  std::string list;
  for (const std::string& f : found) list += f + "\n";
  INFO("use gpurun/control/keys.hpp (keys::*, keys::parse_worker_write) instead:\n", list);
  CHECK(found.empty());
}

TEST_CASE("the key grammar check sees a key spelled outside the keys module") {
  // The check itself: a source that formats a key and one that parses one are both found.
  const fs::path dir = fs::temp_directory_path() / "gpurun_key_grammar_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "a.cpp") << "// \"gpurun/gen/\" in a comment is fine\n"
                               << "auto k = fmt::format(\"gpurun/gen/{}/start\", g);\n";
  std::ofstream(dir / "b.hpp") << "bool t = ends_with(key, \"/decision\");  // parsed here\n";
  std::ofstream(dir / "c.txt") << "\"gpurun/gen/\" in a text file is not a source\n";
  const std::vector<std::string> found = offences(dir);
  fs::remove_all(dir);
  REQUIRE(found.size() == 2);
  CHECK(found[0].find("gpurun/gen/{}/start") != std::string::npos);
  CHECK(found[1].find("/decision") != std::string::npos);
}
