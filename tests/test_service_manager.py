"""`run` under systemd's Type=notify: READY=1 once the model is warmed and the sources are open (so that
`systemctl start` returns when alerts can come), a STATUS= line for `systemctl status`, WATCHDOG=1 as frames are
stepped (a run that hangs is killed and restarted by WatchdogSec=), STOPPING=1 as it stops. The manager is played
here by a real Unix datagram socket, as systemd listens."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from runtime_fixtures import QUERY, write_video

from sdqes_edge.cli import run
from sdqes_edge.sample import sample_frames
from sdqes_edge.service_manager import ServiceManager


@pytest.fixture
def manager_socket(tmp_path):
    """A socket where a service manager listens, read as it is written to, as systemd reads it: (its address, a
    function that returns what it was told so far)."""
    address = str(tmp_path / "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(0.05)
    messages: list[str] = []
    listening = threading.Event()
    listening.set()

    def listen() -> None:
        while listening.is_set():
            try:
                messages.append(listener.recv(4096).decode())
            except socket.timeout:
                continue

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()

    def told() -> list[str]:
        time.sleep(0.2)  # what is on its way arrives
        return list(messages)

    yield address, told
    listening.clear()
    reader.join()
    listener.close()


def test_a_manager_slow_to_read_never_stalls_the_run(tmp_path):
    """A Unix datagram socket holds 10 messages unread by default; a blocking send then waited, and the stream
    with it (found when this file's first listener read only at the end: the run hung)."""
    address = str(tmp_path / "notify")
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    deaf.bind(address)
    try:
        manager = ServiceManager({"NOTIFY_SOCKET": address})
        stepping = threading.Thread(target=lambda: [manager.status(f"frame {n}") for n in range(100)], daemon=True)
        stepping.start()
        stepping.join(timeout=5)
        assert not stepping.is_alive(), "the 11th message waited for a reader"
    finally:
        deaf.close()


def test_a_run_tells_the_manager_it_is_ready_pings_its_watchdog_and_says_it_stops(exported, tmp_path,
                                                                                  manager_socket, monkeypatch):
    _, bundle = exported
    address, told = manager_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "1")  # a ping due at every frame
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    video = write_video(tmp_path / "clip.avi", sample_frames(20, 60, 80))
    assert run(["run", str(bundle), "--source", str(video), "--query", QUERY, "--quiet"]) == 0
    messages = told()
    assert messages[0].startswith("READY=1\nSTATUS=streaming clip at 5 fps with 1 query")
    assert messages.count("WATCHDOG=1") == 10  # 20 frames at 10 fps, sampled at 5
    assert messages[-1] == "STOPPING=1\nSTATUS=stopping after 10 frames: finishing every output"


def test_the_watchdog_is_pinged_at_most_twice_a_period_and_only_for_this_process(manager_socket):
    address, told = manager_socket
    manager = ServiceManager({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"})
    manager.ready("streaming")
    for _ in range(100):
        manager.alive()  # just after READY=1: none due yet
    time.sleep(0.11)
    manager.alive()
    manager.alive()
    assert told() == ["READY=1\nSTATUS=streaming", "WATCHDOG=1"]
    for_another = ServiceManager({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"})
    assert for_another.watchdog_seconds is None


def test_an_abstract_socket_is_reached_by_its_at_sign_name():
    name = f"sdqes-edge-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("\0" + name)
    try:
        ServiceManager({"NOTIFY_SOCKET": "@" + name}).status("12.0 frames/s")
        assert listener.recv(4096) == b"STATUS=12.0 frames/s"
    finally:
        listener.close()


def test_without_a_manager_or_with_one_gone_nothing_is_said_and_nothing_fails(tmp_path):
    assert not ServiceManager({}).listening
    ServiceManager({}).ready("streaming")  # a terminal, docker, a plain unit
    gone = ServiceManager({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens"), "WATCHDOG_USEC": "1"})
    gone.ready("streaming")
    gone.alive()
    gone.stopping("done")
