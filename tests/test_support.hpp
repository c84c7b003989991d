// What every pscoro test includes: doctest (with real iostreams, so std::error_code prints) and
// small helpers that make a failing check say why.
//
// `contains(text, part)` and `starts_with(text, prefix)` return a text_match, which converts to
// bool and which doctest prints whole: a failing `CHECK(contains(m, "bad magic"))` reports
//   values: CHECK( "unknown frame kind 77" does not contain "bad magic" )
// instead of `CHECK( false )`. `!contains(m, part)` negates it and still prints both strings.
// An exception_ptr prints as what it holds (type, pscoro code and origin task, message), so
// `CHECK(e == nullptr)` and `REQUIRE(e)` say what was or was not thrown (as Boost.Cobalt's tests do).
// CHECK_THROWS* keep doctest's own report, the what(): CHECK_THROWS_WITH matches that exact string.
#pragma once

#include <pscoro/error.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <typeinfo>
#include <utility>

#include <cxxabi.h>
#include <unistd.h>

#include <doctest/doctest.h>

namespace pscoro::testing {

/// Whether a text contains (or starts with) a part, kept with both strings so doctest can print
/// them when a check fails.
class text_match {
 public:
  text_match(std::string text, std::string part, bool holds, std::string_view holds_as,
             std::string_view fails_as)
      : text_(std::move(text)), part_(std::move(part)), holds_(holds), holds_as_(holds_as), fails_as_(fails_as) {}

  explicit operator bool() const noexcept { return holds_ != negated_; }

  /// The opposite claim ("does not contain"); it prints the same two strings.
  friend text_match operator!(text_match m) {
    m.negated_ = !m.negated_;
    return m;
  }

  /// `"<text>" contains "<part>"` or `"<text>" does not contain "<part>"`: what is true of the
  /// text, whichever of the two the check expected.
  friend std::ostream& operator<<(std::ostream& out, const text_match& m) {
    return out << '"' << m.text_ << "\" " << (m.holds_ ? m.holds_as_ : m.fails_as_) << " \"" << m.part_ << '"';
  }

 private:
  std::string text_;
  std::string part_;
  bool holds_;
  bool negated_ = false;
  std::string_view holds_as_;
  std::string_view fails_as_;
};

/// The dynamic type of `x`, demangled ("std::out_of_range").
inline std::string type_name_of(const std::exception& x) {
  const char* mangled = typeid(x).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  return name;
}

/// What `e` holds, for a failure message, written like a value: its type, its code (and origin
/// task for a remote_error) and its message, e.g. `pscoro::error{pscoro:9 failed precondition,
/// "..."}`; "no exception" when null.
inline std::string describe_exception(const std::exception_ptr& e) {
  if (!e) return "no exception";
  std::ostringstream out;
  try {
    std::rethrow_exception(e);
  } catch (const remote_error& x) {
    out << "pscoro::remote_error{" << x.code() << " " << x.code().message() << ", from "
        << (x.origin_task().empty() ? "an unnamed task" : x.origin_task()) << ", \"" << x.remote_message() << "\"}";
  } catch (const std::system_error& x) {
    // pscoro::error and std::system_error: the code says which failure class it is.
    out << type_name_of(x) << "{" << x.code() << " " << x.code().message() << ", \"" << x.what() << "\"}";
  } catch (const std::exception& x) {
    out << type_name_of(x) << "{\"" << x.what() << "\"}";
  } catch (...) {
    out << "{an exception that is not a std::exception}";
  }
  return out.str();
}

/// Sets environment variable `name` for a scope and unsets it at the scope's end, however the scope
/// ends (a failed REQUIRE included), so no later test sees it.
class scoped_environment {
 public:
  scoped_environment(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~scoped_environment() { ::unsetenv(name_); }
  scoped_environment(const scoped_environment&) = delete;
  scoped_environment& operator=(const scoped_environment&) = delete;

 private:
  const char* name_;
};

/// The code of the exception in `e`. A null `e` throws std::logic_error (rethrowing null is
/// undefined), so a check of it fails saying nothing was thrown instead of crashing.
inline std::error_code code_of(std::exception_ptr e) {
  if (!e) throw std::logic_error("code_of: no exception was thrown");
  try {
    std::rethrow_exception(e);
  } catch (const std::system_error& s) {
    return s.code();
  }
}

/// The message of the exception in `e`; a null `e` throws std::logic_error, as in code_of.
inline std::string message_of(std::exception_ptr e) {
  if (!e) throw std::logic_error("message_of: no exception was thrown");
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

/// What `f` writes on stdout (a file meanwhile, not a terminal), flushed.
template <class F>
std::string stdout_of(F&& f) {
  std::fflush(stdout);
  std::FILE* file = std::tmpfile();
  if (!file) throw std::runtime_error("stdout_of: no temporary file");
  const int saved = ::dup(STDOUT_FILENO);
  ::dup2(::fileno(file), STDOUT_FILENO);
  try {
    std::forward<F>(f)();
  } catch (...) {
    std::fflush(stdout);
    ::dup2(saved, STDOUT_FILENO);
    ::close(saved);
    std::fclose(file);
    throw;
  }
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  return text;
}

}  // namespace pscoro::testing

/// True of `text` when it contains `part`; prints both when a check of it fails.
inline pscoro::testing::text_match contains(std::string text, std::string_view part) {
  const bool holds = text.find(part) != std::string::npos;
  return {std::move(text), std::string(part), holds, "contains", "does not contain"};
}

/// True of `text` when it starts with `prefix`; prints both when a check of it fails.
inline pscoro::testing::text_match starts_with(std::string text, std::string_view prefix) {
  const bool holds = text.starts_with(prefix);
  return {std::move(text), std::string(prefix), holds, "starts with", "does not start with"};
}

/// The pscoro::error `f` throws; when it throws none, a failed check and an errc::internal error
/// saying so.
template <class F>
pscoro::error error_thrown_by(F f) {
  try {
    f();
  } catch (const pscoro::error& e) {
    return e;
  }
  FAIL_CHECK("it threw nothing");
  return pscoro::error(pscoro::errc::internal, "it threw nothing");
}

template <>
struct doctest::StringMaker<std::exception_ptr> {
  static doctest::String convert(const std::exception_ptr& e) {
    const std::string text = pscoro::testing::describe_exception(e);
    return {text.c_str(), static_cast<doctest::String::size_type>(text.size())};
  }
};
