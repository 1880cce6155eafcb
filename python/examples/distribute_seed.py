"""The seed example from Python, on an in-process service with two workers:
Range(5).map(x * x) runs on the workers, .map(x + 1) here. parallel_epochs:
every worker produces the whole dataset, so each of 1 2 5 10 17 arrives
twice.

    PYTHONPATH=build/default/python /usr/bin/python3 python/examples/distribute_seed.py
"""

import sluice
from sluice import x

sluice.set_log_level("warn")

with sluice.DispatchServer() as dispatcher:
    workers = [sluice.WorkerServer(dispatcher_address=dispatcher.address) for _ in range(2)]
    try:
        local = sluice.Dataset.range(5).map(x * x).map(x + 1)
        print("local:", " ".join(str(int(e)) for e in local))
        ds = (sluice.Dataset.range(5)
              .map(x * x)
              .distribute(processing_mode="parallel_epochs", service=dispatcher.target,
                          job_name=None, max_outstanding_requests=8)
              .map(x + 1))
        print("range(5).map(x*x).distribute(parallel_epochs).map(x+1), sorted:",
              " ".join(str(v) for v in sorted(int(e) for e in ds)))
    finally:
        for w in workers:
            w.stop()
