// Replays bytes that torch's own Python TCPStore client sent to torch's own
// TCPStore server (recorded on torch 2.11 and 1.13 by scripts/conformance/record_relay.py)
// against gpurun's store, and compares every reply byte for byte.
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "testing/store_server.hpp"

namespace gpurun::store {
namespace {

using testing::RawConn;
using testing::TestServer;

struct Chunk {
  int conn = 0;
  bool to_server = true;
  std::string bytes;
  std::string context;  // the last '#' comment before the chunk: the operation
  int line = 0;
};

std::string unhex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string tohex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

// Reads a fixture; consecutive chunks of one connection and direction are merged,
// since TCP may split or coalesce them differently on replay.
std::vector<Chunk> load_fixture(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open fixture " << path);
  std::vector<Chunk> chunks;
  std::string line, context;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line.rfind("#   ->", 0) != 0) context = line.substr(2);
      continue;
    }
    std::istringstream ls(line);
    Chunk c;
    std::string dir, hex;
    ls >> c.conn >> dir >> hex;
    REQUIRE_MESSAGE((dir == "c2s" || dir == "s2c"), path << ":" << lineno << ": bad direction");
    c.to_server = dir == "c2s";
    c.bytes = unhex(hex);
    c.context = context;
    c.line = lineno;
    if (!chunks.empty() && chunks.back().conn == c.conn && chunks.back().to_server == c.to_server) {
      chunks.back().bytes += c.bytes;
    } else {
      chunks.push_back(std::move(c));
    }
  }
  return chunks;
}

// Replays `fixture` against a fresh gpurun store; returns the number of replies compared.
int replay(const std::string& fixture) {
  const auto chunks = load_fixture(fixture);
  REQUIRE(chunks.size() > 20);

  TestServer server;
  std::map<int, std::unique_ptr<RawConn>> conns;
  int replies_compared = 0;
  for (const auto& c : chunks) {
    auto& conn = conns[c.conn];
    if (!conn) {
      conn = std::make_unique<RawConn>(server.port());
      REQUIRE(conn->connected());
    }
    if (c.to_server) {
      conn->send(c.bytes);
      continue;
    }
    const std::string got = conn->read(c.bytes.size());
    INFO("operation: " << c.context << " (fixture line " << c.line << ", connection " << c.conn
                       << ")");
    CHECK(tohex(got) == tohex(c.bytes));
    ++replies_compared;
  }
  MESSAGE("compared " << replies_compared << " replies");
  return replies_compared;
}

TEST_CASE("torch 2.11 TCPStore client bytes get torch 2.11 server replies from gpurun's store") {
  CHECK(replay(GPURUN_FIXTURE_DIR "/tcpstore_torch211.txt") > 30);
}

// torch 1.13 (Debian 12's python3-torch): no handshake, its own command numbering; recorded
// against torch 1.13's (legacy) server on the CPU machine.
TEST_CASE("torch 1.13 TCPStore client bytes get torch 1.13 server replies from gpurun's store") {
  CHECK(replay(GPURUN_FIXTURE_DIR "/tcpstore_torch113.txt") >= 18);
}

}  // namespace
}  // namespace gpurun::store
