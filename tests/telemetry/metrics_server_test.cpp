#include "telemetry/metrics_server.h"

#include <gtest/gtest.h>

#include <thread>

#include "telemetry/counters.h"
#include "telemetry/loopback_http.h"

namespace strata::telemetry {
namespace {

using testing::http_get;
using testing::http_request;
using namespace std::chrono_literals;

// Polls cond every millisecond for up to 5 s; the servers here answer in well under that.
template <typename Cond>
bool eventually(Cond cond) {
  for (int i = 0; i < 5000; ++i) {
    if (cond()) {
      return true;
    }
    std::this_thread::sleep_for(1ms);
  }
  return cond();
}

struct Fixture {
  MetricsRegistry registry;
  Counter* scrape_driven = nullptr;
  std::unique_ptr<MetricsServer> server;

  explicit Fixture(const MetricsServerConfig& config = {}) {
    scrape_driven = *registry.add_counter({"strata_test_events_total", "Test events.", ""});
    auto started = MetricsServer::start(config, registry);
    EXPECT_TRUE(started.is_ok()) << started.status().message();
    if (started.is_ok()) {
      server = std::move(started).value();
    }
  }
};

TEST(MetricsServer, AnswersScrapesOnLoopbackWithCurrentValues) {
  Fixture f;
  ASSERT_TRUE(f.server);
  EXPECT_NE(f.server->port(), 0);  // port 0 asked an ephemeral port; the real one is reported
  EXPECT_EQ(f.server->address(), "127.0.0.1");

  f.scrape_driven->add(1);
  const auto first = http_get(f.server->port(), "/metrics");
  ASSERT_EQ(first.status, 200) << first.head;
  EXPECT_NE(first.head.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(first.body.find("# TYPE strata_test_events_total counter"), std::string::npos);
  EXPECT_EQ(testing::parse_prometheus(first.body).at("strata_test_events_total"), 1);

  f.scrape_driven->add(41);
  const auto second = http_get(f.server->port(), "/metrics?name[]=x");
  ASSERT_EQ(second.status, 200);
  EXPECT_EQ(testing::parse_prometheus(second.body).at("strata_test_events_total"), 42);
  EXPECT_EQ(f.server->stats().scrapes, 2u);
}

TEST(MetricsServer, ServesNothingButMetrics) {
  Fixture f;
  ASSERT_TRUE(f.server);
  const uint16_t port = f.server->port();
  EXPECT_EQ(http_get(port, "/").status, 404);
  EXPECT_EQ(http_get(port, "/metricsx").status, 404);
  EXPECT_EQ(http_get(port, "/../etc/passwd").status, 404);
  EXPECT_EQ(http_request(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").status, 405);
  EXPECT_EQ(http_request(port, "garbage\r\n\r\n").status, 400);
  const auto stats = f.server->stats();
  EXPECT_EQ(stats.not_found, 3u);
  EXPECT_EQ(stats.bad_requests, 2u);
  EXPECT_EQ(stats.scrapes, 0u);
}

// HTTP's own rules for every general-purpose server (RFC 9110 9.1, RFC 9112 3.2.2): HEAD answers
// with GET's header fields and no body, and a request in absolute form ("GET http://host/metrics",
// as a proxy sends it) asks for its path. Until 2026-12-05 they were 405 and 404.
TEST(MetricsServer, AnswersHeadAndTheAbsoluteFormAsHttpRequires) {
  Fixture f;
  ASSERT_TRUE(f.server);
  const uint16_t port = f.server->port();
  const auto get = http_get(port, "/metrics");
  ASSERT_EQ(get.status, 200);
  const auto head = http_request(port, "HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty()) << head.body;
  EXPECT_NE(head.head.find("Content-Length: " + std::to_string(get.body.size())), std::string::npos)
      << head.head;
  EXPECT_NE(head.head.find("text/plain; version=0.0.4"), std::string::npos) << head.head;
  EXPECT_EQ(http_request(port, "HEAD /nowhere HTTP/1.1\r\n\r\n").status, 404);
  const std::string host = "127.0.0.1:" + std::to_string(port);
  const auto absolute = http_request(
      port, "GET http://" + host + "/metrics?x=1 HTTP/1.1\r\nHost: " + host + "\r\n\r\n");
  EXPECT_EQ(absolute.status, 200);
  EXPECT_EQ(testing::parse_prometheus(absolute.body), testing::parse_prometheus(get.body));
  EXPECT_EQ(http_request(port, "GET http://" + host + " HTTP/1.1\r\n\r\n").status, 404);
  const auto post = http_request(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.head.find("Allow: GET, HEAD"), std::string::npos) << post.head;
  EXPECT_EQ(f.server->stats().scrapes, 2u);  // the two GETs; HEAD is not a scrape
}

TEST(MetricsServer, RefusesNonLoopbackAddressesUnlessAsked) {
  MetricsRegistry registry;
  for (const char* address : {"0.0.0.0", "::", "192.0.2.1", "localhost", ""}) {
    MetricsServerConfig config;
    config.bind_address = address;
    auto started = MetricsServer::start(config, registry);
    EXPECT_EQ(started.status().code(), STRATA_E_INVALID) << address;
  }
  MetricsServerConfig loopback;
  loopback.bind_address = "127.0.0.2";  // all of 127/8 is loopback
  EXPECT_TRUE(MetricsServer::start(loopback, registry).is_ok());
}

TEST(MetricsServer, RejectsLimitsOutsideTheirRanges) {
  MetricsRegistry registry;
  MetricsServerConfig config;
  config.max_connections = 0;
  EXPECT_EQ(MetricsServer::start(config, registry).status().code(), STRATA_E_INVALID);
  config = {};
  config.max_request_bytes = kMaxMetricsRequestBytes + 1;
  EXPECT_EQ(MetricsServer::start(config, registry).status().code(), STRATA_E_INVALID);
  config = {};
  config.timeout = 0ms;
  EXPECT_EQ(MetricsServer::start(config, registry).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(MetricsServer::start({}, MetricsSource()).status().code(), STRATA_E_INVALID);
}

TEST(MetricsServer, ReportsAPortInUseAsAnIoError) {
  Fixture first;
  ASSERT_TRUE(first.server);
  MetricsServerConfig config;
  config.port = first.server->port();
  auto second = MetricsServer::start(config, first.registry);
  EXPECT_EQ(second.status().code(), STRATA_E_IO);
  EXPECT_NE(second.status().message().find(std::to_string(config.port)), std::string::npos);
}

TEST(MetricsServer, AnswersOversizedRequestsWith431) {
  MetricsServerConfig config;
  config.max_request_bytes = 1024;
  Fixture f(config);
  ASSERT_TRUE(f.server);
  const std::string huge =
      "GET /metrics HTTP/1.1\r\nX-Filler: " + std::string(4096, 'a') + "\r\n\r\n";
  EXPECT_EQ(http_request(f.server->port(), huge).status, 431);
  EXPECT_EQ(http_get(f.server->port(), "/metrics").status, 200);  // and keeps serving
}

TEST(MetricsServer, DisconnectsAStuckClientAfterTheTimeout) {
  MetricsServerConfig config;
  config.timeout = 200ms;
  Fixture f(config);
  ASSERT_TRUE(f.server);

  UniqueFd stuck = testing::connect_loopback(f.server->port());
  ASSERT_TRUE(stuck.valid());
  ASSERT_TRUE(testing::send_all(stuck.get(), "GET /metr"));  // never finishes its request
  // Others are served meanwhile.
  EXPECT_EQ(http_get(f.server->port(), "/metrics").status, 200);

  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  const std::string got = testing::read_until_close(stuck.get(), &closed);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(got.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);  // well before the client's 5 s
  EXPECT_TRUE(eventually([&] { return f.server->stats().timed_out == 1; }));
}

TEST(MetricsServer, ClosesConnectionsBeyondItsLimit) {
  MetricsServerConfig config;
  config.max_connections = 1;
  Fixture f(config);
  ASSERT_TRUE(f.server);

  UniqueFd holder = testing::connect_loopback(f.server->port());
  ASSERT_TRUE(holder.valid());
  ASSERT_TRUE(eventually([&] { return f.server->stats().active_connections == 1; }));

  UniqueFd extra = testing::connect_loopback(f.server->port());
  ASSERT_TRUE(extra.valid());  // the kernel accepts; the server closes it at once
  testing::send_all(extra.get(), "GET /metrics HTTP/1.1\r\n\r\n");
  bool closed = false;
  EXPECT_TRUE(testing::read_until_close(extra.get(), &closed).empty());
  EXPECT_TRUE(closed);
  EXPECT_EQ(f.server->stats().rejected_connections, 1u);

  // The held connection is still served.
  ASSERT_TRUE(testing::send_all(holder.get(), "GET /metrics HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(testing::parse_response(testing::read_until_close(holder.get())).status, 200);
  EXPECT_TRUE(eventually([&] { return f.server->stats().active_connections == 0; }));
}

TEST(MetricsServer, DestructorStopsPromptlyWithOpenConnections) {
  MetricsServerConfig config;
  config.timeout = 10'000ms;  // far longer than the test waits: the destructor must not wait it
  auto f = std::make_unique<Fixture>(config);
  ASSERT_TRUE(f->server);
  const uint16_t port = f->server->port();
  UniqueFd idle = testing::connect_loopback(port);
  ASSERT_TRUE(idle.valid());
  ASSERT_TRUE(eventually([&] { return f->server->stats().active_connections == 1; }));

  const auto start = std::chrono::steady_clock::now();
  f.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  bool closed = false;
  testing::read_until_close(idle.get(), &closed);
  EXPECT_TRUE(closed);
  EXPECT_FALSE(testing::connect_loopback(port).valid());  // nobody listens any more
}

TEST(MetricsServer, ASourceThatThrowsGives500AndTheServerLives) {
  int calls = 0;
  auto started = MetricsServer::start({}, [&]() -> std::string {
    if (++calls == 1) {
      throw std::runtime_error("registry unavailable");
    }
    return "strata_ok 1\n";
  });
  ASSERT_TRUE(started.is_ok());
  auto server = std::move(started).value();
  EXPECT_EQ(http_get(server->port(), "/metrics").status, 500);
  const auto second = http_get(server->port(), "/metrics");
  EXPECT_EQ(second.status, 200);
  EXPECT_EQ(second.body, "strata_ok 1\n");
}

}  // namespace
}  // namespace strata::telemetry
