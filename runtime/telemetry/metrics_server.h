// A minimal HTTP/1.1 endpoint for Prometheus: GET /metrics answers the current metrics in the
// text exposition format; every other path is 404 and every other method 405. One request per
// connection (the response closes it), which is all a scraper needs and keeps the server small.
//
// Safety by default: it binds to 127.0.0.1 and refuses any address that is not loopback unless
// allow_non_loopback is set, because metrics name tensors and sizes of a user's model. Requests,
// connections and time per connection are bounded (see MetricsServerConfig), so a slow or
// hostile client cannot hold the server or make it allocate without limit.
//
// The server runs its own io_context on its own thread; the destructor stops it and joins. The
// metrics source is called on that thread, one request at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace strata::telemetry {

class MetricsRegistry;

// Explicit limits on the configuration itself.
inline constexpr uint32_t kMaxMetricsConnections = 1024;
inline constexpr uint32_t kMinMetricsRequestBytes = 256;
inline constexpr uint32_t kMaxMetricsRequestBytes = 64 * 1024;
inline constexpr std::chrono::milliseconds kMaxMetricsTimeout{60'000};

struct MetricsServerConfig {
  std::string bind_address = "127.0.0.1";  // IPv4 or IPv6 literal ("::1"); no host names
  uint16_t port = 0;                       // 0: an ephemeral port, see MetricsServer::port()
  bool allow_non_loopback = false;         // must be set to bind 0.0.0.0, a LAN address, ...
  uint32_t max_connections = 8;            // open at once; more are closed on accept
  uint32_t max_request_bytes = 8192;       // request line + headers; larger gets 431
  // Whole-connection deadline (read request + write response); then the socket is closed.
  std::chrono::milliseconds timeout{5000};
};

struct MetricsServerStats {
  uint64_t scrapes = 0;               // 200 responses to GET /metrics
  uint64_t not_found = 0;             // 404
  uint64_t bad_requests = 0;          // 400 / 405 / 431 / 500
  uint64_t rejected_connections = 0;  // over max_connections
  uint64_t timed_out = 0;             // connections closed by the deadline
  uint32_t active_connections = 0;    // open right now
};

// Produces the response body. It must not block for long: scrapes are served one at a time.
using MetricsSource = std::function<std::string()>;

class MetricsServer {
 public:
  // Binds and starts serving. STRATA_E_INVALID for a bad address, a non-loopback address
  // without allow_non_loopback, an empty source or limits outside their ranges; STRATA_E_IO
  // when the socket cannot be bound (port taken, permission); STRATA_E_LIMIT when no thread.
  static Result<std::unique_ptr<MetricsServer>> start(const MetricsServerConfig& config,
                                                      MetricsSource source);
  // Serves registry.render_prometheus(); the registry must outlive the server.
  static Result<std::unique_ptr<MetricsServer>> start(const MetricsServerConfig& config,
                                                      const MetricsRegistry& registry);
  // Defined in the .cpp (keeps Asio out of this header); named here so its helpers can use it.
  struct Impl;

  ~MetricsServer();  // stops accepting, closes open connections, joins the thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const;               // the bound port (the ephemeral one when 0 was asked)
  const std::string& address() const;  // the bound address, as configured
  MetricsServerStats stats() const;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::telemetry
