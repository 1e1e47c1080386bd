"""sdqes-run's alert log through a disk that refuses it, as `sdqes-edge run`'s (tests/test_alert_log_refused.py):
the refusal said once, the stream watched on and alerting, and the alerts still refused as it stops the run's error
(exit status 1), naming the log and the alerts it lost. It had ended at the first refused line. The refusal is
real: a file-size limit of 0 (EFBIG, as a full disk's ENOSPC)."""

from __future__ import annotations

import subprocess
import time

from runtime_fixtures import seconds_to_stop


def test_sdqes_run_whose_alert_log_the_disk_refuses_goes_on_alerting_and_ends_with_the_error(
        sdqes_run_on_the_cpu, bundle, endless_stream, tmp_path):
    log = tmp_path / "alerts.jsonl"
    command = ["bash", "-c", 'ulimit -f 0 && exec "$@"', "limited", str(sdqes_run_on_the_cpu), bundle, "--source",
               endless_stream, "--threshold", "0.001", "--events", str(log)]
    service = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = []
    deadline = time.monotonic() + 120
    for line in service.stderr:  # until the refusal is said (both queries alert at the first frame)
        said.append(line)
        if "cannot append alerts" in line or time.monotonic() > deadline:
            break
    time.sleep(2)  # frames stepped past the refusal
    assert service.poll() is None, "".join(said)  # still watching
    assert seconds_to_stop(service) < 30
    said += service.stderr.readlines()
    text = "".join(said)
    assert service.returncode == 1, text
    assert text.count(f"sdqes-run: warning: cannot append alerts to the alert log {log} (File too large); the stream "
                      "goes on alerting") == 1, text
    assert "sdqes-run: interrupted (SIGTERM) after " in text and ", 2 alerts, " in text, text
    assert said[-1].rstrip("\n") == (
        f"sdqes-run: error: cannot append alerts to {log} (File too large; 2 of the 2 alerts it refused meanwhile are "
        "not in it): the file is as large as its file system (FAT32: 4 GiB) or `ulimit -f` allows; write to another "
        "disk, and run again")
