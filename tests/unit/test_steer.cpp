// apply_request (sdk/src/run/steer.h): what each `tensortap ctl` command
// does to the cadence and answers, asked without a recorder. The same
// commands through a running recorder's control/ are test_control.cpp's.
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include <tensortap/kinds.h>
#include <tensortap/options.h>

#include "sdk/src/run/steer.h"
#include "sdk/src/select/sampling.h"
#include "writers/src/kind_set_access.h"

using tensortap::Kind;
using tensortap::detail::apply_request;
using tensortap::detail::ControlAnswer;
using tensortap::detail::ControlCommand;
using tensortap::detail::ControlRequest;
using tensortap::detail::KindSetAccess;
using tensortap::detail::SteerState;
using tensortap::detail::Steering;

namespace {

ControlRequest request(ControlCommand command) {
  ControlRequest r;
  r.id = "r1";
  r.command = command;
  return r;
}

SteerState at_step(std::int64_t step) {
  SteerState state;
  state.step = step;
  state.kinds = KindSetAccess::bit(Kind::Param) | KindSetAccess::bit(Kind::Grad);
  return state;
}

}  // namespace

TEST_CASE("apply_request: capture opens a window of steps, extends a running one, or is refused", "[sdk][control]") {
  Steering s;
  ControlRequest r = request(ControlCommand::Capture);
  r.steps = 3;
  std::optional<ControlAnswer> a = apply_request(s, r, at_step(10));
  REQUIRE(a);
  CHECK(a->ok);
  CHECK(a->id == "r1");
  CHECK(a->command == "capture");
  CHECK(a->step == 10);
  CHECK((s.window_lo == 10 && s.window_hi == 12));
  CHECK(s.window_kinds == at_step(10).kinds);  // no kinds asked: the recorder's own
  CHECK((s.window_include.empty() && !s.window_pattern));  // the recorder's own include
  CHECK(a->message == "steps 10..12 in full (param+grad)");

  // Within the window: extended to the later end, the kinds and includes joined.
  r.steps = 5;
  r.kinds = KindSetAccess::bit(Kind::Activation);
  r.include = "fc.*";
  s.window_include = "conv.*";
  a = apply_request(s, r, at_step(11));
  REQUIRE(a);
  CHECK(a->ok);
  CHECK((s.window_lo == 10 && s.window_hi == 15));
  CHECK(s.window_include == "(conv.*)|(fc.*)");
  REQUIRE(s.window_pattern);  // compiled here, where the window's records are decided
  CHECK((s.window_pattern->search("fc1.weight") && s.window_pattern->search("conv2") &&
         !s.window_pattern->search("head")));
  CHECK(a->message == "steps 10..15 in full (activation+param+grad, include (conv.*)|(fc.*))");

  // Capture halted: refused, by the budget or by a dump, the window untouched.
  SteerState halted = at_step(20);
  halted.capture_halted = true;
  a = apply_request(s, r, halted);
  REQUIRE(a);
  CHECK_FALSE(a->ok);
  CHECK(a->step == -1);
  CHECK(a->message.find("Options::after_dump") != std::string::npos);
  halted.budget_reached = true;
  CHECK(apply_request(s, r, halted)->message.find("Options::max_bytes") != std::string::npos);
  CHECK((s.window_lo == 10 && s.window_hi == 15));
}

TEST_CASE("apply_request: every sets the period from this step, and says whether statistics go on",
          "[sdk][control]") {
  Steering s;
  ControlRequest r = request(ControlCommand::Every);
  r.every = 4;
  std::optional<ControlAnswer> a = apply_request(s, r, at_step(7));
  REQUIRE(a);
  CHECK((a->ok && a->step == 7 && s.every == 4 && s.every_from == 7));
  CHECK(a->message == "every 4 steps from step 7");
  r.every = 0;
  CHECK(apply_request(s, r, at_step(8))->message == "no full tensors from now (every 0); statistics go on");
  SteerState stopped = at_step(9);
  stopped.stopped = "statistics stopped";
  CHECK(apply_request(s, r, stopped)->message == "no full tensors from now (every 0); statistics stopped");
  CHECK((s.every == 0 && s.every_from == 9));
}

TEST_CASE("apply_request: pause from this step, once", "[sdk][control]") {
  Steering s;
  const ControlRequest r = request(ControlCommand::Pause);
  std::optional<ControlAnswer> a = apply_request(s, r, at_step(5));
  REQUIRE(a);
  CHECK((a->ok && a->step == 5 && s.paused_from == 5));
  CHECK(a->message == "full tensors paused; statistics, TensorBoard, the rules and the watchdog go on");
  a = apply_request(s, r, at_step(6));
  CHECK((a->ok && a->step == 5 && s.paused_from == 5));
  CHECK(a->message == "already paused since step 5");
  Steering fresh;
  SteerState stopped = at_step(6);
  stopped.stopped = "statistics stopped";
  CHECK(apply_request(fresh, r, stopped)->message ==
        "full tensors paused; the rules and the watchdog go on; statistics stopped");
}

TEST_CASE("apply_request: resume ends a pause, and says when there was none", "[sdk][control]") {
  Steering s;
  s.paused_from = 3;
  const ControlRequest r = request(ControlCommand::Resume);
  std::optional<ControlAnswer> a = apply_request(s, r, at_step(8));
  REQUIRE(a);
  CHECK((a->ok && a->step == 8 && a->message == "resumed" && s.paused_from == -1));
  CHECK(apply_request(s, r, at_step(9))->message == "not paused");
}

TEST_CASE("apply_request: dump and status are left to the writer thread", "[sdk][control]") {
  Steering s;
  CHECK_FALSE(apply_request(s, request(ControlCommand::Dump), at_step(1)));
  CHECK_FALSE(apply_request(s, request(ControlCommand::Status), at_step(1)));
  CHECK(s.paused_from == -1);
}

TEST_CASE("a capture window's records are decided by the window of their own step, whatever opened since",
          "[sdk][control]") {
  // A window's records are stored (not held by a flight recorder) and
  // filtered by its include where they are captured, on the training
  // thread. The writer thread once learned the windows from the answers
  // and kept only the last: a gradient of step 11, committed a step
  // later, reached it after a window at 14 replaced 11's, was held, and
  // was lost (the soak check, 4 runs in 14).
  using tensortap::detail::Sampling;
  const tensortap::Options options = tensortap::Options("unused").every(20).stats_every(1).flight_recorder(10);
  Sampling sampling(options);
  Steering s;
  ControlRequest r = request(ControlCommand::Capture);
  r.steps = 1;
  r.kinds = KindSetAccess::bit(Kind::Grad);
  r.include = "^fc1";
  REQUIRE(apply_request(s, r, at_step(11))->ok);
  sampling.steer(s, 11);
  sampling.begin(11, /*capturing=*/true, /*full_halted=*/false);
  for (std::int64_t step : {12, 13}) sampling.begin(step, true, false);
  r.steps = 2;
  r.kinds = KindSetAccess::bit(Kind::Grad) | KindSetAccess::bit(Kind::Param);
  r.include = "^fc2";
  REQUIRE(apply_request(s, r, at_step(14))->ok);
  sampling.steer(s, 14);
  sampling.begin(14, true, false);

  // Step 11's late gradient: its own window's, with its own include.
  const std::uint64_t late = sampling.plan(11, true, false);
  CHECK((Sampling::full(late, Kind::Grad) && !Sampling::full(late, Kind::Param) && Sampling::in_window(late)));
  CHECK((sampling.window_selects(11, "fc1.weight") && !sampling.window_selects(11, "fc2.weight")));
  // The current window.
  const std::uint64_t now = sampling.plan(14, true, false);
  CHECK((Sampling::full(now, Kind::Param) && Sampling::in_window(now)));
  CHECK((sampling.window_selects(15, "fc2.weight") && !sampling.window_selects(15, "fc1.weight")));
  // Between them and after: the cadence (statistics only), or a sampled
  // step the flight recorder holds.
  CHECK_FALSE(Sampling::full(sampling.plan(13, true, false), Kind::Grad));
  CHECK(Sampling::stats(sampling.plan(13, true, false), Kind::Grad));
  const std::uint64_t sampled = sampling.plan(20, true, false);
  CHECK((Sampling::full(sampled, Kind::Grad) && !Sampling::in_window(sampled)));
  CHECK(sampling.window_selects(20, "anything"));
  // Full capture halted: nothing in full, no window either.
  const std::uint64_t halted = sampling.plan(14, true, true);
  CHECK((!Sampling::full(halted, Kind::Param) && !Sampling::in_window(halted)));
}
