#include "memory/pinned_trace.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_set>

namespace strata::memory {
namespace {

bool parse_kind(const std::string& name, TensorKind* kind) {
  for (int k = 0; k < kTensorKindCount; ++k) {
    if (name == to_string(static_cast<TensorKind>(k))) {
      *kind = static_cast<TensorKind>(k);
      return true;
    }
  }
  return false;
}

}  // namespace

std::unique_ptr<PinnedTraceWriter> PinnedTraceWriter::from_environment(uint64_t budget_bytes) {
  const char* path = std::getenv(kPinnedTraceVariable);  // NOLINT(concurrency-mt-unsafe)
  if (path == nullptr || *path == '\0') return nullptr;
  Result<std::unique_ptr<PinnedTraceWriter>> writer = open(path, budget_bytes);
  if (!writer.is_ok()) {
    std::fprintf(stderr, "strata: %s: %s; pinned requests are not recorded\n", kPinnedTraceVariable,
                 writer.status().message().c_str());
    return nullptr;
  }
  return std::move(writer).value();
}

Result<std::unique_ptr<PinnedTraceWriter>> PinnedTraceWriter::open(const std::string& path,
                                                                   uint64_t budget_bytes) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return io_error("cannot write the pinned trace " + path + ": " + errno_text(errno));
  }
  std::fprintf(file, "# strata pinned trace v1\nbudget %llu\n",
               static_cast<unsigned long long>(budget_bytes));
  return std::unique_ptr<PinnedTraceWriter>(new PinnedTraceWriter(file));
}

PinnedTraceWriter::~PinnedTraceWriter() {
  std::fclose(file_);
}

void PinnedTraceWriter::record(const PinnedTraceEvent& e) {
  std::lock_guard lock(mutex_);
  if (e.op == PinnedTraceEvent::Op::kTake) {
    std::fprintf(file_, "take %llu %llu %llu %s %d %llu\n", static_cast<unsigned long long>(e.id),
                 static_cast<unsigned long long>(e.bytes),
                 static_cast<unsigned long long>(e.reserved), to_string(e.kind), e.reused ? 1 : 0,
                 static_cast<unsigned long long>(e.ns));
  } else {
    std::fprintf(file_, "give %llu %llu %s\n", static_cast<unsigned long long>(e.id),
                 static_cast<unsigned long long>(e.reserved), to_string(e.kind));
  }
}

Result<PinnedTrace> read_pinned_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return io_error("cannot read the pinned trace " + path + ": " + errno_text(errno));
  PinnedTrace trace;
  std::unordered_set<uint64_t> live;
  std::string line;
  for (uint64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string op;
    std::string kind;
    PinnedTraceEvent e;
    fields >> op;
    bool ok = false;
    if (op == "budget") {
      ok = static_cast<bool>(fields >> trace.budget_bytes);
    } else if (op == "take") {
      int reused = 0;
      ok = (fields >> e.id >> e.bytes >> e.reserved >> kind >> reused >> e.ns) &&
           parse_kind(kind, &e.kind) && e.bytes > 0 && e.reserved >= e.bytes &&
           live.insert(e.id).second;
      e.reused = reused != 0;
    } else if (op == "give") {
      e.op = PinnedTraceEvent::Op::kGive;
      ok = (fields >> e.id >> e.reserved >> kind) && parse_kind(kind, &e.kind) &&
           live.erase(e.id) == 1;
    }
    std::string rest;
    if (!ok || (fields >> rest)) {
      std::string where = path;
      where += ':';
      where += std::to_string(number);
      where += ": not a pinned trace event (or a give of a buffer not taken): ";
      where += line;
      return invalid_argument(std::move(where));
    }
    if (op != "budget") trace.events.push_back(e);
  }
  return trace;
}

}  // namespace strata::memory
