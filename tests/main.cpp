// The test programs' main: doctest's, plus one rule. tests/meson.build runs each test source as
// its own test by filtering one program's cases by file (--source-file); a filter that matches no
// case would pass without testing anything (a renamed file, a typo), so a run that selects no test
// case fails and says so. Listing runs (--list-test-cases and the like) are left alone.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

int selected_test_cases = 0;

// Counts the test cases that pass the filters and run.
struct selection_counter : doctest::IReporter {
  explicit selection_counter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++selected_test_cases; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("selection_counter", 1, selection_counter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;  // --help, --list-test-cases, --count, ...
  if (result == 0 && selected_test_cases == 0) {
    std::fprintf(stderr, "no test case matched the filters given (%d argument(s)): nothing was tested\n", argc - 1);
    return 1;
  }
  return result;
}
