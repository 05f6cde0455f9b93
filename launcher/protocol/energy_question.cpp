#include "gpurun/control/energy_question.hpp"

#include <cmath>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/control/decision.hpp"

namespace gpurun::control {

namespace json = boost::json;

namespace {

constexpr size_t kMaxNameBytes = 128;

EnergyQuestion::Op parse_op(std::string_view s, std::string_view text) {
  if (s == "energy") return EnergyQuestion::Op::kEnergy;
  if (s == "begin") return EnergyQuestion::Op::kBegin;
  if (s == "end") return EnergyQuestion::Op::kEnd;
  if (s == "stop") return EnergyQuestion::Op::kStop;
  throw ProtocolError(fmt::format(
      "an energy question has the unknown op '{}' (energy, begin, end or stop): '{}'", s, text));
}

}  // namespace

std::string_view to_string(EnergyQuestion::Op op) {
  switch (op) {
    case EnergyQuestion::Op::kEnergy:
      return "energy";
    case EnergyQuestion::Op::kBegin:
      return "begin";
    case EnergyQuestion::Op::kEnd:
      return "end";
    case EnergyQuestion::Op::kStop:
      return "stop";
  }
  return "energy";
}

std::string EnergyQuestion::to_json() const {
  json::object o;
  o["op"] = to_string(op);
  o["name"] = name;
  o["rank"] = rank;
  o["t"] = t_s;
  return json::serialize(o);
}

EnergyQuestion EnergyQuestion::from_json(std::string_view text) {
  boost::system::error_code ec;
  const json::value root = json::parse(text, ec);
  if (ec || !root.is_object())
    throw ProtocolError(fmt::format("an energy question is not a JSON object: '{}'", text));
  const json::object& o = root.as_object();
  EnergyQuestion q;
  const json::value* op = o.if_contains("op");
  if (!op || !op->is_string())
    throw ProtocolError(fmt::format("an energy question lacks the string field 'op': '{}'", text));
  q.op = parse_op(op->as_string(), text);
  if (const json::value* r = o.if_contains("rank"); r && r->is_int64())
    q.rank = static_cast<int>(r->as_int64());
  if (q.op != Op::kBegin && q.op != Op::kEnd) return q;
  const json::value* name = o.if_contains("name");
  if (!name || !name->is_string() || name->as_string().empty() ||
      name->as_string().size() > kMaxNameBytes)
    throw ProtocolError(fmt::format(
        "an energy window's question lacks a 'name' of 1 to {} bytes: '{}'", kMaxNameBytes, text));
  q.name = std::string(name->as_string());
  const json::value* t = o.if_contains("t");
  if (!t || !t->is_number() || !std::isfinite(t->to_number<double>()))
    throw ProtocolError(
        fmt::format("an energy window's question lacks the time field 't' (Unix s): '{}'", text));
  q.t_s = t->to_number<double>();
  return q;
}

}  // namespace gpurun::control
