#include "supervisor/console.hpp"

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

using namespace gpurun::supervisor;

namespace {
/// Records every put() in order: "1:text" for stdout, "2:text" for stderr.
struct OrderedConsole : Console {
  std::vector<std::string> puts;
  bool is_terminal(StreamId) const override { return true; }

 protected:
  void put(StreamId s, std::string_view text) override {
    puts.push_back(std::to_string(static_cast<int>(s)) + ":" + std::string(text));
  }
};
}  // namespace

TEST_CASE("console: an open line (a bar) is ended with \\n before anyone else's line") {
  OrderedConsole c;
  c.write_from(StreamId::kStdout, "\r[rank0]: 10%", 0, true);
  c.write_from(StreamId::kStdout, "\r[rank0]: 20%", 0, true);  // same source: redraw in place
  c.write_from(StreamId::kStdout, "[rank1]: loss 1\n", 2, false);
  c.write_from(StreamId::kStdout, "\r[rank0]: 30%", 0, true);
  c.write(StreamId::kStderr, "gpurun: note\n");  // gpurun's own line, on the other stream
  c.write_from(StreamId::kStdout, "\r[rank0]: 40%", 0, true);
  c.write_from(StreamId::kStdout, "\r[rank0]: 100%\n", 0, false);  // its end: no extra \n
  c.write_from(StreamId::kStdout, "[rank1]: bye\n", 2, false);
  CHECK(c.puts == std::vector<std::string>{"1:\r[rank0]: 10%", "1:\r[rank0]: 20%",
                                           "1:\n[rank1]: loss 1\n", "1:\r[rank0]: 30%", "1:\n",
                                           "2:gpurun: note\n", "1:\r[rank0]: 40%",
                                           "1:\r[rank0]: 100%\n", "1:[rank1]: bye\n"});
}

TEST_CASE("console: the other stream of the same rank also ends the open line") {
  OrderedConsole c;
  c.write_from(StreamId::kStderr, "\r[rank0]: 10%", 1, true);
  c.write_from(StreamId::kStdout, "[rank0]: out\n", 0, false);
  CHECK(c.puts == std::vector<std::string>{"2:\r[rank0]: 10%", "2:\n", "1:[rank0]: out\n"});
}
