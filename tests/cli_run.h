// Runs the real `strata` program (STRATA_CLI_PATH, set by the test's CMakeLists.txt) as a user
// would, collecting stdout and stderr: the CLI tests check exit codes, messages and what is left
// on disk, so they go through the program itself rather than its functions.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <string>
#include <vector>

namespace strata::testing {

struct CliRun {
  int code = -1;  // exit status, or 128 + N for death by signal N (as a shell reports it)
  pid_t pid = -1;
  std::string out;
  std::string err;
};

struct CliOptions {
  // Sees stderr as it grows, with the child's pid; e.g. to learn a port, or to send a signal
  // once the run is under way.
  std::function<void(const std::string& err, pid_t pid)> on_stderr;
  std::function<void(pid_t pid)> on_start;  // right after the fork, in the parent
  uid_t run_as_uid = 0;  // nonzero: drop to this uid (and its gid) before exec; needs root
  bool new_process_group = false;  // the child leads its own group (kill(-pid) reaches all)
};

inline CliRun run_cli(const std::vector<std::string>& args, const CliOptions& options = {}) {
  CliRun r;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return r;
  std::vector<std::string> storage = args;
  std::vector<char*> argv;
  std::string program = STRATA_CLI_PATH;
  argv.push_back(program.data());
  for (std::string& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  r.pid = ::fork();
  if (r.pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (options.new_process_group) ::setpgid(0, 0);
    if (options.run_as_uid != 0 &&
        (::setgid(options.run_as_uid) != 0 || ::setuid(options.run_as_uid) != 0)) {
      ::_exit(126);
    }
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  if (r.pid > 0 && options.on_start) options.on_start(r.pid);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open = 2;
  char buf[65536];
  while (open > 0) {
    if (::poll(fds, 2, 1000) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
        continue;
      }
      (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      if (i == 1 && options.on_stderr) options.on_stderr(r.err, r.pid);
    }
  }
  int status = 0;
  ::waitpid(r.pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace strata::testing
