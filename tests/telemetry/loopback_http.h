// A tiny blocking HTTP/1.1 client over POSIX sockets for the metrics server tests: loopback
// only, every call bounded by socket timeouts so a broken server fails a test instead of
// hanging it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "common/unique_fd.h"

namespace strata::telemetry::testing {

inline constexpr std::chrono::milliseconds kClientTimeout{5000};

// Connects to 127.0.0.1:port; an invalid fd when the connection is refused.
inline UniqueFd connect_loopback(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return fd;
  }
  timeval tv{};
  tv.tv_sec = kClientTimeout.count() / 1000;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return UniqueFd();
  }
  return fd;
}

inline bool send_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes (the server always sends Connection: close), a timeout or an error.
// Returns what arrived; *closed says whether it ended with an orderly close.
inline std::string read_until_close(int fd, bool* closed = nullptr) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    // 0: orderly close; ECONNRESET also means the server closed the connection.
    if (closed) {
      *closed = n == 0 || errno == ECONNRESET;
    }
    return out;
  }
}

struct HttpResponse {
  int status = 0;  // 0: no parsable response
  std::string head;
  std::string body;
};

inline HttpResponse parse_response(const std::string& raw) {
  HttpResponse r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.compare(0, 9, "HTTP/1.1 ") != 0) {
    return r;
  }
  r.status = static_cast<int>(std::strtol(raw.c_str() + 9, nullptr, 10));
  r.head = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

inline HttpResponse http_request(uint16_t port, const std::string& request) {
  UniqueFd fd = connect_loopback(port);
  if (!fd.valid() || !send_all(fd.get(), request)) {
    return {};
  }
  return parse_response(read_until_close(fd.get()));
}

inline HttpResponse http_get(uint16_t port, const std::string& path) {
  return http_request(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

// Prometheus text -> {metric name: value}; comment lines skipped.
inline std::map<std::string, double> parse_prometheus(const std::string& body) {
  std::map<std::string, double> out;
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    const size_t space = line.find(' ');
    if (space == std::string::npos) {
      continue;
    }
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

}  // namespace strata::telemetry::testing
