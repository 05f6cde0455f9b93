#include "supervisor/error_file.hpp"

#include <fstream>
#include <iterator>

// Boost.JSON's implementation is compiled once, in gpurun_json (common/json.cpp).
#include <boost/json.hpp>

namespace gpurun::supervisor {
namespace {

std::string as_text(const boost::json::value& v) {
  if (v.is_string()) return std::string(v.get_string());
  if (v.is_null()) return {};
  return boost::json::serialize(v);
}

}  // namespace

std::optional<WorkerErrorReport> parse_error_file(std::string_view content) {
  boost::system::error_code ec;
  boost::json::value root = boost::json::parse(content, ec);
  if (ec || !root.is_object()) return std::nullopt;
  const auto* message = root.as_object().if_contains("message");
  if (!message) return std::nullopt;
  WorkerErrorReport report;
  if (message->is_string()) {
    report.message = std::string(message->get_string());
  } else if (message->is_object()) {
    const auto& m = message->as_object();
    if (const auto* text = m.if_contains("message")) report.message = as_text(*text);
    if (const auto* extra = m.if_contains("extraInfo"); extra && extra->is_object()) {
      if (const auto* cs = extra->as_object().if_contains("py_callstack"))
        report.traceback = as_text(*cs);
      if (const auto* ts = extra->as_object().if_contains("timestamp"))
        report.timestamp = as_text(*ts);
    }
  } else {
    return std::nullopt;
  }
  if (report.message.empty() && report.traceback.empty()) return std::nullopt;
  return report;
}

std::optional<WorkerErrorReport> read_error_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string content;
  content.resize(1 << 20);
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  content.resize(static_cast<size_t>(in.gcount()));
  return parse_error_file(content);
}

}  // namespace gpurun::supervisor
