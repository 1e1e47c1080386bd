// sdqes-run tells systemd how it is doing as `sdqes-edge run` does (sdqes/service_manager.hpp): the messages a
// listening socket receives, the watchdog's pace, and silence where no manager listens.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "sdqes/service_manager.hpp"

namespace {

using namespace std::chrono_literals;
using Environment = sdqes::ServiceManager::Environment;

// What systemd does: a datagram socket bound at NOTIFY_SOCKET's address, read message by message.
class FakeManager {
 public:
  explicit FakeManager(const std::string& address) : address_(address) {
    socket_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un where{};
    where.sun_family = AF_UNIX;
    std::string raw = address;
    if (raw[0] == '@') raw[0] = '\0';
    std::memcpy(where.sun_path, raw.data(), raw.size());
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + raw.size());
    if (bind(socket_, reinterpret_cast<const sockaddr*>(&where), length) != 0) throw std::runtime_error("bind");
  }
  ~FakeManager() {
    ::close(socket_);
    if (address_[0] != '@') std::filesystem::remove(address_);
  }
  std::vector<std::string> received() {
    std::vector<std::string> messages;
    char buffer[4096];
    for (ssize_t n; (n = recv(socket_, buffer, sizeof buffer, 0)) > 0;) messages.emplace_back(buffer, n);
    return messages;
  }

 private:
  std::string address_;
  int socket_ = -1;
};

std::string socket_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()))).string();
}

}  // namespace

TEST(ServiceManager, SaysReadyStatusAndStoppingToTheSocketSystemdNames) {
  const std::string path = socket_path("sdqes-notify");
  FakeManager systemd(path);
  sdqes::ServiceManager manager({{"NOTIFY_SOCKET", path}});
  ASSERT_TRUE(manager.listening());
  manager.ready("streaming camera0: 2 queries");
  manager.status("30.0 frames/s, dropped 0, 1 alert");
  manager.stopping("stopping after 90 frames");
  EXPECT_EQ(systemd.received(), (std::vector<std::string>{"READY=1\nSTATUS=streaming camera0: 2 queries",
                                                          "STATUS=30.0 frames/s, dropped 0, 1 alert",
                                                          "STOPPING=1\nSTATUS=stopping after 90 frames"}));
}

TEST(ServiceManager, ReachesAnAbstractSocketNamedWithAnAt) {
  const std::string name = "@sdqes-notify-abstract-" + std::to_string(getpid());
  FakeManager systemd(name);
  sdqes::ServiceManager manager({{"NOTIFY_SOCKET", name}});
  manager.ready("streaming");
  EXPECT_EQ(systemd.received(), (std::vector<std::string>{"READY=1\nSTATUS=streaming"}));
}

TEST(ServiceManager, PingsTheWatchdogAtMostTwiceAPeriodAndOnlyForThisProcess) {
  const std::string path = socket_path("sdqes-watchdog");
  FakeManager systemd(path);
  sdqes::ServiceManager manager({{"NOTIFY_SOCKET", path}, {"WATCHDOG_USEC", "200000"}});
  ASSERT_EQ(manager.watchdog_seconds(), 0.2);
  manager.ready("streaming");
  manager.alive();  // just said ready: no ping yet
  std::this_thread::sleep_for(120ms);
  manager.alive();  // half a period on: a ping
  manager.alive();  // and no second one straight after
  EXPECT_EQ(systemd.received(), (std::vector<std::string>{"READY=1\nSTATUS=streaming", "WATCHDOG=1"}));
  // A watchdog for another process (a parent that started us), or WatchdogSec unreadable: none.
  EXPECT_FALSE(sdqes::ServiceManager({{"WATCHDOG_USEC", "200000"}, {"WATCHDOG_PID", "1"}}).watchdog_seconds());
  EXPECT_EQ(sdqes::ServiceManager({{"WATCHDOG_USEC", "200000"}, {"WATCHDOG_PID", std::to_string(getpid())}})
                .watchdog_seconds(),
            0.2);
  for (const char* usec : {"0", "-5", "2s", ""}) {
    EXPECT_FALSE(sdqes::ServiceManager(Environment{{"WATCHDOG_USEC", usec}}).watchdog_seconds()) << usec;
  }
}

TEST(ServiceManager, DoesNothingWhereNoManagerListensAndGoesOnWhenOneHasGone) {
  sdqes::ServiceManager untold(Environment{});
  EXPECT_FALSE(untold.listening());
  untold.ready("streaming");  // a terminal, docker: nothing sent, nothing raised
  const std::string path = socket_path("sdqes-gone");
  sdqes::ServiceManager manager({{"NOTIFY_SOCKET", path}});
  manager.status("nobody listens yet");  // refused: the run goes on, untold
  {
    FakeManager systemd(path);  // a manager (back) at that address
    manager.status("heard");
    EXPECT_EQ(systemd.received(), (std::vector<std::string>{"STATUS=heard"}));
  }
  manager.stopping("the manager has gone");  // its socket gone: no error
  FakeManager again(path);
  manager.status("heard again");
  EXPECT_EQ(again.received(), (std::vector<std::string>{"STATUS=heard again"}));
}
