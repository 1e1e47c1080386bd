// systemd's notification protocol for sdqes-run (sdqes/service_manager.hpp).
#include "sdqes/service_manager.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace sdqes {

namespace {

const char* const kNotifySocket = "NOTIFY_SOCKET";
const char* const kWatchdogUsec = "WATCHDOG_USEC";  // WatchdogSec, in microseconds: ping at least this often
const char* const kWatchdogPid = "WATCHDOG_PID";    // the process the watchdog is for: a child must not answer for us

std::string value_of(const ServiceManager::Environment& environment, const char* name) {
  const auto it = environment.find(name);
  return it == environment.end() ? "" : it->second;
}

std::optional<double> watchdog_of(const ServiceManager::Environment& environment) {
  const std::string usec = value_of(environment, kWatchdogUsec);
  const std::string pid = value_of(environment, kWatchdogPid);
  if (!pid.empty() && pid != std::to_string(getpid())) return std::nullopt;
  if (usec.empty() || usec.find_first_not_of("0123456789") != std::string::npos || usec.size() > 18) {
    return std::nullopt;
  }
  const long long micros = std::stoll(usec);
  if (micros <= 0) return std::nullopt;
  return static_cast<double>(micros) / 1e6;
}

}  // namespace

ServiceManager::Environment ServiceManager::process_environment() {
  Environment environment;
  for (const char* name : {kNotifySocket, kWatchdogUsec, kWatchdogPid}) {
    if (const char* value = std::getenv(name)) environment[name] = value;
  }
  return environment;
}

ServiceManager::ServiceManager(const Environment& environment)
    : address_(value_of(environment, kNotifySocket)), watchdog_s_(watchdog_of(environment)) {
  if (!address_.empty() && address_[0] == '@') address_[0] = '\0';  // "@name": an abstract socket
  if (address_.size() > sizeof(sockaddr_un::sun_path)) address_.clear();  // no such socket can exist
}

ServiceManager::~ServiceManager() { close_socket(); }

void ServiceManager::ready(const std::string& status) {
  send("READY=1\nSTATUS=" + status);
  last_ping_ = std::chrono::steady_clock::now();
}

void ServiceManager::status(const std::string& text) { send("STATUS=" + text); }

void ServiceManager::alive() {
  if (!watchdog_s_) return;
  const auto now = std::chrono::steady_clock::now();
  if (last_ping_ != std::chrono::steady_clock::time_point::min() &&
      std::chrono::duration<double>(now - last_ping_).count() < *watchdog_s_ / 2) {
    return;
  }
  last_ping_ = now;
  send("WATCHDOG=1");
}

void ServiceManager::stopping(const std::string& status) { send("STOPPING=1\nSTATUS=" + status); }

void ServiceManager::send(const std::string& message) {
  if (address_.empty()) return;
  if (socket_ < 0) {
    socket_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (socket_ < 0) return;
    sockaddr_un where{};
    where.sun_family = AF_UNIX;
    std::memcpy(where.sun_path, address_.data(), address_.size());
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size());
    if (connect(socket_, reinterpret_cast<const sockaddr*>(&where), length) != 0) {
      close_socket();  // the manager has gone, or never was where it said: nothing to tell
      return;
    }
  }
  if (::send(socket_, message.data(), message.size(), MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
      errno != EWOULDBLOCK) {
    close_socket();
  }
}

void ServiceManager::close_socket() {
  if (socket_ >= 0) ::close(socket_);
  socket_ = -1;
}

}  // namespace sdqes
