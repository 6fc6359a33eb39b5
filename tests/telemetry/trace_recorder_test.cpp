#include "telemetry/trace_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

namespace strata::telemetry {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// A fresh directory per test under STRATA_TEST_DIR (set by ctest) or the system temp dir.
class TraceRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Read once, on the main thread, before any test thread exists.
    const char* base = std::getenv("STRATA_TEST_DIR");  // NOLINT(concurrency-mt-unsafe)
    const std::string root = (base && *base) ? base : ::testing::TempDir();
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = root + "/trace_" + info->name() + "_" + std::to_string(::getpid());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    ASSERT_TRUE(std::filesystem::create_directories(dir_, ec)) << dir_ << ": " << ec.message();
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  static std::unique_ptr<TraceRecorder> make(uint64_t capacity, uint32_t shards = 8) {
    TraceConfig config;
    config.capacity_events = capacity;
    config.shards = shards;
    config.start_enabled = true;
    auto r = TraceRecorder::create(config);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? std::move(r).value() : nullptr;
  }

  json export_and_parse(const TraceRecorder& recorder) {
    const std::string path = dir_ + "/trace.json";
    const Status s = recorder.export_chrome_trace(path);
    EXPECT_TRUE(s.is_ok()) << s.message();
    std::ifstream in(path);
    // parse() rejects invalid JSON and invalid UTF-8 alike.
    return json::parse(in);
  }

  std::vector<std::string> files_in_dir() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  std::string dir_;
};

struct Row {
  std::string track;  // thread_name with any " (n)" lane suffix removed
  std::vector<json> spans;
};

// tid -> row, from the "M" metadata; every X event must land on a named row.
std::map<int64_t, Row> rows_of(const json& trace) {
  std::map<int64_t, Row> rows;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      std::string name = e["args"]["name"];
      const size_t paren = name.find(" (");
      rows[e["tid"].get<int64_t>()].track = name.substr(0, paren);
    }
  }
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") {
      continue;
    }
    auto it = rows.find(e["tid"].get<int64_t>());
    EXPECT_NE(it, rows.end()) << "span on an unnamed row: " << e.dump();
    if (it != rows.end()) {
      it->second.spans.push_back(e);
    }
  }
  return rows;
}

// Within one row, spans must nest or follow each other: a partial overlap is not a valid
// Chrome-trace row.
void expect_rows_nest(const std::map<int64_t, Row>& rows) {
  for (const auto& [tid, row] : rows) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const json& e : row.spans) {
      const int64_t ts = e["ts"], dur = e["dur"];
      spans.emplace_back(ts, ts + dur);
    }
    std::sort(spans.begin(), spans.end(), [](auto a, auto b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<int64_t> open;
    for (const auto& [b, e] : spans) {
      while (!open.empty() && open.back() <= b) {
        open.pop_back();
      }
      ASSERT_TRUE(open.empty() || e <= open.back())
          << "row " << row.track << " (tid " << tid << ") has a partial overlap at " << b;
      open.push_back(e);
    }
  }
}

TEST_F(TraceRecorderTest, SpansFromSeveralThreadsAppearOnTheirTracksInOrder) {
  auto recorder = make(1 << 14);
  ASSERT_TRUE(recorder);
  // Two threads share "nvme read" so that its spans overlap and need several rows.
  const std::vector<TrackId> track_of_thread = {kTrackNvmeRead, kTrackNvmeRead, kTrackNvmeWrite,
                                                kTrackH2DCopy,  kTrackCompute,  kTrackWait};
  constexpr int kSpansPerThread = 300;
  std::vector<std::thread> threads;
  threads.reserve(track_of_thread.size());
  for (size_t t = 0; t < track_of_thread.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kSpansPerThread; ++k) {
        const uint64_t begin = recorder->now_us();
        // Lengths of 0..2 us: a short spin (bounded by the steady clock) stands in for work.
        uint64_t end = recorder->now_us();
        while (end < begin + k % 3) {
          end = recorder->now_us();
        }
        recorder->record_span(track_of_thread[t],
                              "t" + std::to_string(t) + " #" + std::to_string(k), begin, end,
                              int64_t{4096} * k);
        if (k % 50 == 0) {
          std::this_thread::yield();
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }

  const json trace = export_and_parse(*recorder);
  const auto rows = rows_of(trace);
  expect_rows_nest(rows);

  // thread -> (k -> span)
  std::map<size_t, std::map<int, json>> by_thread;
  for (const auto& [tid, row] : rows) {
    for (const json& e : row.spans) {
      const std::string name = e["name"];
      const size_t hash = name.find(" #");
      ASSERT_NE(hash, std::string::npos) << name;
      const size_t t = std::stoul(name.substr(1, hash - 1));
      const int k = std::stoi(name.substr(hash + 2));
      ASSERT_LT(t, track_of_thread.size());
      const std::string expected = recorder->track_name(track_of_thread[t]);
      EXPECT_EQ(row.track, expected) << name;
      EXPECT_EQ(e["cat"], expected) << name;
      EXPECT_EQ(e["args"]["bytes"], int64_t{4096} * k);
      EXPECT_TRUE(by_thread[t].emplace(k, e).second) << "duplicate " << name;
    }
  }
  ASSERT_EQ(by_thread.size(), track_of_thread.size());
  for (const auto& [t, spans] : by_thread) {
    ASSERT_EQ(spans.size(), size_t{kSpansPerThread}) << "thread " << t;
    int64_t previous_end = 0;
    for (const auto& [k, e] : spans) {
      const int64_t ts = e["ts"];
      EXPECT_GE(ts, previous_end) << "thread " << t << " span " << k;  // steady clock
      previous_end = ts + e["dur"].get<int64_t>();
    }
  }
  EXPECT_EQ(recorder->stats().dropped, 0u);
}

TEST_F(TraceRecorderTest, ExportIsChromeTraceEventJson) {
  auto recorder = make(1024);
  ASSERT_TRUE(recorder);
  const uint64_t t0 = recorder->now_us();
  recorder->record_span(kTrackNvmeRead, "model.layers.0.mlp.up_proj.weight", t0, t0 + 800,
                        64 << 20);
  recorder->record_span(kTrackOptimizer, "layer 3", t0 + 100, t0 + 900);
  recorder->record_counter("pinned bytes", 1 << 30);
  recorder->record_counter("pinned bytes", 1 << 29);

  const json trace = export_and_parse(*recorder);
  ASSERT_TRUE(trace.is_object());
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_EQ(trace["otherData"]["producer"], "strata");
  EXPECT_EQ(trace["otherData"]["dropped_events"], 0);
  EXPECT_EQ(trace["otherData"]["exported_events"], 4);

  int process_names = 0, spans = 0, counters = 0;
  std::set<int64_t> named_tids;
  for (const json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
    EXPECT_EQ(e["pid"], ::getpid());
    if (e["ph"] == "M" && e["name"] == "process_name") {
      ++process_names;
      EXPECT_EQ(e["args"]["name"], "strata");
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      named_tids.insert(e["tid"].get<int64_t>());
    }
  }
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      ASSERT_TRUE(e["ts"].is_number_unsigned() && e["dur"].is_number_unsigned()) << e.dump();
      EXPECT_TRUE(named_tids.count(e["tid"].get<int64_t>())) << e.dump();
      if (e["name"] == "layer 3") {
        EXPECT_EQ(e["cat"], "optimizer");
        EXPECT_EQ(e["dur"], 800);
        EXPECT_FALSE(e.contains("args"));  // no bytes given, none shown
      } else {
        EXPECT_EQ(e["cat"], "nvme read");
        EXPECT_EQ(e["args"]["bytes"], 64 << 20);
      }
    } else if (e["ph"] == "C") {
      ++counters;
      EXPECT_EQ(e["name"], "pinned bytes");
      EXPECT_TRUE(e["args"]["value"].is_number_integer());
      EXPECT_TRUE(e["ts"].is_number());
    }
  }
  EXPECT_EQ(process_names, 1);
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(counters, 2);
  EXPECT_EQ(named_tids.size(), 2u);  // only tracks with spans get a row
}

TEST_F(TraceRecorderTest, TensorSpansCarryKindAndLayerBesideBytes) {
  auto recorder = make(64);
  ASSERT_TRUE(recorder);
  const uint64_t t0 = recorder->now_us();
  recorder->record_span(kTrackNvmeRead, "layers.3.mlp.up_proj.weight", t0, t0 + 5, 4096,
                        SpanTensor{/*kind=*/0, /*layer=*/3});
  recorder->record_span(kTrackH2DCopy, "layers.3.mlp.up_proj.weight/m", t0, t0 + 5, kNoBytes,
                        SpanTensor{/*kind=*/3, /*layer=*/70000});  // layer clamped to int16
  const json trace = export_and_parse(*recorder);
  std::map<std::string, json> args;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") args[e["name"].get<std::string>()] = e["args"];
  }
  EXPECT_EQ(args["layers.3.mlp.up_proj.weight"],
            json::parse(R"({"bytes":4096,"kind":"parameter","layer":3})"));
  EXPECT_EQ(args["layers.3.mlp.up_proj.weight/m"],
            json::parse(R"({"kind":"adam_m","layer":32767})"));
}

TEST_F(TraceRecorderTest, EventCapDropsAndCountsInsteadOfGrowing) {
  constexpr uint64_t kCapacity = 64;
  auto recorder = make(kCapacity, 4);
  ASSERT_TRUE(recorder);
  constexpr int kThreads = 4, kPerThread = 1000;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t now = recorder->now_us();
        if (i % 2) {
          recorder->record_span(kTrackWait, "w", now, now + 1);
        } else {
          recorder->record_counter("c", i);
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }

  const TraceStats stats = recorder->stats();
  EXPECT_EQ(stats.capacity, kCapacity);
  EXPECT_EQ(stats.recorded, kCapacity);  // every slot used, even though one shard per thread
  EXPECT_EQ(stats.dropped, uint64_t{kThreads} * kPerThread - kCapacity);

  const json trace = export_and_parse(*recorder);
  size_t events = 0;
  for (const json& e : trace["traceEvents"]) {
    events += e["ph"] != "M";
  }
  EXPECT_EQ(events, kCapacity);
  EXPECT_EQ(trace["otherData"]["dropped_events"], stats.dropped);
}

TEST_F(TraceRecorderTest, DisabledRecorderRecordsNothing) {
  auto recorder = make(128);
  ASSERT_TRUE(recorder);
  recorder->set_enabled(false);
  recorder->record_span(kTrackCompute, "ignored", 0, 1);
  recorder->record_counter("ignored", 1);
  { ScopedSpan span(recorder.get(), kTrackCompute, "ignored"); }
  EXPECT_EQ(recorder->stats().recorded, 0u);
  EXPECT_EQ(recorder->stats().dropped, 0u);

  recorder->set_enabled(true);
  recorder->record_span(kTrackCompute, "kept", 0, 1);
  EXPECT_EQ(recorder->stats().recorded, 1u);

  // A null recorder is how callers run without tracing at all.
  { ScopedSpan span(nullptr, kTrackCompute, "nobody records this"); }
}

TEST_F(TraceRecorderTest, ScopedSpanCoversItsLifetime) {
  auto recorder = make(16);
  ASSERT_TRUE(recorder);
  {
    ScopedSpan span(recorder.get(), kTrackH2DCopy, std::string("layer ") + std::to_string(3));
    span.set_bytes(12345);
    std::this_thread::sleep_for(3ms);
  }
  const json trace = export_and_parse(*recorder);
  const auto rows = rows_of(trace);
  ASSERT_EQ(rows.size(), 1u);
  const Row& row = rows.begin()->second;
  EXPECT_EQ(row.track, "h2d copy");
  ASSERT_EQ(row.spans.size(), 1u);
  EXPECT_EQ(row.spans[0]["name"], "layer 3");  // copied: the temporary string is long gone
  EXPECT_GE(row.spans[0]["dur"].get<int64_t>(), 3000);
  EXPECT_EQ(row.spans[0]["args"]["bytes"], 12345);
}

TEST_F(TraceRecorderTest, OverlappingSpansOnOneTrackAreSpreadOverNestingRows) {
  auto recorder = make(16);
  ASSERT_TRUE(recorder);
  recorder->record_span(kTrackNvmeRead, "outer", 100, 200);
  recorder->record_span(kTrackNvmeRead, "inner", 110, 150);      // nests: same row
  recorder->record_span(kTrackNvmeRead, "overlap", 120, 300);    // partial: second row
  recorder->record_span(kTrackNvmeRead, "after", 200, 250);      // first row is free again
  recorder->record_span(kTrackNvmeRead, "backwards", 500, 400);  // clamped to zero length

  const json trace = export_and_parse(*recorder);
  const auto rows = rows_of(trace);
  expect_rows_nest(rows);
  ASSERT_EQ(rows.size(), 2u);
  std::map<std::string, int64_t> tid_of;
  std::set<std::string> row_names;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      tid_of[e["name"]] = e["tid"];
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      row_names.insert(e["args"]["name"]);
    }
    if (e["name"] == "backwards") {
      EXPECT_EQ(e["dur"], 0);
    }
  }
  EXPECT_EQ(tid_of["outer"], tid_of["inner"]);
  EXPECT_EQ(tid_of["outer"], tid_of["after"]);
  EXPECT_NE(tid_of["outer"], tid_of["overlap"]);
  EXPECT_EQ(row_names, (std::set<std::string>{"nvme read", "nvme read (2)"}));
}

TEST_F(TraceRecorderTest, NamesAreEscapedTruncatedAndKeptValidUtf8) {
  auto recorder = make(16);
  ASSERT_TRUE(recorder);
  std::string accented;
  for (int i = 0; i < 100; ++i) {
    accented += "\xC3\xA9";  // "é" x 100: 200 bytes
  }
  recorder->record_span(kTrackCompute, "quote\" back\\slash\nnewline\ttab", 0, 1);
  recorder->record_span(kTrackCompute, "bad \xFF\xC3 utf8 \x01", 1, 2);
  recorder->record_span(kTrackCompute, accented, 2, 3);

  const json trace = export_and_parse(*recorder);  // parsing also checks the UTF-8
  std::set<std::string> names;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      names.insert(e["name"].get<std::string>());
    }
  }
  EXPECT_TRUE(names.count("quote\" back\\slash\nnewline\ttab"));
  EXPECT_TRUE(names.count("bad \xEF\xBF\xBD\xEF\xBF\xBD utf8 \x01"));
  const std::string truncated = accented.substr(0, 62);  // 31 whole characters <= 63 bytes
  EXPECT_TRUE(names.count(truncated));
}

TEST_F(TraceRecorderTest, ExportReplacesFilesAtomicallyAndFailsCleanly) {
  auto recorder = make(16);
  ASSERT_TRUE(recorder);
  recorder->record_span(kTrackWait, "first", 0, 1);
  const std::string path = dir_ + "/trace.json";
  ASSERT_TRUE(recorder->export_chrome_trace(path).is_ok());
  recorder->record_span(kTrackWait, "second", 1, 2);
  ASSERT_TRUE(recorder->export_chrome_trace(path).is_ok());
  EXPECT_EQ(files_in_dir(), std::vector<std::string>{"trace.json"});  // no temporaries left
  std::ifstream in(path);
  EXPECT_EQ(json::parse(in)["otherData"]["exported_events"], 2);

  const Status missing = recorder->export_chrome_trace(dir_ + "/no/such/dir/trace.json");
  EXPECT_EQ(missing.code(), STRATA_E_IO);
  EXPECT_NE(missing.message().find("No such file"), std::string::npos) << missing.message();
  EXPECT_EQ(recorder->export_chrome_trace("").code(), STRATA_E_INVALID);
}

TEST_F(TraceRecorderTest, ExportWhileOtherThreadsRecord) {
  auto recorder = make(1 << 15);
  ASSERT_TRUE(recorder);
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  writers.reserve(2);
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&] {
      // Bounded: stops at the flag or when the recorder is full, whichever comes first.
      for (int i = 0; i < 20'000 && !stop.load(); ++i) {
        const uint64_t now = recorder->now_us();
        recorder->record_span(kTrackNvmeWrite, "chunk", now, now + 5, 1 << 20);
        recorder->record_counter("queue depth", i % 32);
      }
    });
  }
  for (int round = 0; round < 3; ++round) {
    const json trace = export_and_parse(*recorder);
    EXPECT_TRUE(trace["traceEvents"].is_array());
    expect_rows_nest(rows_of(trace));
  }
  stop = true;
  for (auto& w : writers) {
    w.join();
  }
}

TEST_F(TraceRecorderTest, TracksAreRegisteredOnceWithinTheirLimit) {
  auto recorder = make(16);
  ASSERT_TRUE(recorder);
  EXPECT_EQ(recorder->track_name(kTrackNvmeRead), "nvme read");
  EXPECT_EQ(recorder->track_name(kTrackWait), "wait");
  auto prefetch = recorder->register_track("prefetch");
  ASSERT_TRUE(prefetch.is_ok());
  EXPECT_EQ(prefetch->index, kStandardTrackCount);
  EXPECT_EQ(recorder->register_track("prefetch")->index, prefetch->index);
  EXPECT_EQ(recorder->register_track("nvme read")->index, kTrackNvmeRead.index);
  EXPECT_EQ(recorder->register_track("").status().code(), STRATA_E_INVALID);
  for (uint32_t i = kStandardTrackCount + 1; i < kMaxTracks; ++i) {
    ASSERT_TRUE(recorder->register_track("custom " + std::to_string(i)).is_ok());
  }
  EXPECT_EQ(recorder->register_track("one too many").status().code(), STRATA_E_LIMIT);

  // A span on an unknown track is counted as dropped, not written.
  recorder->record_span(TrackId{kMaxTracks + 5}, "lost", 0, 1);
  EXPECT_EQ(recorder->stats().recorded, 0u);
  EXPECT_EQ(recorder->stats().dropped, 1u);
}

TEST(TraceRecorderCreate, RejectsCapacitiesAndShardCountsOutsideTheLimits) {
  TraceConfig config;
  config.capacity_events = 0;
  EXPECT_EQ(TraceRecorder::create(config).status().code(), STRATA_E_INVALID);
  config.capacity_events = kMaxTraceEvents + 1;
  EXPECT_EQ(TraceRecorder::create(config).status().code(), STRATA_E_INVALID);
  config.capacity_events = 16;
  config.shards = 0;
  EXPECT_EQ(TraceRecorder::create(config).status().code(), STRATA_E_INVALID);
  config.shards = 32;  // more shards than slots is fine: clamped
  auto r = TraceRecorder::create(config);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE((*r)->enabled());  // off unless asked
}

}  // namespace
}  // namespace strata::telemetry
