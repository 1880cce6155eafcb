#!/usr/bin/python3
"""The Python measuring client of `sluice-perf transport` (perf/transport.cc, docs/perf.md).

The `payload` workload of the C++ client (perf/measure.cc, RunClient), built
and read through the `sluice` Python package:

    Dataset.range(S, S + 1).repeat().map(udf("perf_payload"))
           .distribute(service, data_transfer_protocol, fallback_to_grpc=False,
                       max_outstanding_requests)

(range(S, S + 1) is the C++ client's FromTensors({int64 S}): one int64 scalar
S. The Python from_tensors cannot make it: np.ascontiguousarray turns a 0-d
array into shape [1].) The same passes and bounds: --warmup_elements, then a timed pass that
stops at the first of --max_elements, --max_bytes and --max_seconds (the
clock is read after every element, as the C++ client does), then, when
--latency_elements > 0, a latency pass with max_outstanding_requests=1
timing each next(). Each element is a numpy array (`for e in ds`, the way
a trainer reads; --output tensor reads sluice.Tensor handles instead),
dropped before the next one arrives.

Run by sluice-perf with Debian's /usr/bin/python3, PYTHONPATH=<build>/python
and UCX_TLS set for the transport. Prints one JSON line (and writes it to
--out) with the fields of the C++ client's record:
  elements, bytes, seconds          the timed pass
  cpu_user_s, cpu_sys_s             RUSAGE_SELF over the timed pass (all threads)
  client_payload_bytes_copied, ucx_elements_received, ucx_bytes_received,
  dedicated_buffer_allocations      sluice.transport_stats() deltas over it
  pool_high_water_mark              at its end
  lat_n, lat_mean_us, lat_p50_us, lat_p99_us   the latency pass, when run
  python, numpy, output             versions and the element type read
Exits with status 3 (and {"error": "import", "message": ...}) when sluice
(or numpy) cannot be imported, so that sluice-perf skips the python rows.
"""
import argparse
import resource
import sys
import time

from perf_child import emit  # beside this script

SLUICE_MISSING_EXIT = 3


def percentile(values, p):
    """As the C++ client's: the element at index min(n - 1, floor(p * n)) of the sorted values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--service", required=True, help="grpc://127.0.0.1:PORT")
    p.add_argument("--protocol", default="ucx", help="data_transfer_protocol")
    p.add_argument("--size", type=int, required=True, help="payload bytes per element")
    p.add_argument("--max_outstanding_requests", type=int, default=8)
    p.add_argument("--warmup_elements", type=int, default=10)
    p.add_argument("--max_elements", type=int, default=10000)
    p.add_argument("--max_bytes", type=int, default=1 << 30)
    p.add_argument("--max_seconds", type=float, default=2.0)
    p.add_argument("--latency_elements", type=int, default=0)
    p.add_argument("--latency_seconds", type=float, default=0.5)
    p.add_argument("--plugin", required=True, help="libsluice_perf_plugin.so (perf_payload)")
    p.add_argument("--output", choices=("numpy", "tensor"), default="numpy",
                   help="what each element is read as")
    p.add_argument("--out", help="also write the JSON line here")
    a = p.parse_args()
    try:
        import numpy as np
        import sluice
    except Exception as e:  # ImportError, or a module built for another interpreter
        emit({"error": "import", "message": f"{type(e).__name__}: {e}"}, a.out)
        return SLUICE_MISSING_EXIT

    sluice.load_plugin(a.plugin)
    ds = (sluice.Dataset.range(a.size, a.size + 1)
          .repeat()
          .map(sluice.udf("perf_payload")))

    def open_iterator(outstanding):
        d = ds.distribute(service=a.service, data_transfer_protocol=a.protocol,
                          fallback_to_grpc=False, max_outstanding_requests=outstanding)
        return d.make_iterator(output=a.output)

    def cpu():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime, ru.ru_stime

    result = {}
    with open_iterator(a.max_outstanding_requests) as it:
        for _ in range(a.warmup_elements):
            next(it)
        ts0 = sluice.transport_stats()
        user0, sys0 = cpu()
        clock = time.perf_counter
        t0 = clock()
        elements = nbytes = 0
        seconds = 0.0
        # The loop of the C++ client: one element, its bytes, the clock.
        while elements < a.max_elements and nbytes < a.max_bytes and seconds < a.max_seconds:
            e = next(it)
            elements += 1
            nbytes += e.nbytes
            seconds = clock() - t0
        del e
        user1, sys1 = cpu()
        ts1 = sluice.transport_stats()
    result.update({
        "elements": elements,
        "bytes": nbytes,
        "seconds": seconds,
        "cpu_user_s": user1 - user0,
        "cpu_sys_s": sys1 - sys0,
    })
    for k in ("client_payload_bytes_copied", "ucx_elements_received", "ucx_bytes_received",
              "dedicated_buffer_allocations"):
        result[k] = ts1[k] - ts0[k]
    result["pool_high_water_mark"] = ts1["pool_high_water_mark"]

    if a.latency_elements > 0:
        with open_iterator(1) as it:
            for _ in range(3):
                next(it)
            us = []
            clock = time.perf_counter
            start = clock()
            while len(us) < a.latency_elements and (len(us) < 5 or clock() - start < a.latency_seconds):
                t = clock()
                next(it)
                us.append((clock() - t) * 1e6)
        result.update({
            "lat_n": len(us),
            "lat_mean_us": sum(us) / len(us),
            "lat_p50_us": percentile(us, 0.50),
            "lat_p99_us": percentile(us, 0.99),
        })
    result.update({
        "python": "%d.%d.%d" % sys.version_info[:3],
        "numpy": np.__version__,
        "output": a.output,
    })
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
