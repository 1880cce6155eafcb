# How long a restored distributed_epoch iteration takes to its first
# element when the checkpoint was saved right after reading (the splits
# the checkpoint does not know as done are read again on the workers
# first), and what Save() costs. In-process dispatcher and two workers,
# Range(128,000) in splits of 32, saved after 115,200 elements; 3 trials.
# Usage: /usr/bin/python3 perf/checkpoint_restore_lag.py BUILD_DIR
import sys, time
sys.path.insert(0, sys.argv[1] + "/python")
import sluice
sluice.set_log_level("error")
N, SAVE_AT = 128000, 115200
for trial in range(3):
    d = sluice.DispatchServer(range_split_elements=32)
    workers = [sluice.WorkerServer(dispatcher_address=d.address) for _ in range(2)]
    ds = sluice.Dataset.range(N).distribute("distributed_epoch", d.target,
                                            max_outstanding_requests=4)
    it = ds.make_iterator()
    for _ in range(SAVE_AT):
        next(it)
    t = time.perf_counter()
    checkpoint = it.save()
    save_ms = (time.perf_counter() - t) * 1e3
    del it
    t = time.perf_counter()
    resumed = ds.make_iterator(checkpoint=checkpoint)
    next(resumed)
    first_s = time.perf_counter() - t
    rest = 1 + sum(1 for _ in resumed)
    print(f"trial {trial}: Save() {save_ms:.2f} ms, {len(checkpoint):,} bytes; restore to its "
          f"first element {first_s:.3f} s; {rest:,} elements after it (expected {N - SAVE_AT:,})",
          flush=True)
    del resumed
