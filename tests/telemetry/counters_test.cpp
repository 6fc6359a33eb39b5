#include "telemetry/counters.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "telemetry/loopback_http.h"

namespace strata::telemetry {
namespace {

TEST(MetricsRegistry, RendersPrometheusTextWithHelpTypeAndUnit) {
  MetricsRegistry registry;
  auto reads =
      registry.add_counter({"strata_nvme_read_bytes_total", "Bytes read from NVMe.", "bytes"});
  ASSERT_TRUE(reads.is_ok()) << reads.status().message();
  auto pinned = registry.add_gauge({"strata_pinned_bytes", "Pinned host bytes in use.", "bytes"});
  ASSERT_TRUE(pinned.is_ok()) << pinned.status().message();
  (*reads)->add(4096);
  (*pinned)->add(1000);
  (*pinned)->sub(400);

  EXPECT_EQ(registry.render_prometheus(),
            "# HELP strata_nvme_read_bytes_total Bytes read from NVMe. (unit: bytes)\n"
            "# TYPE strata_nvme_read_bytes_total counter\n"
            "strata_nvme_read_bytes_total 4096\n"
            "# HELP strata_pinned_bytes Pinned host bytes in use. (unit: bytes)\n"
            "# TYPE strata_pinned_bytes gauge\n"
            "strata_pinned_bytes 600\n"
            "# HELP strata_pinned_bytes_peak Pinned host bytes in use. Highest value seen. "
            "(unit: bytes)\n"
            "# TYPE strata_pinned_bytes_peak gauge\n"
            "strata_pinned_bytes_peak 1000\n");
}

TEST(MetricsRegistry, APeaksHelpIsTheGaugesAsASentenceThenWhatThePeakAdds) {
  MetricsRegistry registry;
  ASSERT_TRUE(
      registry.add_gauge({"strata_host_bytes", "Host bytes (emulated device excluded)", "bytes"})
          .is_ok());
  const std::string text = registry.render_prometheus();
  EXPECT_NE(text.find("# HELP strata_host_bytes_peak Host bytes (emulated device excluded). "
                      "Highest value seen. (unit: bytes)\n"),
            std::string::npos)
      << text;
}

TEST(MetricsRegistry, LabelledSeriesFormOneFamilyWithOneHelpAndType) {
  MetricsRegistry registry;
  const MetricInfo reads{"strata_nvme_bytes_total",
                         "Bytes moved to and from NVMe.",
                         "bytes",
                         1.0,
                         {{"strategy", "strata"}, {"direction", "read"}}};
  MetricInfo writes = reads;
  writes.labels = {{"strategy", "strata"}, {"direction", "write"}};
  Counter* r = *registry.add_counter(reads);
  ASSERT_TRUE(registry
                  .add_gauge({"strata_running",
                              "1 while running.",
                              "",
                              1.0,
                              {{"strategy", "a\"b\\c"}},
                              /*with_peak=*/false})
                  .is_ok());
  Counter* w = *registry.add_counter(writes);  // registered after another family
  r->add(10);
  w->add(20);
  EXPECT_EQ(registry.render_prometheus(),
            "# HELP strata_nvme_bytes_total Bytes moved to and from NVMe. (unit: bytes)\n"
            "# TYPE strata_nvme_bytes_total counter\n"
            "strata_nvme_bytes_total{strategy=\"strata\",direction=\"read\"} 10\n"
            "strata_nvme_bytes_total{strategy=\"strata\",direction=\"write\"} 20\n"
            "# HELP strata_running 1 while running.\n"
            "# TYPE strata_running gauge\n"
            "strata_running{strategy=\"a\\\"b\\\\c\"} 0\n");
  // The same labels twice, another type or help under one name, bad label names: refused.
  EXPECT_EQ(registry.add_counter(reads).status().code(), STRATA_E_INVALID);
  MetricInfo other_help = reads;
  other_help.help = "Something else.";
  other_help.labels = {{"strategy", "zero"}};
  EXPECT_EQ(registry.add_counter(other_help).status().code(), STRATA_E_INVALID);
  for (const char* label : {"__reserved", "Tier", "0tier", ""}) {
    MetricInfo bad = reads;
    bad.labels = {{label, "x"}};
    EXPECT_EQ(registry.add_counter(bad).status().code(), STRATA_E_INVALID) << label;
  }
  MetricInfo twice = reads;
  twice.labels = {{"tier", "a"}, {"tier", "b"}};
  EXPECT_EQ(registry.add_counter(twice).status().code(), STRATA_E_INVALID);
}

TEST(MetricsRegistry, GaugeRemembersItsPeakUntilReset) {
  MetricsRegistry registry;
  Gauge* g = *registry.add_gauge({"strata_inflight_requests", "Requests in flight.", ""});
  g->add(5);
  g->add(3);
  g->sub(6);
  EXPECT_EQ(g->value(), 2);
  EXPECT_EQ(g->peak(), 8);
  g->set(7);
  EXPECT_EQ(g->peak(), 8);
  g->reset_peak();
  EXPECT_EQ(g->peak(), 7);
  g->set(1);
  EXPECT_EQ(g->peak(), 7);
  const auto values = testing::parse_prometheus(registry.render_prometheus());
  EXPECT_EQ(values.at("strata_inflight_requests"), 1);
  EXPECT_EQ(values.at("strata_inflight_requests_peak"), 7);
}

TEST(MetricsRegistry, RejectsNamesThatBreakPrometheusConventions) {
  MetricsRegistry registry;
  const auto counter_code = [&](const MetricInfo& info) {
    return registry.add_counter(info).status().code();
  };
  EXPECT_EQ(counter_code({"nvme_reads_total", "no prefix", ""}), STRATA_E_INVALID);
  EXPECT_EQ(counter_code({"strata_Reads_total", "upper case", ""}), STRATA_E_INVALID);
  EXPECT_EQ(counter_code({"strata_reads", "counter without _total", ""}), STRATA_E_INVALID);
  EXPECT_EQ(counter_code({"strata_reads_total", "unit missing from the name", "bytes"}),
            STRATA_E_INVALID);
  EXPECT_EQ(counter_code({"strata_reads_total", "", ""}), STRATA_E_INVALID);  // no help
  EXPECT_EQ(counter_code({"strata_reads_total", "bad scale", "", 0.0}), STRATA_E_INVALID);
  EXPECT_EQ(registry.add_gauge({"strata_pinned", "unit missing", "bytes"}).status().code(),
            STRATA_E_INVALID);
  EXPECT_EQ(
      registry.add_gauge({"strata_x_total", "gauge named like a counter", ""}).status().code(),
      STRATA_E_INVALID);
  EXPECT_EQ(registry.size(), 0u);

  ASSERT_TRUE(registry.add_counter({"strata_reads_total", "Reads.", ""}).is_ok());
  EXPECT_EQ(counter_code({"strata_reads_total", "duplicate", ""}), STRATA_E_INVALID);
  ASSERT_TRUE(registry.add_gauge({"strata_queue_depth", "Depth.", ""}).is_ok());
  EXPECT_EQ(registry.size(), 2u);
}

TEST(MetricsRegistry, ConcurrentUpdatesAreExact) {
  MetricsRegistry registry;
  Counter* c = *registry.add_counter({"strata_ops_total", "Operations.", ""});
  Gauge* g = *registry.add_gauge({"strata_level_bytes", "Level.", "bytes"});
  constexpr int kThreads = 4;
  constexpr int kIterations = 50'000;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIterations; ++i) {
        c->add();
        g->add(2);
        g->sub(2);
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(c->value(), uint64_t{kThreads} * kIterations);
  EXPECT_EQ(g->value(), 0);
  EXPECT_GE(g->peak(), 2);
  EXPECT_LE(g->peak(), 2 * kThreads);
}

TEST(MetricsRegistry, RenderScaleReportsSecondsFromMicroseconds) {
  MetricsRegistry registry;
  Counter* wait = *registry.add_counter(
      {"strata_wait_seconds_total", "Time spent waiting for tensors.", "seconds", 1e-6});
  wait->add(1'500'000);
  const auto values = testing::parse_prometheus(registry.render_prometheus());
  EXPECT_DOUBLE_EQ(values.at("strata_wait_seconds_total"), 1.5);
  const auto samples = registry.snapshot();
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_DOUBLE_EQ(samples[0].value, 1.5);
}

TEST(MetricsRegistry, StopsAtItsMetricLimit) {
  MetricsRegistry registry;
  for (size_t i = 0; i < kMaxMetrics; ++i) {
    ASSERT_TRUE(registry.add_counter({"strata_m" + std::to_string(i) + "_total", "m", ""}).is_ok());
  }
  EXPECT_EQ(registry.add_counter({"strata_one_more_total", "m", ""}).status().code(),
            STRATA_E_LIMIT);
}

}  // namespace
}  // namespace strata::telemetry
