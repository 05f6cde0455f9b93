#include "gpurun/control/energy_question.hpp"

#include <doctest/doctest.h>

#include <string>

#include "gpurun/control/decision.hpp"

using gpurun::control::EnergyQuestion;
using gpurun::control::ProtocolError;

TEST_CASE("an energy question goes through its JSON and back") {
  for (const auto op : {EnergyQuestion::Op::kEnergy, EnergyQuestion::Op::kBegin,
                        EnergyQuestion::Op::kEnd, EnergyQuestion::Op::kStop}) {
    EnergyQuestion q;
    q.op = op;
    q.rank = 3;
    if (op == EnergyQuestion::Op::kBegin || op == EnergyQuestion::Op::kEnd) {
      q.name = "eval";
      q.t_s = 1767225600.125;
    }
    CAPTURE(q.to_json());
    CHECK(EnergyQuestion::from_json(q.to_json()) == q);
  }
}

TEST_CASE("a window question without a name or a time is refused, naming the field") {
  CHECK_THROWS_WITH_AS(EnergyQuestion::from_json(R"({"op":"end","t":1.5})"),
                       doctest::Contains("'name' of 1 to 128 bytes"), ProtocolError);
  CHECK_THROWS_WITH_AS(EnergyQuestion::from_json(R"({"op":"begin","name":""})"),
                       doctest::Contains("'name' of 1 to 128 bytes"), ProtocolError);
  CHECK_THROWS_WITH_AS(
      EnergyQuestion::from_json(R"({"op":"begin","name":")" + std::string(129, 'x') + R"("})"),
      doctest::Contains("'name' of 1 to 128 bytes"), ProtocolError);
  CHECK_THROWS_WITH_AS(EnergyQuestion::from_json(R"({"op":"begin","name":"eval"})"),
                       doctest::Contains("time field 't'"), ProtocolError);
  CHECK_THROWS_WITH_AS(EnergyQuestion::from_json(R"({"op":"watts"})"),
                       doctest::Contains("unknown op 'watts'"), ProtocolError);
  CHECK_THROWS_WITH_AS(EnergyQuestion::from_json("[1]"), doctest::Contains("not a JSON object"),
                       ProtocolError);
}
