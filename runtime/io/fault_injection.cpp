#include "io/fault_injection.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/align.h"
#include "common/units.h"
#include "io/io_limits.h"

namespace strata::io {

namespace {

constexpr std::array<const char*, kFaultKindCount> kKindNames = {"eio",   "enospc", "eagain",
                                                                 "short", "stall",  "corrupt"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> split(std::string_view s, char separator) {
  std::vector<std::string_view> parts;
  for (;;) {
    const size_t at = s.find(separator);
    parts.push_back(trim(s.substr(0, at)));
    if (at == std::string_view::npos) {
      return parts;
    }
    s.remove_prefix(at + 1);
  }
}

bool parse_u64(std::string_view text, uint64_t* out) {
  if (text.empty()) {
    return false;
  }
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      return false;
    }
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      return false;
    }
    value = value * 10 + digit;
  }
  *out = value;
  return true;
}

Status parse_rule(std::string_view text, FaultRule* rule) {
  const auto fields = split(text, ':');
  auto bad = [&](const std::string& why) {
    return invalid_argument("fault rule '" + std::string(text) + "': " + why);
  };
  if (fields.size() < 2) {
    return bad("expected op:kind[:key=value...]");
  }

  if (fields[0] == "read") {
    rule->op = FaultOp::kRead;
  } else if (fields[0] == "write") {
    rule->op = FaultOp::kWrite;
  } else if (fields[0] == "any") {
    rule->op = FaultOp::kAny;
  } else {
    return bad("op '" + std::string(fields[0]) + "' is not read, write or any");
  }
  bool known_kind = false;
  for (size_t k = 0; k < kFaultKindCount; ++k) {
    if (fields[1] == kKindNames[k]) {
      rule->kind = static_cast<FaultKind>(k);
      known_kind = true;
    }
  }
  if (!known_kind) {
    return bad("kind '" + std::string(fields[1]) +
               "' is not eio, enospc, eagain, short, stall or corrupt");
  }
  if (rule->kind == FaultKind::kCorrupt && rule->op == FaultOp::kWrite) {
    return bad("corrupt applies to reads (it flips bytes of data read back)");
  }

  for (size_t i = 2; i < fields.size(); ++i) {
    const size_t eq = fields[i].find('=');
    if (eq == std::string_view::npos) {
      return bad("'" + std::string(fields[i]) + "' is not key=value");
    }
    const std::string_view key = trim(fields[i].substr(0, eq));
    const std::string_view value = trim(fields[i].substr(eq + 1));
    uint64_t number = 0;
    if (key == "every") {
      if (!parse_u64(value, &number) || number == 0) {
        return bad("every= wants a positive integer");
      }
      rule->every = number;
    } else if (key == "p") {
      char* end = nullptr;
      const std::string copy(value);
      const double p = std::strtod(copy.c_str(), &end);
      if (copy.empty() || end != copy.c_str() + copy.size() || !(p >= 0.0 && p <= 1.0)) {
        return bad("p= wants a probability between 0 and 1");
      }
      rule->probability = p;
    } else if (key == "seed") {
      if (!parse_u64(value, &number)) {
        return bad("seed= wants an integer");
      }
      rule->seed = number;
    } else if (key == "count") {
      if (!parse_u64(value, &number) || number == 0) {
        return bad("count= wants a positive integer");
      }
      rule->count = number;
    } else if (key == "ms") {
      if (!parse_u64(value, &number) || number > 60'000) {
        return bad("ms= wants 0..60000");
      }
      rule->stall_ms = static_cast<uint32_t>(number);
    } else if (key == "bytes") {
      if (!parse_u64(value, &number) || number == 0 || number > 4096) {
        return bad("bytes= wants 1..4096");
      }
      rule->corrupt_bytes = static_cast<uint32_t>(number);
    } else if (key == "offset") {
      const size_t dash = value.find('-');
      const auto begin = parse_bytes(trim(value.substr(0, dash)));
      std::optional<uint64_t> end = std::numeric_limits<uint64_t>::max();
      if (dash != std::string_view::npos && !trim(value.substr(dash + 1)).empty()) {
        end = parse_bytes(trim(value.substr(dash + 1)));
      }
      if (!begin || !end || *begin >= *end) {
        return bad("offset= wants A-B with A < B");
      }
      rule->offset_begin = *begin;
      rule->offset_end = *end;
    } else {
      return bad("unknown key '" + std::string(key) + "'");
    }
  }
  return Status::ok();
}

bool op_matches(FaultOp rule_op, IoOp op) {
  return rule_op == FaultOp::kAny || (rule_op == FaultOp::kRead) == (op == IoOp::kRead);
}

}  // namespace

const char* fault_kind_name(FaultKind kind) {
  return kKindNames[static_cast<size_t>(kind)];
}

Result<FaultPlan> FaultPlan::parse(std::string_view spec) {
  FaultPlan plan;
  for (std::string_view text : split(spec, ';')) {
    if (text.empty()) {
      continue;
    }
    FaultRule rule;
    rule.seed = plan.rules.size() + 1;  // distinct default streams per rule
    STRATA_TRY(parse_rule(text, &rule));
    plan.rules.push_back(rule);
  }
  return plan;
}

std::string FaultPlan::to_string() const {
  std::string out;
  for (const FaultRule& r : rules) {
    if (!out.empty()) {
      out += ';';
    }
    out += r.op == FaultOp::kRead ? "read" : r.op == FaultOp::kWrite ? "write" : "any";
    out += ':';
    out += fault_kind_name(r.kind);
    if (r.every != 1) {
      out += ":every=" + std::to_string(r.every);
    }
    if (r.probability != 1.0) {
      out += ":p=" + std::to_string(r.probability);
    }
    if (r.probability != 1.0) {
      out += ":seed=" + std::to_string(r.seed);
    }
    if (r.offset_begin != 0 || r.offset_end != std::numeric_limits<uint64_t>::max()) {
      out += ":offset=" + std::to_string(r.offset_begin) + "-";
      if (r.offset_end != std::numeric_limits<uint64_t>::max()) {
        out += std::to_string(r.offset_end);
      }
    }
    if (r.count != 0) {
      out += ":count=" + std::to_string(r.count);
    }
    if (r.kind == FaultKind::kStall) {
      out += ":ms=" + std::to_string(r.stall_ms);
    }
    if (r.kind == FaultKind::kCorrupt) {
      out += ":bytes=" + std::to_string(r.corrupt_bytes);
    }
  }
  return out;
}

Result<FaultPlan> fault_plan_from_env(const char* variable) {
  // Read at setup, before engine threads exist; Strata itself never calls setenv.
  const char* spec = std::getenv(variable);  // NOLINT(concurrency-mt-unsafe)
  if (spec == nullptr) {
    return FaultPlan{};
  }
  auto plan = FaultPlan::parse(spec);
  if (!plan) {
    return std::move(plan).take_status().with_context(std::string("$") + variable);
  }
  return plan;
}

Result<std::unique_ptr<FaultInjectingEngine>> FaultInjectingEngine::wrap(
    std::unique_ptr<IoEngine> inner, FaultPlan plan) {
  if (inner == nullptr) {
    return invalid_argument("FaultInjectingEngine: no engine to wrap");
  }
  auto* target = dynamic_cast<TransferHookTarget*>(inner.get());
  if (target == nullptr) {
    return unsupported(std::string("FaultInjectingEngine: engine '") + inner->name() +
                       "' has no transfer hook");
  }
  std::unique_ptr<FaultInjectingEngine> engine(new FaultInjectingEngine(std::move(plan)));
  engine->name_ = std::string("faults(") + inner->name() + ")";
  target->set_transfer_hook(engine.get());
  engine->inner_ = std::move(inner);
  return engine;
}

FaultInjectingEngine::FaultInjectingEngine(FaultPlan plan)
    : plan_(std::move(plan)), states_(plan_.rules.size()) {
  for (size_t i = 0; i < states_.size(); ++i) {
    states_[i].random.seed(plan_.rules[i].seed);
  }
}

FaultInjectingEngine::~FaultInjectingEngine() {
  inner_.reset();
}

uint64_t FaultInjectingEngine::injected_total() const {
  uint64_t total = 0;
  for (const auto& n : injected_) {
    total += n.load(std::memory_order_relaxed);
  }
  return total;
}

bool FaultInjectingEngine::fires(size_t i, const TransferAttempt& attempt) {
  const FaultRule& rule = plan_.rules[i];
  RuleState& state = states_[i];
  if (!op_matches(rule.op, attempt.op)) {
    return false;
  }
  if (attempt.offset >= rule.offset_end || attempt.offset + attempt.length <= rule.offset_begin) {
    return false;
  }
  if (rule.count != 0 && state.fired >= rule.count) {
    return false;
  }
  ++state.matches;
  if (state.matches % rule.every != 0) {
    return false;
  }
  if (rule.probability < 1.0 &&
      std::uniform_real_distribution<double>(0.0, 1.0)(state.random) >= rule.probability) {
    return false;
  }
  ++state.fired;
  return true;
}

int FaultInjectingEngine::before_transfer(const TransferAttempt& attempt) {
  uint32_t stall_ms = 0;
  int error = 0;
  {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < plan_.rules.size() && error == 0; ++i) {
      const FaultKind kind = plan_.rules[i].kind;
      if (kind != FaultKind::kEio && kind != FaultKind::kEnospc && kind != FaultKind::kEagain &&
          kind != FaultKind::kStall) {
        continue;
      }
      if (!fires(i, attempt)) {
        continue;
      }
      count(kind);
      switch (kind) {
        case FaultKind::kEio:
          error = EIO;
          break;
        case FaultKind::kEnospc:
          error = ENOSPC;
          break;
        case FaultKind::kEagain:
          error = EAGAIN;
          break;
        default:
          stall_ms += plan_.rules[i].stall_ms;
          break;
      }
    }
  }
  // Sleeping here holds up the engine thread, as a hung device holds up its queue.
  if (stall_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
  }
  return -error;
}

int FaultInjectingEngine::after_transfer(const TransferAttempt& attempt, int result) {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < plan_.rules.size(); ++i) {
    const FaultRule& rule = plan_.rules[i];
    if (rule.kind == FaultKind::kShort) {
      // Half, in whole 4 KiB units, so the remainder stays valid for O_DIRECT.
      if (result < static_cast<int>(2 * kIoAlignment) || !fires(i, attempt)) {
        continue;
      }
      count(FaultKind::kShort);
      result = static_cast<int>(align_down(static_cast<uint64_t>(result) / 2, kIoAlignment));
    } else if (rule.kind == FaultKind::kCorrupt) {
      if (attempt.op != IoOp::kRead || result <= 0 || !fires(i, attempt)) {
        continue;
      }
      count(FaultKind::kCorrupt);
      // A run of distinct bytes: flipping one position twice would undo the damage.
      auto* bytes = static_cast<unsigned char*>(attempt.buffer);
      const int run = std::min<int>(static_cast<int>(rule.corrupt_bytes), result);
      const int start = std::uniform_int_distribution<int>(0, result - run)(states_[i].random);
      for (int n = 0; n < run; ++n) {
        bytes[start + n] ^= 0xA5;
      }
    }
  }
  return result;
}

}  // namespace strata::io
