#include "supervisor/error_file.hpp"

#include <doctest/doctest.h>

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
