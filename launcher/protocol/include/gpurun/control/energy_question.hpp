// gpurun::control::EnergyQuestion — what a worker asks node 0's gpurun about energy (the value
// of keys::energy_ask; docs/control-protocol.md#energy-questions). The supervisor owns NVML and
// the energy monitor; a worker reads no GPU counter itself, it asks.
#pragma once

#include <string>
#include <string_view>

namespace gpurun::control {

struct EnergyQuestion {
  enum class Op {
    kEnergy,  ///< the job's and the current epoch's joules per GPU so far, the finished epochs
    kBegin,   ///< a named window begins at t_s (no answer)
    kEnd,     ///< the named window ends at t_s: its joules and seconds per GPU
    kStop,    ///< why the job ends (after an exit decision): gpurun's sentence and numbers
  };
  Op op = Op::kEnergy;
  std::string name;  ///< kBegin / kEnd: the window's name (1 to 128 bytes)
  int rank = -1;     ///< the asking worker's rank (-1: none yet)
  double t_s = 0;    ///< kBegin / kEnd: Unix time, s (the worker's CLOCK_REALTIME)

  /// One line of JSON: {"op":"energy"|"begin"|"end"|"stop","name":…,"rank":…,"t":…}.
  std::string to_json() const;
  /// Throws ProtocolError (gpurun/control/decision.hpp) naming the field for a value that does
  /// not parse, an unknown op, a begin/end without a name (or one over 128 bytes) or time.
  static EnergyQuestion from_json(std::string_view text);
  friend bool operator==(const EnergyQuestion&, const EnergyQuestion&) = default;
};

std::string_view to_string(EnergyQuestion::Op op);

}  // namespace gpurun::control
