// pscoro-launch: runs a local cluster (chief + P ps + W workers) as separate processes on one host.
//
//   pscoro-launch --ps 2 --workers 2 -- ./my_training_program --steps 1000
//
// Every task runs the same program with its own TF_CONFIG. Servers (ps, workers) bind port 0 and
// report their real port on stdout ("pscoro: ps:0 listening on 127.0.0.1:40123"), so there is no
// pick-then-bind race; once all have reported, the chief starts with the real addresses. Every line
// it writes is a log line in the tasks' format (text, or JSON with PSCORO_LOG_FORMAT=json): a task's
// log line as it is (it names its task), any other line of a task wrapped in one of that task, and
// the launcher's own lines as task "launcher". When the launcher's stdout is a terminal the chief is told
// so (PSCORO_PROGRESS_TTY=1) and its redrawn progress line is drawn there, below the other lines
// (text format only). The chief ends the job when it closes: the servers
// exit on their own with its code (code 0 is never a failure); those still running a grace period
// after the chief's exit (at once, when a signal ended the chief) get SIGTERM, then SIGKILL after
// another; the launcher exits with the chief's code (128 + signal for a signal).
//
// Every task of the job shares a fresh random cluster secret (PSCORO_AUTH_SECRET_FILE names a file
// only the launcher's user can read, removed when the launcher ends), so nobody else on the host can
// talk to the job's ports; a PSCORO_AUTH_SECRET_FILE already set is used as it is.
//
// A cluster manager's restarts, for trying fault tolerance on one machine: --restart-workers starts
// a worker that ends while the chief runs again at its address; --restart-ps does the same for a ps
// (a chief told to, checkpoint_manager::restore_lost_ps, restores it in place); --restart-chief
// starts a chief killed by a signal again (it resumes from its checkpoint). A task that ends and is not restarted
// fails the job: before the chief started at once; after, once the chief had the grace period to
// notice and report it (a lost ps fails the chief with a message naming it), with the chief's code
// if it exits meanwhile, else the task's.
#include "command_line.hpp"

// Before Asio: <pscoro/config.hpp> sets up Asio's coroutine support for clang.
#include <pscoro/log.hpp>

#include <nlohmann/json.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read_until.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

extern char** environ;

namespace {

using asio::experimental::as_tuple;
using asio::use_awaitable;

// What the launcher writes on its stdout, its own lines and its tasks': one line at a time, except
// the chief's progress line, redrawn in place below them on a terminal.
class console {
 public:
  // The launcher's own line: a log line of task "launcher".
  void say(pscoro::log_level level, std::string_view message) {
    write_line(pscoro::format_log_line({level, "launcher", std::chrono::system_clock::now(), message}),
               level >= pscoro::log_level::warning);
  }

  // A whole line a task wrote: as it is when it is a log line (its record names the task), any
  // other line (a crash message, a program that is not pscoro's) wrapped in a log line of `task`.
  // Returns what the line says: its message, or the line itself when it was not a log line.
  std::string relay_line(const std::string& task, std::string_view line) {
    if (auto message = message_of(line)) {
      write_line(line, false);
      return std::move(*message);
    }
    write_line(pscoro::format_log_line({pscoro::log_level::info, task, std::chrono::system_clock::now(), line}), false);
    return std::string(line);
  }

  // What a task draws after a `\r`: redrawn in place, padded over a longer previous text.
  void redraw(const std::string& label, const std::string& task, std::string_view text) {
    if (json_) {
      if (!text.empty()) relay_line(task, text);
      return;
    }
    if (!drawn_label_.empty() && drawn_label_ != label) end_redrawn_line();
    std::string out = fmt::format("\r[{}] {}", label, text);
    const std::size_t width = out.size() - 1;
    if (width < drawn_width_) out.append(drawn_width_ - width, ' ');
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    drawn_label_ = label;
    drawn_width_ = width;
  }

  // Other output starts on a line of its own; the next redraw draws a fresh line.
  void end_redrawn_line() {
    if (drawn_label_.empty()) return;
    std::fputc('\n', stdout);
    std::fflush(stdout);
    drawn_label_.clear();
    drawn_width_ = 0;
  }

  bool json() const noexcept { return json_; }

 private:
  // The message of a log line in the format in use; none when `line` is not one.
  std::optional<std::string> message_of(std::string_view line) const {
    if (json_) {
      if (line.empty() || line.front() != '{') return std::nullopt;
      const auto record = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
      if (!record.is_object()) return std::nullopt;
      const auto m = record.find("message");
      if (m == record.end() || !m->is_string()) return std::nullopt;
      return m->get<std::string>();
    }
    return text_message_of(line);
  }

  // "2026-11-23T21:52:21.123Z INFO [ps:0] message" (format_log_line's text form) -> "message".
  static std::optional<std::string> text_message_of(std::string_view line) {
    static const std::regex record(R"(^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z )"
                                   R"((DEBUG|INFO|WARNING|ERROR) \[[^\]]*\] )");
    std::match_results<std::string_view::const_iterator> m;
    if (!std::regex_search(line.begin(), line.end(), m, record)) return std::nullopt;
    return std::string(m[0].second, line.end());
  }

  void write_line(std::string_view line, bool to_stderr) {
    end_redrawn_line();
    std::FILE* stream = to_stderr ? stderr : stdout;
    std::fwrite(line.data(), 1, line.size(), stream);
    std::fputc('\n', stream);
    std::fflush(stream);
  }

  bool json_ = pscoro::log_format_is_json();
  std::string drawn_label_;  // whose line is drawn unfinished, none if empty
  std::size_t drawn_width_ = 0;
};

struct task {
  task(std::string j, int i, std::string l) : job(std::move(j)), index(i), label(std::move(l)) {}

  std::string job;
  int index;
  std::string label;  // "ps-0"
  pid_t pid = -1;
  std::optional<int> exit_code;
  std::optional<std::string> address;  // reported by a server
  int restarts = 0;
};

class launcher {
 public:
  struct restart_policy {
    bool workers = false;
    bool ps = false;
    bool chief = false;
    int max_restarts = 20;                       // per task
    std::chrono::milliseconds delay{500};        // before a restart, against crash loops
  };

  /// Where to keep a Prometheus file_sd file of every task's metrics address (none: no file).
  void write_file_sd(std::filesystem::path path) { file_sd_ = std::move(path); }

  launcher(asio::io_context& io, console& out, int num_ps, int num_workers, std::string host,
           std::vector<std::string> command, std::chrono::seconds grace, std::chrono::seconds startup_timeout,
           restart_policy restarts)
      : io_(io),
        out_(out),
        host_(std::move(host)),
        command_(std::move(command)),
        grace_(grace),
        startup_timeout_(startup_timeout),
        restarts_(restarts),
        signals_(io, SIGCHLD, SIGINT, SIGTERM),
        startup_timer_(io) {
    for (int i = 0; i < num_ps; ++i) tasks_.emplace_back("ps", i, fmt::format("ps-{}", i));
    for (int i = 0; i < num_workers; ++i) tasks_.emplace_back("worker", i, fmt::format("worker-{}", i));
  }

  void start() {
    watch_signals();
    for (auto& t : tasks_) spawn(t, server_config(t));
    startup_timer_.expires_after(startup_timeout_);
    startup_timer_.async_wait([this](std::error_code ec) {
      if (ec || chief_started_ || stopping_) return;
      out_.say(pscoro::log_level::error, fmt::format("servers did not report their ports within {}s",
                                                     static_cast<long long>(startup_timeout_.count())));
      stop_all(1);
    });
  }

  int exit_code() const { return exit_code_; }

 private:
  nlohmann::json cluster(bool with_real_addresses) const {
    nlohmann::json c;
    c["chief"] = nlohmann::json::array({host_ + ":0"});
    for (const auto& t : tasks_) {
      if (t.job == "chief") continue;
      c[t.job].push_back(with_real_addresses && t.address ? *t.address : host_ + ":0");
    }
    return c;
  }

  std::string server_config(const task& t) const {
    return nlohmann::json{{"cluster", cluster(false)}, {"task", {{"type", t.job}, {"index", t.index}}}}.dump();
  }

  // The chief knows every server's real address (servers restart where they were).
  std::string chief_config() const {
    return nlohmann::json{{"cluster", cluster(true)}, {"task", {{"type", "chief"}, {"index", 0}}}}.dump();
  }

  // A restarted server binds the address it reported: the others know it there.
  std::string restart_config(const task& t) const {
    if (t.job == "chief") return chief_config();
    auto c = cluster(false);
    c[t.job][static_cast<std::size_t>(t.index)] = *t.address;
    return nlohmann::json{{"cluster", c}, {"task", {{"type", t.job}, {"index", t.index}}}}.dump();
  }

  bool restartable(const task& t) const {
    if (stopping_ || !chief_started_ || t.restarts >= restarts_.max_restarts) return false;
    // A worker that exits 0 was told by the chief that the job ended.
    if (t.job == "worker") return restarts_.workers && t.address.has_value() && *t.exit_code != 0;
    if (t.job == "ps") return restarts_.ps && t.address.has_value() && *t.exit_code != 0;
    // A chief that exits on its own ends the job, whatever its code; only a killed one comes back.
    return t.job == "chief" && restarts_.chief && *t.exit_code > 128;
  }

  void restart(task& t) {
    ++t.restarts;
    out_.say(pscoro::log_level::info, fmt::format("restarting {} in {} ms (restart {})", t.label,
                                                  static_cast<long long>(restarts_.delay.count()), t.restarts));
    auto timer = std::make_shared<asio::steady_timer>(io_, restarts_.delay);
    timer->async_wait([this, timer, &t](std::error_code ec) {
      if (ec || stopping_) return;
      t.exit_code.reset();
      spawn(t, restart_config(t));
    });
  }

  void spawn(task& t, const std::string& tf_config) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
    if (pid == 0) {
      // Child: dies with the launcher, writes both streams into the pipe.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::setenv("TF_CONFIG", tf_config.c_str(), 1);
      if (t.job == "chief" && progress_on_terminal_) ::setenv("PSCORO_PROGRESS_TTY", "1", 1);
      std::vector<char*> argv;
      for (const auto& arg : command_) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "pscoro-launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    t.pid = pid;
    out_.say(pscoro::log_level::info, fmt::format("started {} (pid {})", t.label, pid));
    ++open_relays_;
    asio::co_spawn(io_, relay_output(t.label, fmt::format("{}:{}", t.job, t.index), fds[0]), asio::detached);
  }

  // Copies the child's lines to stdout as log lines of its task; notes a server's reported address.
  // Text after a `\r` (a progress line redrawn) is redrawn at once under its label, not held until
  // the line ends.
  asio::awaitable<void> relay_output(std::string label, std::string task, int fd) {
    asio::posix::stream_descriptor pipe(io_, fd);
    static const std::regex listening(R"(^pscoro: (\w+):(\d+) listening on (\S+)$)");
    std::string pending;     // what follows the last line end or `\r` read
    bool redrawing = false;  // `pending` follows a `\r`
    std::string drawn;       // what was redrawn last, not drawn again when its `\r` or line end comes
    const auto redraw = [&](const std::string& text) {
      if (text != drawn) out_.redraw(label, task, text);
      drawn = text;
    };
    std::array<char, 4096> chunk;
    for (;;) {
      auto [ec, n] = co_await pipe.async_read_some(asio::buffer(chunk), as_tuple(use_awaitable));
      if (ec) break;
      pending.append(chunk.data(), n);
      std::size_t start = 0;
      for (auto end = pending.find_first_of("\r\n"); end != std::string::npos;
           end = pending.find_first_of("\r\n", start)) {
        const std::string piece = pending.substr(start, end - start);
        start = end + 1;
        if (pending[end] == '\r') {
          if (!piece.empty()) redraw(piece);
          redrawing = true;
          continue;
        }
        if (redrawing) {
          if (!piece.empty()) redraw(piece);
          out_.end_redrawn_line();
          redrawing = false;
          drawn.clear();
          continue;
        }
        const std::string message = out_.relay_line(task, piece);
        std::smatch m;
        if (std::regex_match(message, m, listening)) on_listening(m[1], std::stoi(m[2]), m[3]);
        // "<task> metrics at http://<host:port>/metrics", as server.cpp logs it.
        static const std::regex metrics_at(R"((\w+:\d+) metrics at http://(\S+)/metrics$)");
        if (std::regex_search(message, m, metrics_at)) on_metrics(m[1], m[2]);
      }
      pending.erase(0, start);
      if (redrawing && !pending.empty() && !out_.json()) redraw(pending);
    }
    if (redrawing) {
      out_.end_redrawn_line();
    } else if (!pending.empty()) {
      out_.relay_line(task, pending);
    }
    if (--open_relays_ == 0 && finishing_) io_.stop();
  }

  // A task serves its metrics at `address` (host:port): the file_sd file gets it, and the chief's
  // address is where its cluster page is.
  void on_metrics(const std::string& task, const std::string& address) {
    if (task == "chief:0") out_.say(pscoro::log_level::info, fmt::format("cluster page at http://{}/", address));
    if (file_sd_.empty()) return;
    metrics_at_[task] = address;
    // Prometheus's file_sd format: target groups, each with its labels. Written beside and renamed
    // into place, so Prometheus never reads half a file.
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& [name, at] : metrics_at_) {
      groups.push_back({{"targets", {at}}, {"labels", {{"task", name}, {"job", name.substr(0, name.find(':'))}}}});
    }
    const std::filesystem::path partial = file_sd_.string() + ".tmp";
    std::ofstream(partial) << groups.dump(2) << '\n';
    std::error_code ec;
    std::filesystem::rename(partial, file_sd_, ec);
    if (ec) {
      out_.say(pscoro::log_level::warning,
               fmt::format("cannot write the Prometheus file_sd file {}: {}", file_sd_.string(), ec.message()));
    }
  }

  void on_listening(const std::string& job, int index, const std::string& address) {
    for (auto& t : tasks_) {
      if (t.job == job && t.index == index) t.address = address;
    }
    const bool all = std::all_of(tasks_.begin(), tasks_.end(), [](const task& t) { return t.address.has_value(); });
    if (all && !chief_started_ && !stopping_) {
      chief_started_ = true;
      startup_timer_.cancel();
      tasks_.emplace_back("chief", 0, "chief");
      spawn(tasks_.back(), chief_config());
    }
  }

  void watch_signals() {
    signals_.async_wait([this](std::error_code ec, int signal) {
      if (ec) return;
      if (signal == SIGCHLD) {
        reap();
      } else {
        out_.say(pscoro::log_level::warning, fmt::format("signal {}, stopping the cluster", signal));
        stop_all(128 + signal);
      }
      if (!all_exited()) watch_signals();
    });
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& t : tasks_) {
        if (t.pid != pid) continue;
        t.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        out_.say(pscoro::log_level::info, fmt::format("{} exited with {}", t.label, *t.exit_code));
        if (stopping_ || chief_ended_) continue;  // a server exiting after the chief: expected
        if (restartable(t)) {
          restart(t);
        } else if (t.job == "chief") {
          chief_exited(*t.exit_code);  // the chief ending ends the job
        } else if (*t.exit_code == 0 && chief_started_) {
          // A server ends cleanly while the chief runs when the chief has ended the job (Shutdown):
          // the chief's own exit follows, and its code is the job's.
        } else if (!chief_started_) {
          out_.say(pscoro::log_level::error,
                   fmt::format("{} ended before the chief started; stopping the cluster", t.label));
          stop_all(*t.exit_code == 0 ? 1 : *t.exit_code);
        } else {
          fail_later(t);
        }
      }
    }
    if (all_exited()) finish();
  }

  // The chief has exited with `code`. One that ended the job (an exit code, not a signal) told the
  // servers to exit with its code, and they are on their way: they get the grace period to do so,
  // and only those still running then are stopped (a SIGTERM would race their own exit). After a
  // signal nobody told them: they are stopped now.
  void chief_exited(int code) {
    if (code >= 128) {
      stop_all(code);
      return;
    }
    chief_ended_ = true;
    exit_code_ = code;
    if (all_exited()) return;
    settle_timer_.emplace(io_, grace_);
    settle_timer_->async_wait([this, code](std::error_code ec) {
      if (!ec) stop_all(code);
    });
  }

  // A server ended for good while the chief runs. Either the chief ended the job (it told the
  // servers to exit with its code, and its own exit follows) or the server failed, and the chief
  // gets the grace period to notice and report it (its exit then ends the job). Only a chief still
  // running after that fails the job, with the task's code: a job the chief ended is not reported
  // as a failure of its servers.
  void fail_later(const task& t) {
    if (failure_timer_) return;
    failure_timer_.emplace(io_, grace_);
    failure_timer_->async_wait(
        [this, label = t.label, code = *t.exit_code == 0 ? 1 : *t.exit_code](std::error_code ec) {
          if (ec || chief_ended_) return;
          out_.say(pscoro::log_level::error,
                   fmt::format("{} ended and the chief did not end the job within {}s; stopping the cluster", label,
                               static_cast<long long>(grace_.count())));
          stop_all(code);
        });
  }

  // Every task has exited. What a task wrote last (the chief's result) may still wait in its pipe,
  // and its SIGCHLD can come first: stop once every relay has read its pipe to the end, or after 5 s
  // (a process the task started may hold the pipe open).
  void finish() {
    if (std::exchange(finishing_, true)) return;
    if (settle_timer_) settle_timer_->cancel();
    if (open_relays_ == 0) {
      io_.stop();
      return;
    }
    drain_timer_.emplace(io_, std::chrono::seconds(5));
    drain_timer_->async_wait([this](std::error_code ec) {
      if (!ec) io_.stop();
    });
  }

  bool all_exited() const {
    return std::all_of(tasks_.begin(), tasks_.end(), [](const task& t) { return t.exit_code.has_value(); });
  }

  void stop_all(int code) {
    if (stopping_) return;
    stopping_ = true;
    exit_code_ = code;
    startup_timer_.cancel();
    if (failure_timer_) failure_timer_->cancel();
    for (const auto& t : tasks_) {
      if (!t.exit_code) ::kill(t.pid, SIGTERM);
    }
    if (all_exited()) {
      finish();
      return;
    }
    kill_timer_.emplace(io_, grace_);
    kill_timer_->async_wait([this](std::error_code ec) {
      if (ec) return;
      for (const auto& t : tasks_) {
        if (!t.exit_code) {
          out_.say(pscoro::log_level::warning,
                   fmt::format("{} did not stop within the grace period; killing it", t.label));
          ::kill(t.pid, SIGKILL);
        }
      }
    });
  }

  asio::io_context& io_;
  console& out_;
  // The chief redraws its progress line when it reaches a terminal through this launcher.
  bool progress_on_terminal_ = ::isatty(STDOUT_FILENO) == 1 && !out_.json();
  std::string host_;
  std::vector<std::string> command_;
  std::chrono::seconds grace_;
  std::chrono::seconds startup_timeout_;
  restart_policy restarts_;
  asio::signal_set signals_;
  asio::steady_timer startup_timer_;
  std::optional<asio::steady_timer> kill_timer_;
  std::optional<asio::steady_timer> settle_timer_;  // the servers' own exit after the chief's
  std::optional<asio::steady_timer> failure_timer_;
  std::optional<asio::steady_timer> drain_timer_;
  std::size_t open_relays_ = 0;  // children's pipes still being read
  bool finishing_ = false;
  std::deque<task> tasks_;  // restart timers refer to tasks: a deque keeps them in place
  bool chief_started_ = false;
  bool stopping_ = false;
  bool chief_ended_ = false;  // the chief exited with a code: the servers exit on their own
  int exit_code_ = 0;
  std::filesystem::path file_sd_;
  std::map<std::string, std::string> metrics_at_;  // task -> host:port of its metrics
};

// A fresh cluster secret for one job, in a file only this user can read; removed with the object.
class job_secret {
 public:
  job_secret() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/pscoro-launch-XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp " + pattern);
    dir_ = pattern;  // mode 0700
    unsigned char bytes[32];
    for (std::size_t got = 0; got < sizeof(bytes);) {
      const auto n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
      if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "getrandom");
      if (n > 0) got += static_cast<std::size_t>(n);
    }
    path_ = dir_ + "/cluster-secret";
    const mode_t old_mask = ::umask(077);
    std::ofstream out(path_, std::ios::binary);
    ::umask(old_mask);
    for (const auto b : bytes) out << fmt::format("{:02x}", b);
    out << '\n';
    if (!out.flush()) throw std::runtime_error("cannot write the cluster secret to " + path_);
  }
  ~job_secret() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  job_secret(const job_secret&) = delete;
  job_secret& operator=(const job_secret&) = delete;

  const std::string& path() const noexcept { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs a pscoro cluster (chief, ps, workers) as processes on this host."};
  int num_ps = 1;
  int num_workers = 2;
  std::string host = "127.0.0.1";
  int grace = 5;
  int startup_timeout = 60;
  std::vector<std::string> command;
  app.add_option("--ps", num_ps, "number of parameter servers")->check(CLI::Range(1, 64));
  app.add_option("--workers", num_workers, "number of workers")->check(CLI::Range(1, 256));
  app.add_option("--host", host, "address every task binds");
  app.add_option("--grace-period", grace, "seconds between SIGTERM and SIGKILL when stopping")->check(CLI::NonNegativeNumber);
  app.add_option("--startup-timeout", startup_timeout, "seconds for the servers to report their ports")
      ->check(CLI::PositiveNumber);
  launcher::restart_policy restarts;
  app.add_flag("--restart-workers", restarts.workers,
               "start a worker that ends while the chief runs again, at its address");
  app.add_flag("--restart-ps", restarts.ps,
               "start a ps that ends while the chief runs again, at its address (empty: the chief restores it)");
  app.add_flag("--restart-chief", restarts.chief, "start a chief killed by a signal again");
  app.add_option("--max-restarts", restarts.max_restarts, "restarts per task before its end fails the job")
      ->check(CLI::NonNegativeNumber);
  std::string file_sd;
  app.add_option("--prometheus-file-sd", file_sd,
                 "keep a Prometheus file_sd JSON file of every task's metrics address here (every task serves "
                 "metrics then: PSCORO_METRICS_PORT=0 unless set)");
  app.add_option("command", command, "the program every task runs, and its arguments")->required();
  app.allow_extras(false);
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;

  console out;
  try {
    std::optional<job_secret> secret;
    if (const char* given = std::getenv("PSCORO_AUTH_SECRET_FILE"); !given || !*given) {
      secret.emplace();
      ::setenv("PSCORO_AUTH_SECRET_FILE", secret->path().c_str(), 1);  // every task inherits it
    }
    asio::io_context io;
    if (!file_sd.empty()) ::setenv("PSCORO_METRICS_PORT", "0", 0);  // every task inherits it
    launcher l(io, out, num_ps, num_workers, host, command, std::chrono::seconds(grace),
               std::chrono::seconds(startup_timeout), restarts);
    if (!file_sd.empty()) l.write_file_sd(file_sd);
    l.start();
    io.run();
    out.end_redrawn_line();
    return l.exit_code();
  } catch (const std::exception& e) {
    out.say(pscoro::log_level::error, e.what());
    return 1;
  }
}
