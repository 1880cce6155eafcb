#!/usr/bin/python3
"""The torch DataLoader rows of `sluice-perf transport` (perf/transport.cc, docs/perf.md).

torch's own way of moving pre-built tensors between processes, next to the
sluice rows: an IterableDataset whose DataLoader workers each build one
torch.uint8 tensor of S bytes once and yield that same tensor forever, read
by the main process through DataLoader(batch_size=None,
num_workers=--num_workers) (torch's defaults otherwise: fork, prefetch_factor 2,
file-descriptor shared memory, no pinning). Per size in --sizes, a fresh
DataLoader iterator: --warmup_elements, then a timed pass that stops at the
first of --max_elements, --max_bytes and --max_seconds (the clock read after
every element, as the sluice clients do); then the iterator is deleted (its
workers shut down and reaped).

Prints one JSON line per size (and writes them to --out):
  size, elements, bytes, seconds    the timed pass
  cpu_user_s, cpu_sys_s             RUSAGE_SELF (the main process) over the timed pass
  workers_cpu_s                     RUSAGE_CHILDREN user+sys of that size's DataLoader
                                    workers over their whole life (warm-up included),
                                    read after they are reaped
  torch, torch_threads, num_workers
Exits with status 3 (and {"error": "import", "message": ...}) when torch
cannot be imported, so that sluice-perf skips the torch rows.
"""
import argparse
import gc
import json
import resource
import sys
import time

TORCH_MISSING_EXIT = 3


def cpu_seconds(who):
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", required=True, help="payload bytes per element, comma-separated")
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--warmup_elements", default="10",
                   help="per size (comma-separated, as --sizes) or one value for all")
    p.add_argument("--max_elements", type=int, default=10000)
    p.add_argument("--max_bytes", type=int, default=1 << 30)
    p.add_argument("--max_seconds", type=float, default=2.0)
    p.add_argument("--out", help="also write the JSON lines here")
    a = p.parse_args()
    out = open(a.out, "w") if a.out else None

    def emit(result):
        line = json.dumps(result)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    try:
        import torch
        from torch.utils.data import DataLoader, IterableDataset
    except Exception as e:  # ImportError, or a broken install's own error
        emit({"error": "import", "message": f"{type(e).__name__}: {e}"})
        return TORCH_MISSING_EXIT

    class PrebuiltTensors(IterableDataset):
        """Yields the same uint8[size] tensor forever, built once per worker."""

        def __init__(self, size):
            self.size = size

        def __iter__(self):
            t = torch.empty(self.size, dtype=torch.uint8)
            t.fill_(7)  # touch every page once, before anything is timed
            while True:
                yield t

    sizes = [int(s) for s in a.sizes.split(",")]
    warmups = [int(w) for w in a.warmup_elements.split(",")]
    if len(warmups) == 1:
        warmups *= len(sizes)
    if len(warmups) != len(sizes):
        p.error("--warmup_elements: one value, or one per size")
    for size, warmup in zip(sizes, warmups):
        loader = DataLoader(PrebuiltTensors(size), batch_size=None, num_workers=a.num_workers)
        children0 = cpu_seconds(resource.RUSAGE_CHILDREN)
        it = iter(loader)
        for _ in range(warmup):
            next(it)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        clock = time.perf_counter
        t0 = clock()
        elements = nbytes = 0
        seconds = 0.0
        while elements < a.max_elements and nbytes < a.max_bytes and seconds < a.max_seconds:
            t = next(it)
            elements += 1
            nbytes += t.numel() * t.element_size()  # torch 1.13 has no .nbytes
            seconds = clock() - t0
        del t
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        # Deleting the iterator shuts its (infinite) workers down and joins them.
        del it
        gc.collect()
        emit({
            "size": size,
            "elements": elements,
            "bytes": nbytes,
            "seconds": seconds,
            "cpu_user_s": ru1.ru_utime - ru0.ru_utime,
            "cpu_sys_s": ru1.ru_stime - ru0.ru_stime,
            "workers_cpu_s": cpu_seconds(resource.RUSAGE_CHILDREN) - children0,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "num_workers": a.num_workers,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
