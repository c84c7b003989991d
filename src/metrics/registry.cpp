// The registry and its Prometheus text exposition (format 0.0.4): series grouped by name into
// families, each family's HELP and TYPE once, label values and help escaped as the format says.
#include <pscoro/error.hpp>
#include <pscoro/metrics.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <variant>

namespace pscoro::metrics {

std::atomic<bool> detail::updating{true};

histogram::histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw error(errc::invalid_argument, "histogram bounds must be finite and strictly increasing");
    }
  }
  counts_ = std::make_unique<std::atomic<std::uint64_t>[]>(bounds_.size() + 1);
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

histogram::histogram() : histogram(default_seconds()) {}

std::vector<double> histogram::default_seconds() {
  // From 5 us: a ps answers most reads in tens of microseconds, which buckets from 100 us lumped
  // into one (a median read as "50 us").
  return {0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,    0.05,    0.1,      0.25,    0.5,    1,       2.5,    5,     10,     30,    60};
}

histogram::snapshot histogram::read() const {
  snapshot s;
  s.bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

double quantile_bound(const histogram::snapshot& h, double q) noexcept {
  if (h.count == 0 || h.bounds.empty()) return 0;
  // At least ceil(q * count) observations, and at least one.
  const double wanted = std::max(1.0, std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(h.count)));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < h.bounds.size(); ++i) {
    seen += h.counts[i];
    if (static_cast<double>(seen) >= wanted) return h.bounds[i];
  }
  return h.bounds.back();
}

namespace {

bool valid_name(std::string_view name, bool colons) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colons && c == ':');
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string_view type_name(metric_type t) {
  switch (t) {
    case metric_type::counter: return "counter";
    case metric_type::gauge: return "gauge";
    case metric_type::histogram: return "histogram";
  }
  return "untyped";
}

// Help text: backslash and line feed escaped. Label values: also the double quote.
void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

void append_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else if (v == std::floor(v) && std::fabs(v) < 1e15) {
    fmt::format_to(std::back_inserter(out), "{}", static_cast<long long>(v));
  } else {
    fmt::format_to(std::back_inserter(out), "{}", v);
  }
}

// {a="x",b="y"} with `extra` (a histogram's le) last; nothing for no labels.
void append_labels(std::string& out, const labels& set, const std::pair<std::string, std::string>* extra = nullptr) {
  if (set.empty() && !extra) return;
  out += '{';
  bool first = true;
  auto one = [&](const std::pair<std::string, std::string>& label) {
    if (!first) out += ',';
    first = false;
    out += label.first;
    out += "=\"";
    append_escaped(out, label.second, true);
    out += '"';
  };
  for (const auto& label : set) one(label);
  if (extra) one(*extra);
  out += '}';
}

labels sorted(labels set) {
  std::sort(set.begin(), set.end());
  return set;
}

}  // namespace

namespace {

// A family's series, summed by label set, as read at one moment.
struct series_value {
  double value = 0;
  histogram::snapshot buckets;
  bool has_histogram = false;
};
struct family {
  std::string help;
  metric_type type = metric_type::gauge;
  std::map<labels, series_value> series;
};

void add_histogram(series_value& into, const histogram::snapshot& s) {
  if (!into.has_histogram) {
    into.buckets = s;
    into.has_histogram = true;
    return;
  }
  // Series of one name share their bounds (checked when added).
  for (std::size_t i = 0; i < s.counts.size() && i < into.buckets.counts.size(); ++i) {
    into.buckets.counts[i] += s.counts[i];
  }
  into.buckets.count += s.count;
  into.buckets.sum += s.sum;
}

}  // namespace

struct registry::entry {
  std::uint64_t id = 0;
  std::string name;
  std::string help;
  metric_type type = metric_type::gauge;
  labels label_set;  // sorted by name
  std::variant<std::monostate, const counter*, const gauge*, const histogram*,
               std::function<std::vector<sample>()>>
      source;
};



struct registry::state {
  std::uint64_t next_id = 1;
  std::vector<entry> entries;

  // Every series, read now and grouped by name. Called under the registry's lock.
  std::map<std::string, family> read() const {
    std::map<std::string, family> out;
    auto add = [&out](const std::string& name, const std::string& help, metric_type type, const labels& set) -> series_value& {
      auto& f = out[name];
      if (f.series.empty()) {
        f.help = help;
        f.type = type;
      }
      return f.series[set];
    };
    for (const auto& e : entries) {
      if (const auto* c = std::get_if<const counter*>(&e.source)) {
        add(e.name, e.help, e.type, e.label_set).value += static_cast<double>((*c)->value());
      } else if (const auto* g = std::get_if<const gauge*>(&e.source)) {
        add(e.name, e.help, e.type, e.label_set).value += static_cast<double>((*g)->value());
      } else if (const auto* h = std::get_if<const histogram*>(&e.source)) {
        add_histogram(add(e.name, e.help, e.type, e.label_set), (*h)->read());
      } else if (const auto* collect = std::get_if<std::function<std::vector<sample>()>>(&e.source)) {
        for (auto& s : (*collect)()) {
          // A collector's samples follow the rules of added series; a bad one is left out.
          if (!valid_name(s.name, true) || s.type == metric_type::histogram) continue;
          if (const auto it = out.find(s.name); it != out.end() && (it->second.type != s.type)) continue;
          add(s.name, s.help, s.type, sorted(s.label_set)).value += s.value;
        }
      }
    }
    return out;
  }
};

registry::registration::registration(registration&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(other.id_) {}
registry::registration& registry::registration::operator=(registration&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = other.id_;
  }
  return *this;
}
registry::registration::~registration() { reset(); }
void registry::registration::reset() noexcept {
  if (owner_) owner_->remove(id_);
  owner_ = nullptr;
}

registry::registration registry::insert(entry e) {
  if (!valid_name(e.name, true)) throw error(errc::invalid_argument, fmt::format("bad metric name '{}'", e.name));
  for (const auto& [label, _] : e.label_set) {
    if (!valid_name(label, false) || label.starts_with("__") || (label == "le" && e.type == metric_type::histogram)) {
      throw error(errc::invalid_argument, fmt::format("bad label name '{}' for metric '{}'", label, e.name));
    }
  }
  e.label_set = sorted(std::move(e.label_set));
  for (std::size_t i = 1; i < e.label_set.size(); ++i) {
    if (e.label_set[i].first == e.label_set[i - 1].first) {
      throw error(errc::invalid_argument, fmt::format("label '{}' twice for metric '{}'", e.label_set[i].first, e.name));
    }
  }
  const std::lock_guard lock(mutex_);
  for (const auto& other : state_->entries) {
    if (other.name != e.name) continue;
    const auto* mine = std::get_if<const histogram*>(&e.source);
    const auto* theirs = std::get_if<const histogram*>(&other.source);
    if (other.help != e.help || other.type != e.type || (mine && theirs && (*mine)->bounds() != (*theirs)->bounds())) {
      throw error(errc::invalid_argument,
                  fmt::format("metric '{}' is registered already with another help, type or buckets", e.name));
    }
  }
  e.id = state_->next_id++;
  const auto id = e.id;
  state_->entries.push_back(std::move(e));
  return registration(this, id);
}

void registry::remove(std::uint64_t id) noexcept {
  const std::lock_guard lock(mutex_);
  auto& entries = state_->entries;
  entries.erase(std::remove_if(entries.begin(), entries.end(), [id](const entry& e) { return e.id == id; }),
                entries.end());
}

registry::registration registry::add(std::string name, std::string help, labels label_set, const counter& c) {
  return insert(entry{0, std::move(name), std::move(help), metric_type::counter, std::move(label_set), &c});
}
registry::registration registry::add(std::string name, std::string help, labels label_set, const gauge& g) {
  return insert(entry{0, std::move(name), std::move(help), metric_type::gauge, std::move(label_set), &g});
}
registry::registration registry::add(std::string name, std::string help, labels label_set, const histogram& h) {
  return insert(entry{0, std::move(name), std::move(help), metric_type::histogram, std::move(label_set), &h});
}
registry::registration registry::add_collector(std::function<std::vector<sample>()> collect) {
  if (!collect) throw error(errc::invalid_argument, "a metrics collector needs a function");
  const std::lock_guard lock(mutex_);
  entry e;
  e.id = state_->next_id++;
  e.source = std::move(collect);
  const auto id = e.id;
  state_->entries.push_back(std::move(e));
  return registration(this, id);
}

registry::registry() : state_(std::make_unique<state>()) {}
registry::~registry() = default;

std::string registry::expose() const {
  std::map<std::string, family> all;
  {
    const std::lock_guard lock(mutex_);
    all = state_->read();
  }
  std::string out;
  for (const auto& [name, f] : all) {
    out += "# HELP ";
    out += name;
    out += ' ';
    append_escaped(out, f.help, false);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type_name(f.type);
    out += '\n';
    for (const auto& [set, v] : f.series) {
      if (f.type != metric_type::histogram) {
        out += name;
        append_labels(out, set);
        out += ' ';
        append_number(out, v.value);
        out += '\n';
        continue;
      }
      const auto& h = v.buckets;
      std::uint64_t cumulative = 0;
      for (std::size_t i = 0; i < h.counts.size(); ++i) {
        cumulative += h.counts[i];
        std::string bound;
        if (i < h.bounds.size()) {
          append_number(bound, h.bounds[i]);
        } else {
          bound = "+Inf";
        }
        const std::pair<std::string, std::string> le{"le", bound};
        out += name;
        out += "_bucket";
        append_labels(out, set, &le);
        fmt::format_to(std::back_inserter(out), " {}\n", cumulative);
      }
      out += name;
      out += "_sum";
      append_labels(out, set);
      out += ' ';
      append_number(out, h.sum);
      out += '\n';
      out += name;
      out += "_count";
      append_labels(out, set);
      fmt::format_to(std::back_inserter(out), " {}\n", h.count);
    }
  }
  return out;
}

std::optional<double> registry::value(std::string_view name, const labels& label_set) const {
  std::map<std::string, family> all;
  {
    const std::lock_guard lock(mutex_);
    all = state_->read();
  }
  const auto f = all.find(std::string(name));
  if (f == all.end() || f->second.type == metric_type::histogram) return std::nullopt;
  const auto s = f->second.series.find(sorted(label_set));
  if (s == f->second.series.end()) return std::nullopt;
  return s->second.value;
}

std::optional<histogram::snapshot> registry::histogram_value(std::string_view name, const labels& label_set) const {
  std::map<std::string, family> all;
  {
    const std::lock_guard lock(mutex_);
    all = state_->read();
  }
  const auto f = all.find(std::string(name));
  if (f == all.end() || f->second.type != metric_type::histogram) return std::nullopt;
  const auto s = f->second.series.find(sorted(label_set));
  if (s == f->second.series.end()) return std::nullopt;
  return s->second.buckets;
}

std::vector<sample> registry::samples() const {
  std::map<std::string, family> all;
  {
    const std::lock_guard lock(mutex_);
    all = state_->read();
  }
  std::vector<sample> out;
  for (auto& [name, f] : all) {
    for (auto& [set, v] : f.series) {
      if (f.type != metric_type::histogram) {
        out.push_back({name, f.help, f.type, set, v.value});
        continue;
      }
      out.push_back({name + "_count", f.help, metric_type::counter, set, static_cast<double>(v.buckets.count)});
      out.push_back({name + "_sum", f.help, metric_type::counter, set, v.buckets.sum});
    }
  }
  return out;
}

registry& process_registry() {
  static registry* the = new registry;  // never destroyed: metrics of static objects unregister late
  return *the;
}

}  // namespace pscoro::metrics
