#!/usr/bin/python3
"""Churn soak: the service as users meet it under failures, for minutes.

A fault-tolerant sluice-dispatcher and 3 sluice-worker processes on
loopback; distributed_epoch epochs of Range(N).map(x * 3) read in a loop
from Python. Every --kill_every seconds a random worker is SIGKILLed (or,
with --graceful, every other one SIGTERMed) and a new one started on a new
port; every --dispatcher_every seconds the dispatcher is killed the same way
and restarted on its port from its journal. Each epoch must hold every
element exactly once, over all consumers.

    /usr/bin/python3 scripts/churn_soak.py build/default --seconds 300
    /usr/bin/python3 scripts/churn_soak.py build/default --consumers 2   # a shared job_name
    /usr/bin/python3 scripts/churn_soak.py build/default --checkpoint    # save, close, resume
    UCX_TLS=tcp /usr/bin/python3 scripts/churn_soak.py build/default --protocol grpc

One line per epoch (elements, duplicates, missing, seconds, kills so far);
exits 1 if any epoch was not exactly once, 2 if an epoch made no progress
for --stall seconds (a hang; the processes are killed first).
"""

import argparse
import collections
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", help="a build directory (holds tools/ and python/)")
    ap.add_argument("--protocol", default="ucx", choices=["ucx", "grpc"])
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--consumers", type=int, default=1,
                    help="consumers sharing the job (job_name), one thread each")
    ap.add_argument("--checkpoint", action="store_true",
                    help="each epoch: save at a random element, close, resume from the save")
    ap.add_argument("--graceful", action="store_true",
                    help="every other kill is a SIGTERM (graceful stop) instead of SIGKILL")
    ap.add_argument("--elements", type=int, default=20000)
    ap.add_argument("--kill_every", type=float, default=2.0)
    ap.add_argument("--dispatcher_every", type=float, default=20.0)
    ap.add_argument("--stall", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.checkpoint and args.consumers != 1:
        ap.error("--checkpoint reads with one consumer")

    sys.path.insert(0, os.path.join(args.build, "python"))
    import numpy as np
    import sluice
    sluice.set_log_level("error")

    tools = os.path.join(args.build, "tools")
    work = tempfile.mkdtemp(prefix="sluice-soak-")
    log = open(os.path.join(work, "processes.log"), "w")
    rng = random.Random(args.seed)
    port = free_port()

    def start_dispatcher():
        return subprocess.Popen(
            [f"{tools}/sluice-dispatcher", "--port", str(port), "--fault_tolerant_mode",
             "--work_dir", os.path.join(work, "journal"), "--worker_timeout_ms", "3000"],
            stdout=log, stderr=log)

    def start_worker():
        return subprocess.Popen(
            [f"{tools}/sluice-worker", "--dispatcher", f"127.0.0.1:{port}",
             "--data_transfer_protocol", args.protocol, "--heartbeat_interval_ms", "500",
             "--dispatcher_timeout_ms", "60000"], stdout=log, stderr=log)

    kills = collections.Counter()
    procs = {"dispatcher": start_dispatcher()}
    time.sleep(0.5)
    workers = [start_worker() for _ in range(3)]

    def stop(p, kind):
        if args.graceful and kills[kind] % 2:
            p.terminate()
        else:
            p.kill()
        p.wait()
        kills[kind] += 1

    done = threading.Event()
    progress = [time.time()]

    def churn():
        last_dispatcher = time.time()
        while not done.wait(args.kill_every):
            i = rng.randrange(len(workers))
            stop(workers[i], "worker")
            workers[i] = start_worker()
            if time.time() - last_dispatcher > args.dispatcher_every:
                stop(procs["dispatcher"], "dispatcher")
                procs["dispatcher"] = start_dispatcher()
                last_dispatcher = time.time()

    def watchdog():
        while not done.wait(1.0):
            if time.time() - progress[0] > args.stall:
                print(f"STALL: no element for {args.stall:.0f} s; logs in {work}", flush=True)
                for p in workers + [procs["dispatcher"]]:
                    p.kill()
                os._exit(2)

    def dataset():
        kw = {"job_name": "soak"} if args.consumers > 1 else {}
        return sluice.Dataset.range(args.elements).map(sluice.x * 3).distribute(
            service=f"127.0.0.1:{port}", processing_mode="distributed_epoch",
            data_transfer_protocol=args.protocol, **kw)

    # One Dataset per consumer, as separate trainers build theirs: the k-th
    # iterator of each reads the job's k-th iteration.
    datasets = [dataset() for _ in range(args.consumers)]

    def drain(iterator, out, stop_at=None):
        for e in iterator:
            out.append(int(np.asarray(e)))
            progress[0] = time.time()
            if stop_at is not None and len(out) == stop_at:
                return

    expected = set(range(0, 3 * args.elements, 3))
    threads = [threading.Thread(target=churn, daemon=True),
               threading.Thread(target=watchdog, daemon=True)]
    for t in threads:
        t.start()
    start, epochs, bad = time.time(), 0, 0
    try:
        while time.time() - start < args.seconds:
            t0 = time.time()
            if args.checkpoint:
                got = []
                it = datasets[0].make_iterator()
                drain(it, got, stop_at=rng.randint(args.elements // 5, 4 * args.elements // 5))
                saved = it.save()
                del it
                drain(datasets[0].make_iterator(checkpoint=saved), got)
            else:
                parts = [[] for _ in datasets]
                readers = [threading.Thread(target=drain, args=(iter(ds), parts[k]))
                           for k, ds in enumerate(datasets)]
                for r in readers:
                    r.start()
                for r in readers:
                    r.join()
                got = [v for part in parts for v in part]
            counts = collections.Counter(got)
            duplicates = sum(n - 1 for n in counts.values() if n > 1)
            missing = len(expected - counts.keys())
            ok = duplicates == 0 and missing == 0 and counts.keys() == expected
            epochs += 1
            bad += not ok
            print(f"epoch {epochs}: {len(got)} elements, duplicates={duplicates} "
                  f"missing={missing} {time.time() - t0:.1f}s kills={dict(kills)} "
                  f"{'OK' if ok else 'BAD'}", flush=True)
    finally:
        done.set()
        for p in workers + [procs["dispatcher"]]:
            p.kill()
    print(f"protocol={args.protocol} consumers={args.consumers} checkpoint={args.checkpoint}: "
          f"{epochs} epochs, {bad} not exactly once, kills {dict(kills)}; logs in {work}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
