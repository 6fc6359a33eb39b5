#include "telemetry/metrics_server.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cstdio>
#include <exception>
#include <string_view>
#include <thread>

#include "common/assert.h"
#include "telemetry/counters.h"

namespace strata::telemetry {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr int kListenBacklog = 64;
// After an accept error (EMFILE, ENOBUFS) the acceptor waits this long before trying again, so a
// descriptor shortage does not turn into a busy loop.
constexpr std::chrono::milliseconds kAcceptRetryDelay{100};
// Input discarded after a response before the connection is closed anyway (see linger()).
constexpr size_t kMaxDrainBytes = size_t{64} * 1024;

struct Response {
  int status;
  const char* reason;
  std::string body;
  const char* content_type = "text/plain; charset=utf-8";
  const char* extra_headers = "";
  bool head = false;  // a HEAD request: GET's header fields, Content-Length included, no body
};

std::string serialize(const Response& r) {
  std::string out;
  out.reserve(r.body.size() + 256);
  out += "HTTP/1.1 " + std::to_string(r.status) + " " + r.reason + "\r\n";
  out += "Content-Type: ";
  out += r.content_type;
  out += "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += "Cache-Control: no-store\r\nConnection: close\r\n";
  out += r.extra_headers;
  out += "\r\n";
  if (!r.head) out += r.body;
  return out;
}

}  // namespace

struct MetricsServer::Impl {
  // Declared before io so that they are still alive while io's destructor destroys the pending
  // handlers (and with them the sessions, which update these counters).
  std::atomic<uint64_t> scrapes{0}, not_found{0}, bad_requests{0}, rejected{0}, timed_out{0};
  std::atomic<uint32_t> active_connections{0};  // changed on the server thread only

  MetricsServerConfig config;
  MetricsSource source;
  uint16_t bound_port = 0;

  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::thread thread;

  void do_accept();
  Response handle(std::string_view request_head);
};

namespace {

// One connection: read the request head, answer, close. Owned by the handlers in flight
// (shared_from_this), so it lives exactly as long as there is work for it.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(MetricsServer::Impl* server, tcp::socket socket)
      : server_(server),
        socket_(std::move(socket)),
        deadline_(socket_.get_executor()),
        request_(server->config.max_request_bytes) {
    ++server_->active_connections;
  }
  ~Session() { --server_->active_connections; }

  void start() {
    deadline_.expires_after(server_->config.timeout);
    deadline_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (ec) {
        return;  // cancelled: the exchange finished in time
      }
      ++self->server_->timed_out;
      error_code ignored;
      self->socket_.close(ignored);  // aborts the read or write in flight
    });
    asio::async_read_until(
        socket_, request_, "\r\n\r\n",
        [self = shared_from_this()](const error_code& ec, size_t n) { self->on_read(ec, n); });
  }

 private:
  void on_read(const error_code& ec, size_t head_bytes) {
    if (ec == asio::error::not_found) {
      // The streambuf reached max_request_bytes without the end of the headers.
      ++server_->bad_requests;
      respond(Response{431, "Request Header Fields Too Large", "request too large\n"});
      return;
    }
    if (ec) {
      close();  // peer went away, or the deadline closed the socket
      return;
    }
    const auto* data = static_cast<const char*>(request_.data().data());
    respond(server_->handle(std::string_view(data, head_bytes)));
  }

  void respond(const Response& response) {
    response_ = serialize(response);
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](const error_code& ec, size_t) {
                        if (ec) {
                          self->close();
                          return;
                        }
                        self->linger();
                      });
  }

  // Closing a socket that still has unread input (a 431 cut short, a pipelined request) makes
  // the kernel send RST, and the client may lose the response it has not read yet. So: send FIN,
  // then discard input until the client closes, kMaxDrainBytes or the deadline.
  void linger() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    socket_.async_read_some(asio::buffer(scratch_),
                            [self = shared_from_this()](const error_code& ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > kMaxDrainBytes) {
                                self->close();
                                return;
                              }
                              self->linger();
                            });
  }

  void close() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    deadline_.cancel();
  }

  MetricsServer::Impl* server_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  asio::streambuf request_;
  std::string response_;
  std::array<char, 1024> scratch_;
  size_t drained_ = 0;
};

}  // namespace

Response MetricsServer::Impl::handle(std::string_view head) {
  // Request line: METHOD SP TARGET SP HTTP/1.x
  const size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
      !line.substr(sp2 + 1).starts_with("HTTP/1.")) {
    ++bad_requests;
    return Response{400, "Bad Request", "bad request\n"};
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  // The absolute form a proxy sends ("http://host:port/metrics"), which HTTP/1.1 servers must
  // accept (RFC 9112, section 3.2.2): its path is what is asked for.
  for (const std::string_view scheme : {"http://", "https://"}) {
    if (target.starts_with(scheme)) {
      const size_t path = target.find('/', scheme.size());
      target = path == std::string_view::npos ? std::string_view("/") : target.substr(path);
    }
  }
  target = target.substr(0, target.find('?'));  // Prometheus may add query parameters
  // Every general-purpose server supports GET and HEAD (RFC 9110, section 9.1): HEAD answers
  // with GET's header fields and no body, and is not a scrape.
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    ++bad_requests;
    return Response{405, "Method Not Allowed", "only GET and HEAD are served\n",
                    "text/plain; charset=utf-8", "Allow: GET, HEAD\r\n"};
  }
  if (target != "/metrics") {
    ++not_found;
    Response r{404, "Not Found", "not found; metrics are at /metrics\n"};
    r.head = head_only;
    return r;
  }
  try {
    Response r{200, "OK", source()};
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.head = head_only;
    if (!head_only) ++scrapes;
    return r;
  } catch (const std::exception& e) {
    ++bad_requests;
    return Response{500, "Internal Server Error",
                    std::string("metrics source failed: ") + e.what() + "\n"};
  }
}

void MetricsServer::Impl::do_accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) {
      return;  // stopping
    }
    if (ec) {
      accept_retry.expires_after(kAcceptRetryDelay);
      accept_retry.async_wait([this](const error_code& wait_ec) {
        if (!wait_ec) {
          do_accept();
        }
      });
      return;
    }
    if (active_connections.load(std::memory_order_relaxed) >= config.max_connections) {
      ++rejected;
      error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<Session>(this, std::move(socket))->start();
    }
    do_accept();
  });
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const MetricsServerConfig& config,
                                                            MetricsSource source) {
  if (!source) {
    return invalid_argument("metrics server: no metrics source");
  }
  if (config.max_connections == 0 || config.max_connections > kMaxMetricsConnections) {
    return invalid_argument("metrics server: max_connections must be 1.." +
                            std::to_string(kMaxMetricsConnections));
  }
  if (config.max_request_bytes < kMinMetricsRequestBytes ||
      config.max_request_bytes > kMaxMetricsRequestBytes) {
    return invalid_argument("metrics server: max_request_bytes must be " +
                            std::to_string(kMinMetricsRequestBytes) + ".." +
                            std::to_string(kMaxMetricsRequestBytes));
  }
  if (config.timeout.count() <= 0 || config.timeout > kMaxMetricsTimeout) {
    return invalid_argument("metrics server: timeout must be 1.." +
                            std::to_string(kMaxMetricsTimeout.count()) + " ms");
  }
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(config.bind_address, ec);
  if (ec) {
    return invalid_argument("metrics server: '" + config.bind_address +
                            "' is not an IP address literal");
  }
  if (!address.is_loopback() && !config.allow_non_loopback) {
    return invalid_argument("metrics server: refusing to bind to non-loopback address '" +
                            config.bind_address +
                            "' (metrics reveal model structure; set allow_non_loopback to expose "
                            "them)");
  }

  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>();
  } catch (const std::exception& e) {
    return Status::error(STRATA_E_NOMEM, std::string("metrics server: ") + e.what());
  }
  impl->config = config;
  impl->source = std::move(source);
  const tcp::endpoint endpoint(address, config.port);
  const std::string where = config.bind_address + ":" + std::to_string(config.port);
  const auto io_status = [&](const char* what) {
    return Status::error(
        STRATA_E_IO, std::string("metrics server: ") + what + " " + where + ": " + ec.message());
  };
  impl->acceptor.open(endpoint.protocol(), ec);
  if (ec) {
    return io_status("opening a socket for");
  }
  // Lets a restarted runtime take its port back while old connections sit in TIME_WAIT; Linux
  // still refuses a port another socket is listening on.
  impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) {
    return io_status("setting SO_REUSEADDR on");
  }
  impl->acceptor.bind(endpoint, ec);
  if (ec) {
    return io_status("binding");
  }
  impl->acceptor.listen(kListenBacklog, ec);
  if (ec) {
    return io_status("listening on");
  }
  const tcp::endpoint local = impl->acceptor.local_endpoint(ec);
  if (ec) {
    return io_status("reading the bound port of");
  }
  impl->bound_port = local.port();

  Impl* p = impl.get();
  p->do_accept();
  try {
    p->thread = std::thread([p] {
      (void)pthread_setname_np(pthread_self(), "strata-metrics");
      // Handlers do not throw (errors travel as error_code, the source is wrapped), so run()
      // returns only when stopped; the loop is a last guard so the endpoint never takes the
      // training process down.
      for (;;) {
        try {
          p->io.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "strata: metrics server: %s\n", e.what());
        }
      }
    });
  } catch (const std::system_error& e) {
    return Status::error(STRATA_E_LIMIT,
                         std::string("metrics server: starting its thread: ") + e.what());
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const MetricsServerConfig& config,
                                                            const MetricsRegistry& registry) {
  return start(config, [&registry] { return registry.render_prometheus(); });
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() {
  // stop() makes run() return; the sessions still pending are destroyed with the io_context
  // (closing their sockets) after the thread is gone, so nothing races with their teardown.
  impl_->io.stop();
  if (impl_->thread.joinable()) {
    impl_->thread.join();
  }
  error_code ignored;
  impl_->acceptor.close(ignored);
}

uint16_t MetricsServer::port() const {
  return impl_->bound_port;
}

const std::string& MetricsServer::address() const {
  return impl_->config.bind_address;
}

MetricsServerStats MetricsServer::stats() const {
  MetricsServerStats s;
  s.scrapes = impl_->scrapes.load(std::memory_order_relaxed);
  s.not_found = impl_->not_found.load(std::memory_order_relaxed);
  s.bad_requests = impl_->bad_requests.load(std::memory_order_relaxed);
  s.rejected_connections = impl_->rejected.load(std::memory_order_relaxed);
  s.timed_out = impl_->timed_out.load(std::memory_order_relaxed);
  s.active_connections = impl_->active_connections.load(std::memory_order_relaxed);
  return s;
}

}  // namespace strata::telemetry
