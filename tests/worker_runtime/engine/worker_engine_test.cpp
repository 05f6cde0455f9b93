#include "gpurun/worker/worker_engine.hpp"

#include <fstream>
#include <sstream>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <boost/json.hpp>

// Table tests of the worker protocol engine: decision kind × role (member, joiner, source,
// leaving source, leaver) × park mode × failure point. Each row drives one slot's engine
// through a script of events and compares the actions it emits, as "kind(detail)" words, with
// what docs/control-protocol.md says that party does. No I/O, no clock: milliseconds.

using namespace gpurun::control;
using A = EngineAction::Kind;
using E = EngineEvent::Kind;

namespace {

/// One word per action: its kind and what distinguishes it.
std::string word(const EngineAction& a) {
  switch (a.kind) {
    case A::kSet: {
      const auto slash = a.key.find('/', 7);  // after "gpurun/"
      std::string k = a.key.substr(7);
      // keep the grammar visible but short: gen/1/round/0/report/1 -> report(gen1,r0,rank1)
      return "set(" + k + ")";
      (void)slash;
    }
    case A::kWaitGet:
      return "wait(" + a.key.substr(7) + ")";
    case A::kLog:
      return "log";
    case A::kState:
      return fmt::format("state({})", gpurun::to_string(a.to));
    case A::kMakeGroup:
      return fmt::format("group({},[{}],{})", a.purpose, join_ids(a.group), a.rank);
    case A::kDropGroup:
      return a.abort ? "drop(abort)" : "drop";
    case A::kBroadcastState:
      return fmt::format("bcast({},{})", a.root, a.receive ? "recv" : "send");
    case A::kVerifyState:
      return fmt::format("verify({})", a.root);
    case A::kWriteSnapshot:
      return "write";
    case A::kReadSnapshot:
      return fmt::format("read(e{},s{})", a.epoch, a.step);
    case A::kRelease:
      return "release";
    case A::kPark:
      return "park";
    case A::kTrain:
      return fmt::format("train(g{},r{}{})", a.decision.generation, a.rank,
                         a.jumped ? ",jumped" : "");
    case A::kExit:
      return a.left ? "exit(left)" : "exit";
  }
  return "?";
}

std::string words(const std::vector<EngineAction>& as) {
  std::string out;
  for (const auto& a : as) out += (out.empty() ? "" : " ") + word(a);
  return out;
}

EngineEvent ev(E k, std::string text = {}) {
  EngineEvent e;
  e.kind = k;
  e.mono_ms = 1000;
  e.unix_ms = 1;
  e.text = std::move(text);
  return e;
}
EngineEvent boundary(int64_t epoch, int64_t step = 0) {
  EngineEvent e = ev(E::kBoundary);
  e.epoch = epoch;
  e.step = step;
  return e;
}
EngineEvent failed(std::string why, int64_t epoch = 3, int64_t step = 0) {
  EngineEvent e = ev(E::kFailed, std::move(why));
  e.epoch = epoch;
  e.step = step;
  return e;
}

Decision start(std::vector<int> active) {
  Decision d;
  d.kind = Decision::Kind::kStart;
  d.generation = 0;
  d.active = std::move(active);
  d.state_source = StateSource::none();
  return d;
}

Decision resize(int64_t gen, std::vector<int> from, std::vector<int> to, ParkMode park,
                std::vector<int> failed = {}) {
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = gen;
  d.prev_generation = gen - 1;
  d.round = 0;
  d.epoch = 3;
  d.step = 0;
  d.active = to;
  for (int g : to)
    if (std::find(from.begin(), from.end(), g) == from.end()) d.joiners.push_back(g);
  for (int g : from)
    if (std::find(to.begin(), to.end(), g) == to.end() &&
        std::find(failed.begin(), failed.end(), g) == failed.end())
      d.leavers.push_back(g);
  d.failed = failed;
  int src = -1;
  for (int g : from)
    if (std::find(to.begin(), to.end(), g) != to.end() &&
        std::find(failed.begin(), failed.end(), g) == failed.end()) {
      src = g;
      break;
    }
  if (src < 0)
    for (int g : from)
      if (std::find(failed.begin(), failed.end(), g) == failed.end()) {
        src = g;
        break;
      }
  const auto rank_in_from = [&](int g) {
    return static_cast<int>(std::find(from.begin(), from.end(), g) - from.begin());
  };
  d.state_source =
      to.empty() || src < 0 ? StateSource::snapshot() : StateSource::peer(rank_in_from(src), src);
  d.park_mode = park;
  return d;
}

Decision simple(Decision::Kind k, int64_t gen, int src_rank = -1, int src_gpu = -1) {
  Decision d;
  d.kind = k;
  d.generation = gen;
  d.prev_generation = gen;
  d.epoch = 3;
  d.active = {0, 1};
  if (src_gpu >= 0) d.state_source = StateSource::peer(src_rank, src_gpu);
  return d;
}

/// A slot's engine that has started in generation 0 of `active` and trains.
struct Slot {
  WorkerEngine eng;
  explicit Slot(int slot, int64_t gen = 0, int64_t warm = -1)
      : eng(EngineOptions{slot, gen, warm, 4242}) {}
  std::string on(const EngineEvent& e) { return words(eng.on(e)); }
  std::string value(const Decision& d) { return on(ev(E::kValue, d.to_json())); }
  std::string done(int64_t bytes = 0, std::string text = {}) {
    EngineEvent e = ev(E::kDone, std::move(text));
    e.bytes = bytes;
    return on(e);
  }
  /// Open, start record of generation 0, ready, and the start's set-up done.
  void started(std::vector<int> active) {
    on(ev(E::kOpen));
    value(start(active));
    on(ev(E::kReady));
    while (eng.state() != gpurun::WorkerState::kActive) done();
  }
};

}  // namespace

TEST_CASE("worker engine: a fresh start, each rank") {
  Slot s0(0), s1(1);
  CHECK(s0.on(ev(E::kOpen)) == "wait(gen/0/start)");
  CHECK(s0.value(start({0, 1})) == "set(gen/0/joined/0)");
  CHECK(s0.eng.state() == gpurun::WorkerState::kRejoining);
  CHECK(s0.on(ev(E::kReady)) == "group(train,[0,1],0)");
  CHECK(s0.done() == "bcast(0,send)");
  CHECK(s0.done(100) == "verify(0)");
  CHECK(s0.done() == "state(ACTIVE) train(g0,r0)");  // a launch is no resize: no timing record

  s1.on(ev(E::kOpen));
  CHECK(s1.value(start({0, 1})) == "set(gen/0/joined/1)");
  CHECK(s1.on(ev(E::kReady)) == "group(train,[0,1],1)");
  CHECK(s1.done() == "bcast(0,recv)");

  Slot lone(3);
  lone.on(ev(E::kOpen));
  CHECK_THROWS_WITH_AS(lone.value(start({0, 1})),
                       "slot 3 is not a member of generation 0 (active [0,1])", ProtocolError);
}

TEST_CASE("worker engine: boundaries — continue, exit, snapshot round (source and others)") {
  Slot s(1);
  s.started({0, 1});
  CHECK(s.on(boundary(0)) == "set(gen/0/round/0/report/1) wait(gen/0/round/0/decision)");
  CHECK(s.value(simple(Decision::Kind::kContinue, 0)) == "train(g0,r1)");
  CHECK(s.eng.round() == 1);
  // A pause is asked for with slot 0 as the source: slot 1 only reports again, same boundary.
  CHECK(s.on(boundary(1)) == "set(gen/0/round/1/report/1) wait(gen/0/round/1/decision)");
  CHECK(s.value(simple(Decision::Kind::kSnapshot, 0, 0, 0)) ==
        "set(gen/0/round/2/report/1) wait(gen/0/round/2/decision)");
  // The source writes first, then reports with the outcome.
  Slot src(0);
  src.started({0, 1});
  src.on(boundary(1));
  CHECK(src.value(simple(Decision::Kind::kSnapshot, 0, 0, 0)) == "write");
  std::vector<EngineAction> after = src.eng.on(ev(E::kDone, "ok"));
  REQUIRE(after.size() == 2);  // the report, then the wait for the round's decision
  CHECK(after[0].key == "gpurun/gen/0/round/1/report/0");
  CHECK(Report::from_json(after[0].value).snapshot == "ok");
  CHECK(Report::from_json(after[0].value).epoch == 1);
  // A refused write's sentence is the outcome: gpurun refuses the pause, training goes on.
  src.on(ev(E::kValue, simple(Decision::Kind::kSnapshot, 0, 0, 0).to_json()));
  after = src.eng.on(ev(E::kDone, "no room in /dev/shm"));
  CHECK(Report::from_json(after[0].value).snapshot == "no room in /dev/shm");
  CHECK(src.value(simple(Decision::Kind::kContinue, 0)) == "train(g0,r0)");

  Decision exit;
  exit.kind = Decision::Kind::kExit;
  s.value(simple(Decision::Kind::kContinue, 0));
  s.on(boundary(2));
  CHECK(s.value(exit) == "exit");
  CHECK(s.eng.finished());
  CHECK(s.eng.state() == gpurun::WorkerState::kActive);  // finishing is not leaving
  CHECK_THROWS_AS(s.on(boundary(3)), gpurun::InvariantError);
}

TEST_CASE("worker engine: resize table — role × park mode") {
  struct Row {
    const char* name;
    int slot;
    std::vector<int> from, to;
    ParkMode park;
    std::vector<std::string> steps;  // the actions after the decision, then after each kDone
  };
  const ParkMode R = ParkMode::kRelease, H = ParkMode::kHold;
  const Row rows[] = {
      {"shrink: a member stays (no joiners: no handoff, the new group verifies)",
       0,
       {0, 1},
       {0},
       R,
       {"drop group(train,[0],0)", "verify(0)", "set(gen/1/timing/0) train(g1,r0)"}},
      {"shrink: a leaver in release mode frees its state and its loops end",
       1,
       {0, 1},
       {0},
       R,
       {"drop state(OFFLOADING) release", "set(gen/1/timing/1) state(EXITED) exit(left)"}},
      {"shrink: a leaver in hold mode parks and waits for its wake",
       1,
       {0, 1},
       {0},
       H,
       {"drop state(OFFLOADING) park",
        "set(gen/1/timing/1) state(PARKED) set(slot/1/parked/1) wait(slot/1/wake/1)"}},
      {"grow: the source hands its state to the joiner in the new group",
       0,
       {0},
       {0, 1},
       R,
       {"drop group(train,[0,1],0)", "bcast(0,send)", "verify(0)",
        "set(gen/1/timing/0) train(g1,r0)"}},
      {"swap: the leaving source hands off in a group of its own, then leaves",
       0,
       {0},
       {1},
       H,
       {"drop group(handoff,[0,1],0)", "bcast(0,send)", "verify(0)",
        "drop state(OFFLOADING) park"}},
      {"pause: every member leaves; the state is in the snapshot already",
       0,
       {0, 1},
       {},
       R,
       {"drop state(OFFLOADING) release", "set(gen/1/timing/0) state(EXITED) exit(left)"}},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    Slot s(row.slot);
    s.started(row.from);
    s.on(boundary(3));
    std::string got = s.value(resize(1, row.from, row.to, row.park));
    for (size_t i = 0; i < row.steps.size(); ++i) {
      CHECK(got == row.steps[i]);
      if (i + 1 < row.steps.size()) got = s.done(64);
    }
  }
}

TEST_CASE("worker engine: joiners — spawned for a grow, a swap, a resume; woken; warm") {
  // Spawned for a grow: its start record is the resize decision.
  Slot j(1, /*gen=*/1);
  CHECK(j.on(ev(E::kOpen)) == "wait(gen/1/start)");
  CHECK(j.value(resize(1, {0}, {0, 1}, ParkMode::kRelease)) == "set(gen/1/joined/1)");
  CHECK(j.on(ev(E::kReady)) == "group(train,[0,1],1)");
  CHECK(j.done() == "bcast(0,recv)");
  CHECK(j.done(4096) == "verify(0)");
  std::vector<EngineAction> last = j.eng.on(ev(E::kDone));
  CHECK(words(last) == "state(ACTIVE) set(gen/1/timing/1) train(g1,r1)");
  // The timing record: role, bytes and marks in the order they happened.
  const auto rec = boost::json::parse(last[1].value).as_object();
  CHECK(rec.at("role").as_string() == "joiner");
  CHECK(rec.at("bytes").as_int64() == 4096);
  std::string order;
  for (const auto& kv : rec.at("marks").as_object()) order += std::string(kv.key()) + " ";
  CHECK(order == "seen ready comm state checksum resumed ");

  // A swap's joiner: the handoff group, then the generation's own (train_comm), no 2nd verify.
  Slot w(1, 1);
  w.on(ev(E::kOpen));
  w.value(resize(1, {0}, {1}, ParkMode::kRelease));
  CHECK(w.on(ev(E::kReady)) == "group(handoff,[0,1],1)");
  CHECK(w.done() == "bcast(0,recv)");
  CHECK(w.done() == "verify(0)");
  CHECK(w.done() == "drop group(train,[1],0)");
  last = w.eng.on(ev(E::kDone));
  CHECK(words(last) == "state(ACTIVE) set(gen/1/timing/1) train(g1,r0)");
  CHECK(last[1].value.find("\"train_comm\"") != std::string::npos);

  // A resume from the pause: the snapshot's read names the position it must hold.
  Slot r(0, 2);
  r.on(ev(E::kOpen));
  Decision resume = resize(2, {}, {0}, ParkMode::kRelease);
  resume.state_source = StateSource::snapshot();
  resume.epoch = 9;
  r.value(resume);
  CHECK(r.on(ev(E::kReady)) == "read(e10,s0)");  // paused after epoch 9: the state is at 10
  CHECK(r.done() == "group(train,[0],0)");
  CHECK(r.done() == "verify(0)");

  // Woken in hold mode: joins as a joiner, and its position is the state's (jumped).
  Slot h(1);
  h.started({0, 1});
  h.on(boundary(3));
  h.value(resize(1, {0, 1}, {0}, ParkMode::kHold));
  CHECK(h.done() == "set(gen/1/timing/1) state(PARKED) set(slot/1/parked/1) wait(slot/1/wake/1)");
  CHECK(h.eng.state() == gpurun::WorkerState::kParked);
  CHECK(h.value(resize(2, {0}, {0, 1}, ParkMode::kHold)) ==
        "set(gen/2/joined/1) state(REJOINING) group(train,[0,1],1)");
  h.done();
  h.done();
  CHECK(h.done() == "state(ACTIVE) set(gen/2/timing/1) train(g2,r1,jumped)");
  // Told to exit while parked.
  Slot x(1);
  x.started({0, 1});
  x.on(boundary(3));
  x.value(resize(1, {0, 1}, {0}, ParkMode::kHold));
  x.done();  // parked
  Decision ex;
  ex.kind = Decision::Kind::kExit;
  CHECK(x.value(ex) == "state(EXITED) exit(left)");

  // Warm: no start record; ready says so and waits for its admission (or exit).
  Slot wj(2, 0, /*warm=*/5);
  CHECK(wj.on(ev(E::kOpen)).empty());
  CHECK(wj.on(ev(E::kReady)) == "set(slot/2/ready/5) wait(slot/2/admit/5)");
  CHECK(wj.value(resize(4, {0}, {0, 2}, ParkMode::kRelease)) ==
        "set(gen/4/joined/1) group(train,[0,2],1)");
  Slot wx(2, 0, 5);
  wx.on(ev(E::kOpen));
  wx.on(ev(E::kReady));
  CHECK(wx.value(ex) == "state(EXITED) exit(left)");
}

TEST_CASE("worker engine: failure points — holder, joiner, leaving source, training") {
  // A holder whose new group's set-up fails reports again at its position in the new
  // generation; gpurun decides without the dead rank.
  Slot m(0);
  m.started({0, 1, 2});
  m.on(boundary(3));
  m.value(resize(1, {0, 1, 2}, {0, 1}, ParkMode::kRelease));  // drop, group
  std::vector<EngineAction> out = m.eng.on(failed("abandoned by gpurun: gpu 1 died", 4, 0));
  CHECK(words(out) == "drop(abort) log set(gen/1/round/0/report/0) wait(gen/1/round/0/decision)");
  CHECK(Report::from_json(out[2].value).has_state);
  // The program's position, as a boundary report says it: step 0 of epoch 4 is after epoch 3.
  CHECK(Report::from_json(out[2].value).epoch == 3);
  // (its communicator is gone already: dropped at the failure)
  CHECK(m.value(resize(2, {0, 1}, {0}, ParkMode::kRelease, {1})) == "group(train,[0],0)");

  // A joiner without the state reports has_state false at the decision's boundary, then
  // follows: joins again, or exits.
  Slot j(1, 1);
  j.on(ev(E::kOpen));
  j.value(resize(1, {0}, {0, 1}, ParkMode::kRelease));
  j.on(ev(E::kReady));
  j.done();  // bcast
  out = j.eng.on(failed("Connection reset by peer"));
  CHECK(words(out) == "drop(abort) log set(gen/1/round/0/report/1) wait(gen/1/round/0/decision)");
  CHECK_FALSE(Report::from_json(out[2].value).has_state);
  CHECK(j.value(simple(Decision::Kind::kSnapshot, 1, 0, 0)) ==
        "set(gen/1/round/1/report/1) wait(gen/1/round/1/decision)");  // not its part
  Decision again = resize(2, {0, 1}, {0, 1}, ParkMode::kRelease);
  again.joiners = {1};
  again.state_source = StateSource::peer(0, 0);
  CHECK(j.value(again) == "group(train,[0,1],1)");
  out = j.eng.on(failed("Connection reset by peer"));
  Decision ex;
  ex.kind = Decision::Kind::kExit;
  CHECK(j.value(ex) == "state(EXITED) exit(left)");
  // A `continue` to a stateless report is a protocol error.
  Slot k(1, 1);
  k.on(ev(E::kOpen));
  k.value(resize(1, {0}, {0, 1}, ParkMode::kRelease));
  k.on(ev(E::kReady));
  k.on(failed("x"));
  CHECK_THROWS_AS(k.value(simple(Decision::Kind::kContinue, 1)), ProtocolError);

  // A leaving source whose joiner died: it leaves as decided (gpurun then says state lost).
  Slot ls(0);
  ls.started({0});
  ls.on(boundary(3));
  ls.value(resize(1, {0}, {1}, ParkMode::kRelease));
  out = ls.eng.on(failed("abandoned by gpurun: gpu 1 died"));
  CHECK(words(out) == "drop(abort) log state(OFFLOADING) release");
  CHECK(out[1].text.find("handing the state to generation 1 failed") == 0);

  // A collective of training fails: report at once at the position, follow the decision.
  Slot t(0);
  t.started({0, 1});
  EngineEvent cf = ev(E::kCollectiveFailed, "Connection closed by peer");
  cf.epoch = 2;
  cf.step = 17;
  out = t.eng.on(cf);
  CHECK(words(out) == "log drop(abort) set(gen/0/round/0/report/0) wait(gen/0/round/0/decision)");
  CHECK(Report::from_json(out[2].value).step == 17);
  // At an epoch's first step the position is the end of the epoch before, as at that boundary.
  Slot t2(0);
  t2.started({0, 1});
  cf.step = 0;
  out = t2.eng.on(cf);
  CHECK(Report::from_json(out[2].value).epoch == 1);
  CHECK(Report::from_json(out[2].value).step == 0);
}

TEST_CASE("worker engine: a member a step behind the source receives its state") {
  // Generation 0 of [0, 1, 2]; gpu 2 died inside an all-reduce that completed on gpu 1 only:
  // gpu 1 reports after step 18, gpu 0 after step 17. gpurun's decision takes gpu 1's state and
  // position; gpu 0 receives it (as a joiner would) before the checksum, gpu 1 sends it.
  Decision d = resize(1, {0, 1, 2}, {0, 1}, ParkMode::kRelease, {2});
  d.step = 18;
  d.state_source = StateSource::peer(1, 1);
  d.behind = {0};
  Slot behind(0), ahead(1);
  behind.started({0, 1, 2});
  ahead.started({0, 1, 2});
  EngineEvent cf = ev(E::kCollectiveFailed, "Connection closed by peer");
  cf.epoch = 2;
  cf.step = 17;
  behind.on(cf);
  cf.step = 18;
  ahead.on(cf);
  CHECK(behind.value(d) == "group(train,[0,1],0)");
  CHECK(behind.done() == "bcast(1,recv)");
  CHECK(behind.done(4096) == "verify(1)");
  CHECK(behind.done() == "set(gen/1/timing/0) train(g1,r0)");
  CHECK(ahead.value(d) == "group(train,[0,1],1)");
  CHECK(ahead.done() == "bcast(1,send)");
  CHECK(ahead.done() == "verify(1)");
  // Without a member behind, the survivors only verify (no state moves).
  d.behind.clear();
  Slot plain(0);
  plain.started({0, 1, 2});
  plain.on(cf);
  CHECK(plain.value(d) == "group(train,[0,1],0)");
  CHECK(plain.done() == "verify(1)");
}

TEST_CASE("worker engine: joining — whose random initialisation the handoff overwrites") {
  Slot s0(0), s1(1);
  s0.on(ev(E::kOpen));
  s0.value(start({0, 1}));
  s1.on(ev(E::kOpen));
  s1.value(start({0, 1}));
  CHECK_FALSE(s0.eng.joining());  // rank 0's initial state is broadcast at a fresh start
  CHECK(s1.eng.joining());
  Slot grow(1, 1), src(0, 1);
  grow.on(ev(E::kOpen));
  grow.value(resize(1, {0}, {0, 1}, ParkMode::kRelease));
  CHECK(grow.eng.joining());  // its state comes from gpu 0
  Slot resume(0, 2);
  resume.on(ev(E::kOpen));
  Decision r = resize(2, {}, {0}, ParkMode::kRelease);
  r.state_source = StateSource::snapshot();
  resume.value(r);
  CHECK(resume.eng.joining());  // from the pause snapshot
  Slot warm(2, 0, 1);
  warm.on(ev(E::kOpen));
  CHECK(warm.eng.joining());
}

TEST_CASE("worker engine: a standby waits for go at its first device use, then is a warm joiner") {
  EngineOptions o{2, 0, /*warm=*/6, 4242};
  o.standby = true;
  WorkerEngine sb(o);
  CHECK(sb.standby());
  CHECK(words(sb.on(ev(E::kOpen))).empty());
  // Its program may not be ready before it asked for its device (the executor's order).
  CHECK_THROWS_AS(sb.on(ev(E::kReady)), gpurun::InvariantError);
  CHECK(words(sb.on(ev(E::kDevice))) == "wait(slot/2/go/6)");
  CHECK(sb.standby());  // still: the go has not come
  CHECK(words(sb.on(ev(E::kValue, "go"))) == "log");
  CHECK_FALSE(sb.standby());
  CHECK(words(sb.on(ev(E::kDevice))).empty());  // asked again: nothing more to wait for
  CHECK(words(sb.on(ev(E::kReady))) == "set(slot/2/ready/6) wait(slot/2/admit/6)");
  CHECK(words(sb.on(ev(E::kValue, resize(4, {0}, {0, 2}, ParkMode::kRelease).to_json()))) ==
        "set(gen/4/joined/1) group(train,[0,2],1)");

  // Told to exit instead: the process leaves (it held nothing).
  WorkerEngine sx(o);
  sx.on(ev(E::kOpen));
  sx.on(ev(E::kDevice));
  Decision ex;
  ex.kind = Decision::Kind::kExit;
  CHECK(words(sx.on(ev(E::kValue, ex.to_json()))) == "state(EXITED) exit(left)");
  CHECK(sx.finished());

  // Any other value in its go key is gpurun's bug, said with the key.
  WorkerEngine bad(o);
  bad.on(ev(E::kOpen));
  bad.on(ev(E::kDevice));
  CHECK_THROWS_WITH_AS(bad.on(ev(E::kValue, resize(4, {0}, {0, 2}, ParkMode::kRelease).to_json())),
                       doctest::Contains("gpurun/slot/2/go/6"), ProtocolError);

  // Everyone else: the device is theirs at once, in any phase.
  Slot m(0);
  CHECK(m.on(ev(E::kDevice)).empty());
  m.started({0, 1});
  CHECK(m.on(ev(E::kDevice)).empty());
  CHECK_FALSE(m.eng.standby());
}

TEST_CASE("worker engine: the program's own error is said to gpurun, in any phase") {
  Slot s(1);
  s.started({0, 1});
  std::vector<EngineAction> out = s.eng.on(ev(E::kProgramError, "ValueError: bad batch"));
  REQUIRE(out.size() == 1);
  CHECK(out[0].key == "gpurun/slot/1/error/4242");
  CHECK(out[0].value == "ValueError: bad batch");
  CHECK(s.on(boundary(0)) == "set(gen/0/round/0/report/1) wait(gen/0/round/0/decision)");
  CHECK(keys::parse_worker_write(out[0].key, out[0].value) ==
        keys::WorkerWrite(keys::ProgramError{1, 4242, "ValueError: bad batch"}));
}

TEST_CASE("worker engine: events out of place are executor bugs") {
  Slot s(0);
  CHECK_THROWS_AS(s.on(ev(E::kReady)), gpurun::InvariantError);  // before kOpen
  s.on(ev(E::kOpen));
  CHECK_THROWS_AS(s.on(boundary(0)), gpurun::InvariantError);  // before its start record
  CHECK_THROWS_AS(s.on(ev(E::kValue, "{not json")), ProtocolError);
}

// The same cases the Python package runs through the C interface (tests/python/
// test_engine_cases.py): each step's event in, the actions out, as JSON.
TEST_CASE("worker engine: JSON cases (shared with the Python package)") {
  std::ifstream in(GPURUN_ENGINE_CASES);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto cases = boost::json::parse(ss.str()).as_array();
  REQUIRE(cases.size() >= 5);
  for (const auto& c : cases) {
    const auto& o = c.as_object();
    CAPTURE(std::string(o.at("name").as_string()));
    WorkerEngine eng(options_from_json(boost::json::serialize(o.at("options"))));
    for (const auto& st : o.at("steps").as_array()) {
      const auto& so = st.as_object();
      const std::string got =
          to_json(eng.on(event_from_json(boost::json::serialize(so.at("event")))));
      CHECK(boost::json::parse(got) == so.at("actions"));
    }
  }
}
