#include "supervisor/error_file.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace gpurun::supervisor;

TEST_CASE("error file: torch's nested format") {
  auto r = parse_error_file(R"({"message": {"message": "ValueError: bad lr",
      "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File x\nValueError: bad lr\n",
                    "timestamp": "1738324800"}}})");
  REQUIRE(r);
  CHECK(r->message == "ValueError: bad lr");
  CHECK(r->traceback.find("Traceback") == 0);
  CHECK(r->timestamp == "1738324800");
}

TEST_CASE("error file: flat format and rejects") {
  auto r = parse_error_file(R"({"message": "segfault in rank 2"})");
  REQUIRE(r);
  CHECK(r->message == "segfault in rank 2");
  CHECK(r->traceback.empty());
  CHECK_FALSE(parse_error_file(""));
  CHECK_FALSE(parse_error_file("{not json"));
  CHECK_FALSE(parse_error_file(R"({"other": 1})"));
  CHECK_FALSE(parse_error_file(R"([1, 2])"));
  CHECK_FALSE(parse_error_file(R"({"message": 5})"));
  CHECK_FALSE(read_error_file("/nonexistent/error.json"));
}

namespace {
/// A scratch directory removed at the end of the test.
struct Scratch {
  std::filesystem::path path;
  Scratch() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "gpurun-error-file-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& content) const {
    const auto p = path / name;
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
};

/// What the summary shows for `path`: "<not written>" when read_error_file says so.
std::string shown(const std::string& path) {
  const auto r = read_error_file(path);
  return r ? r->message : "<not written>";
}
}  // namespace

TEST_CASE("error file: a file that exists but holds no report says what is wrong with it") {
  Scratch dir;
  SUBCASE("missing: not written") {
    CHECK(shown((dir.path / "error.json").string()) == "<not written>");
  }
  SUBCASE("not valid JSON: where the parser stopped and the first bytes") {
    const std::string f = dir.write("error.json", "{\"message\": oops}");
    CHECK(shown(f) == "error file " + f +
                          " is not valid JSON (syntax error at line 1, column 13); first bytes: "
                          "'{\"message\": oops}'");
  }
  SUBCASE("cut short (a worker killed while writing)") {
    const std::string f = dir.write("error.json", "{\"message\": {\"message\": \"Val");
    CHECK(shown(f).find("error file " + f + " is not valid JSON (") == 0);
  }
  SUBCASE("a directory") {
    std::filesystem::create_directory(dir.path / "error.json");
    const std::string f = (dir.path / "error.json").string();
    CHECK(shown(f) == "error file " + f + " is a directory, not a file");
  }
  SUBCASE("20 MB: over the limit, with its first bytes") {
    const std::string f = dir.write("error.json", "{\"message\": \"x\"}\n\x01");
    std::filesystem::resize_file(f, 20u << 20);          // sparse: the rest reads as NULs
    std::string first = "{\"message\": \"x\"}\\n\\x01";  // 18 bytes, then NULs up to 64
    for (int i = 18; i < 64; ++i) first += "\\x00";
    CHECK(shown(f) == "error file " + f +
                          " is 20971520 bytes, over the 1048576-byte limit; first bytes: '" +
                          first + "...'");
  }
  SUBCASE("empty") {
    const std::string f = dir.write("error.json", "");
    CHECK(shown(f) == "error file " + f + " is empty (the worker may have died while writing it)");
  }
  SUBCASE("valid JSON but not torch's format") {
    const std::string f = dir.write("error.json", R"({"error": "boom"})");
    CHECK(shown(f) == "error file " + f +
                          " is JSON but not torch's error format (no \"message\" with text); "
                          "first bytes: '{\"error\": \"boom\"}'");
  }
  SUBCASE("a FIFO is not opened (it would block)") {
    const std::string f = (dir.path / "error.json").string();
    REQUIRE(::mkfifo(f.c_str(), 0600) == 0);
    CHECK(shown(f) == "error file " + f + " is not a regular file (a FIFO)");
  }
  SUBCASE("a good file still parses") {
    const std::string f = dir.write("error.json", R"({"message": "segfault in rank 2"})");
    const auto r = read_error_file(f);
    REQUIRE(r);
    CHECK(r->message == "segfault in rank 2");
  }
}
