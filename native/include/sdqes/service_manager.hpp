// Telling a service manager how sdqes-run is doing: systemd's notification protocol (sd_notify), spoken by hand as
// the Python runtime's sdqes_edge/service_manager.py speaks it.
//
// Under a unit of Type=notify systemd sets NOTIFY_SOCKET; a run then says READY=1 once the engine is loaded and
// warmed and the source open (so `systemctl start` returns when alerts can come), keeps a one-line STATUS= for
// `systemctl status`, pings WATCHDOG=1 as frames are stepped (with WatchdogSec=, a run that hangs, stepping nothing,
// is killed and restarted), and says STOPPING=1 as it stops. Without NOTIFY_SOCKET (a terminal, docker, a plain
// unit) every call does nothing. The protocol is one datagram per message on a Unix socket: no libsystemd needed.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace sdqes {

class ServiceManager {
 public:
  using Environment = std::map<std::string, std::string>;
  // NOTIFY_SOCKET (a path, or "@name" for an abstract socket), WATCHDOG_USEC and WATCHDOG_PID, as this process has
  // them.
  static Environment process_environment();

  explicit ServiceManager(const Environment& environment = process_environment());
  ~ServiceManager();
  ServiceManager(const ServiceManager&) = delete;
  ServiceManager& operator=(const ServiceManager&) = delete;

  bool listening() const { return !address_.empty(); }
  // WatchdogSec, where the watchdog is this process's (WATCHDOG_PID unset or ours).
  std::optional<double> watchdog_seconds() const { return watchdog_s_; }

  void ready(const std::string& status);     // streams now: engine loaded and warmed, source open
  void status(const std::string& text);      // the line `systemctl status` shows
  void alive();                              // a frame was stepped: a watchdog ping, at most twice a period
  void stopping(const std::string& status);  // finishing every output, then ending

 private:
  // Each message one datagram; a manager slow to read never stalls the stream (its queue full: this one dropped),
  // and one that has gone is not the run's failure (the socket closed, opened again at the next message).
  void send(const std::string& message);
  void close_socket();

  std::string address_;  // an abstract socket's with its leading NUL byte
  std::optional<double> watchdog_s_;
  std::chrono::steady_clock::time_point last_ping_ = std::chrono::steady_clock::time_point::min();
  int socket_ = -1;
};

}  // namespace sdqes
