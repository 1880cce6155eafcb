"""What a user sees when the service has nothing to give: a warning through
Python's logging, and Ctrl-C that stops a blocked next()."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import sluice


def test_a_client_without_workers_warns_through_python_logging(caplog, hang_guard):
    caplog.set_level(logging.WARNING, logger="sluice")
    sluice.set_log_level("warn")
    try:
        with sluice.DispatchServer() as dispatcher:
            ds = sluice.Dataset.range(3).distribute(service=dispatcher.target,
                                                    stall_warning_ms=200)
            it = iter(ds)
            got = []
            reader = threading.Thread(target=lambda: got.append(int(next(it))))
            reader.start()
            deadline = time.time() + 20
            while time.time() < deadline and not any(
                    "no element for" in r.getMessage() for r in caplog.records):
                time.sleep(0.05)
            warnings = [r for r in caplog.records if "no element for" in r.getMessage()]
            assert warnings, "no stall warning reached Python's logging"
            assert warnings[0].name == "sluice"
            assert warnings[0].levelno == logging.WARNING
            assert dispatcher.address in warnings[0].getMessage()
            # A worker arrives: the waiting next() returns.
            worker = sluice.WorkerServer(dispatcher_address=dispatcher.address)
            try:
                reader.join(20)
                assert not reader.is_alive()
                assert got and 0 <= got[0] < 3
                it.close()
            finally:
                worker.stop()
    finally:
        sluice.set_log_level("error")


CHILD = textwrap.dedent("""
    import sys, time
    import sluice
    with sluice.DispatchServer() as dispatcher:   # no worker: next() waits
        it = iter(sluice.Dataset.range(3).distribute(service=dispatcher.target))
        print("waiting", flush=True)
        try:
            next(it)
            print("no interrupt", flush=True)
        except KeyboardInterrupt:
            print("interrupted", time.time(), flush=True)
        try:
            next(it)
        except RuntimeError as e:
            print("then:", e, flush=True)
        it.close()
        print("closed", flush=True)
""")


def test_ctrl_c_interrupts_a_blocked_next_and_leaves_the_iterator_closable(hang_guard):
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # next() is waiting now
        sent = time.time()
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    lines = out.splitlines()
    interrupted = [l for l in lines if l.startswith("interrupted")]
    assert interrupted, out
    latency = float(interrupted[0].split()[1]) - sent
    print(f"KeyboardInterrupt {latency * 1000:.0f} ms after SIGINT")
    assert latency < 5, out  # a hang guard; it polls every 100 ms
    assert any("interrupted (Ctrl-C)" in l for l in lines if l.startswith("then:")), out
    assert "closed" in lines, out
    assert child.returncode == 0, out
