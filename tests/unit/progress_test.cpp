// The training progress report, on a clock the test moves and an output it keeps: plain lines
// every N steps for pipes, one redrawn line for terminals, the rate, the time left, the loss
// averaged over a window.
#include "test_support.hpp"

#include <pscoro/metrics.hpp>
#include <pscoro/progress.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

using namespace pscoro;
using namespace std::chrono_literals;

namespace {

// A clock that moves only when told, and the text printed, in pieces.
struct fake_terminal {
  std::chrono::steady_clock::time_point now{};
  std::vector<std::string> out;

  progress_options options(progress_options::style style) {
    progress_options o;
    o.output_style = style;
    o.output = [this](std::string_view text) { out.emplace_back(text); };
    o.clock = [this] { return now; };
    return o;
  }
  std::string all() const {
    std::string s;
    for (const auto& piece : out) s += piece;
    return s;
  }
};

}  // namespace

TEST_CASE("as lines: one every print_every steps and at the last, with rate, ETA and the mean loss") {
  fake_terminal t;
  auto o = t.options(progress_options::style::lines);
  o.label = "chief: ";
  o.print_every = 2;
  progress p(6, o);
  for (int step = 1; step <= 6; ++step) {
    t.now += 500ms;  // 2 steps per second
    p.update(step, 1.0 / step);
  }
  p.finish();
  CHECK(t.all() ==
        "chief: step 2/6 loss 0.7500 2.0 steps/s ETA 2s\n"
        "chief: step 4/6 loss 0.5208 2.0 steps/s ETA 1s\n"
        "chief: step 6/6 loss 0.4083 2.0 steps/s done in 3s\n");
}

TEST_CASE("the loss is the mean of the last loss_window losses") {
  fake_terminal t;
  auto o = t.options(progress_options::style::lines);
  o.loss_window = 2;
  progress p(0, o);
  CHECK_FALSE(p.average_loss().has_value());
  p.update(1, 10.0);
  p.update(2, 20.0);
  p.update(3, 40.0);
  CHECK(p.average_loss() == 30.0);
  p.update(4);  // a step without a loss leaves the mean alone
  CHECK(p.average_loss() == 30.0);
}

TEST_CASE("a resumed run counts only its own steps for the rate and the time left") {
  fake_terminal t;
  auto o = t.options(progress_options::style::lines);
  o.initial_step = 1000;
  progress p(2000, o);
  CHECK(p.steps_per_second() == 0);
  CHECK_FALSE(p.eta().has_value());
  t.now += 10s;
  p.update(1100);
  CHECK(p.steps_per_second() == doctest::Approx(10.0));
  REQUIRE(p.eta().has_value());
  CHECK(p.eta()->count() == doctest::Approx(90.0));
  CHECK(p.text() == "step 1100/2000 10.0 steps/s ETA 1:30");
}

TEST_CASE("without a total there is no ETA; long times print as Keras prints them") {
  fake_terminal t;
  progress unknown(0, t.options(progress_options::style::lines));
  t.now += 1s;
  unknown.update(5, 0.5);
  CHECK(unknown.text() == "step 5 loss 0.5000 5.0 steps/s");
  CHECK_FALSE(unknown.eta().has_value());

  progress slow(10000, t.options(progress_options::style::lines));
  t.now += 2s;
  slow.update(1);
  CHECK(slow.text() == "step 1/10000 0.5 steps/s ETA 5:33:18");

  // A time left past what a long long counts in seconds prints as the bound, 10^12 s.
  progress endless(std::numeric_limits<std::int64_t>::max(), t.options(progress_options::style::lines));
  t.now += 1000000s;
  endless.update(1);
  CHECK(contains(endless.text(), "ETA 277777777:46:40"));
}

TEST_CASE("on a terminal one line is redrawn, at most once per interval, with Keras's bar") {
  fake_terminal t;
  auto o = t.options(progress_options::style::redraw);
  o.redraw_interval = 1s;
  progress p(4, o);
  t.now += 1s;
  p.update(1, 2.0);  // the first update draws
  t.now += 500ms;
  p.update(2, 2.0);  // too soon: not drawn
  t.now += 500ms;
  p.update(3, 2.0);
  t.now += 100ms;
  p.update(4, 2.0);  // the last step is always drawn
  p.finish();
  REQUIRE(t.out.size() == 4);
  CHECK(t.out[0] == "\r[======>.......................] step 1/4 loss 2.0000 1.0 steps/s ETA 3s");
  CHECK(t.out[1] == "\r[=====================>........] step 3/4 loss 2.0000 1.5 steps/s ETA 1s");
  CHECK(t.out[2] == "\r[==============================] step 4/4 loss 2.0000 1.9 steps/s done in 2s");
  CHECK(t.out[3] == "\n");
}

TEST_CASE("a shorter redraw covers what is left of the longer line; after interrupt a fresh line starts") {
  fake_terminal t;
  auto o = t.options(progress_options::style::redraw);
  o.redraw_interval = 0ms;
  o.loss_window = 1;
  progress p(0, o);
  t.now += 1s;
  p.update(1, 123456.0);
  p.update(2, 1.0);
  REQUIRE(t.out.size() == 2);
  CHECK(t.out[0] == "\rstep 1 loss 123456.0000 1.0 steps/s");
  CHECK(t.out[1] == "\rstep 2 loss 1.0000 2.0 steps/s     ");
  p.interrupt();
  p.update(3, 1.0);
  REQUIRE(t.out.size() == 4);
  CHECK(t.out[2] == "\n");
  CHECK(t.out[3] == "\rstep 3 loss 1.0000 3.0 steps/s");  // nothing left to cover
}

TEST_CASE("finish prints the last step once and ends a redrawn line") {
  fake_terminal t;
  auto lines = t.options(progress_options::style::lines);
  lines.print_every = 100;
  progress p(0, lines);
  t.now += 1s;
  p.update(7, 1.0);
  CHECK(t.out.empty());
  p.finish();
  REQUIRE(t.out.size() == 1);
  CHECK(t.out[0] == "step 7 loss 1.0000 7.0 steps/s\n");
  p.finish();
  CHECK(t.out.size() == 1);
}

TEST_CASE("lines style never redraws, and interrupt does nothing there") {
  fake_terminal t;
  progress p(10, t.options(progress_options::style::lines));
  p.interrupt();
  CHECK(t.out.empty());
}

TEST_CASE("the process's first report publishes its step, total, steps/s and mean loss as metrics") {
  fake_terminal t;
  auto o = t.options(progress_options::style::lines);
  o.loss_window = 2;
  progress p(10, o);
  auto& r = metrics::process_registry();
  CHECK(r.value("pscoro_progress_total_steps") == 10);
  CHECK_FALSE(r.value("pscoro_progress_loss").has_value());  // no loss yet
  t.now += 2s;
  p.update(4, 1.0);
  t.now += 2s;
  p.update(8, 3.0);
  CHECK(r.value("pscoro_progress_step") == 8);
  CHECK(r.value("pscoro_progress_steps_per_second") == doctest::Approx(2.0));  // 8 steps in 4 s
  CHECK(r.value("pscoro_progress_loss") == doctest::Approx(2.0));              // mean of the window
  // A second report while the first lives publishes nothing: the series stay the first one's.
  progress second(100, o);
  second.update(50, 9.0);
  CHECK(r.value("pscoro_progress_step") == 8);
}

TEST_CASE("on a pipe it prints lines, unless PSCORO_PROGRESS_TTY=1 says the pipe ends at a terminal") {
  const auto run = [] {
    progress_options o;
    o.label = "chief: ";
    o.print_every = 2;
    progress report(2, std::move(o));
    report.update(2, 0.5);
    report.finish();
  };
  const auto lines = pscoro::testing::stdout_of(run);
  // A line in the log format (print_line's): the time, the level and this process's task first.
  CHECK(contains(lines, " INFO ["));
  CHECK(contains(lines, "] chief: step 2/2 loss 0.5000 "));
  CHECK(lines.ends_with("\n"));
  CHECK(!contains(lines, "\r"));
  pscoro::testing::scoped_environment tty("PSCORO_PROGRESS_TTY", "1");
  const auto redrawn = pscoro::testing::stdout_of(run);
  CHECK(starts_with(redrawn, "\rchief: [==============================] step 2/2 loss 0.5000 "));
  CHECK(redrawn.ends_with("\n"));
}
