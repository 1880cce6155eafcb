"""GPU check for CUDA-pinned receive arenas (perf/gpu_check.sh runs it).

Measures host-to-device GB/s of elements received over UCX into
CUDA-pinned arenas (distribute(..., cuda_pinned="on")), beside the same
copy from pageable memory, from cudaHostAlloc memory (torch's pinned
allocator: the ceiling), and torch's pin_memory() path (a staging copy into
pinned memory, then the device copy), and checks that an arena slot is not
reused while its copy is in flight (sluice.torch.DeviceCopier).

Prints one JSON line per measurement and a summary; exits 0 without a GPU
(saying so), 1 when a check fails.
"""

import json
import sys
import time

import torch

import sluice
import sluice.torch
from sluice import x

ELEMENT_BYTES = 64 << 20
ROUNDS = 20


def gbps(fn, nbytes, rounds=ROUNDS):
    fn()  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn()
    torch.cuda.synchronize()
    return nbytes * rounds / (time.perf_counter() - t0) / 1e9


def main():
    if not torch.cuda.is_available():
        print("gpu_check: no GPU visible to torch; nothing measured (RESULTS.md keeps saying "
              "that CUDA pinning has not run on a GPU)")
        return 0
    sluice.set_log_level("error")
    dev = torch.device("cuda:0")
    dst = torch.empty(ELEMENT_BYTES, dtype=torch.uint8, device=dev)
    results = {}
    failures = []
    with sluice.DispatchServer() as dispatcher:
        worker = sluice.WorkerServer(dispatcher_address=dispatcher.address)
        try:
            payload = torch.arange(ELEMENT_BYTES, dtype=torch.int64).to(torch.uint8).numpy()
            ds = (sluice.Dataset.from_tensors([payload]).repeat(ROUNDS + 2)
                  .distribute("parallel_epochs", dispatcher.target, cuda_pinned="on",
                              max_outstanding_requests=2))
            held = []
            for host in sluice.torch.IterableDataset(ds):
                held.append(host)
                if len(held) == 2:
                    break
            stats = sluice.transport_stats()
            results["arena_pinned_bytes"] = stats["receive_pool_cuda_pinned_bytes"]
            if stats["receive_pool_cuda_pinned_bytes"] <= 0:
                failures.append("the receive arenas were not pinned")
            arena = held[0]
            results["arena_is_pinned"] = bool(arena.is_pinned())
            results["arena_gbps"] = gbps(lambda: dst.copy_(arena, non_blocking=True),
                                         ELEMENT_BYTES)
            pageable = torch.from_numpy(payload.copy())
            results["pageable_gbps"] = gbps(lambda: dst.copy_(pageable, non_blocking=True),
                                            ELEMENT_BYTES)
            host_alloc = torch.empty(ELEMENT_BYTES, dtype=torch.uint8).pin_memory()
            host_alloc.copy_(pageable)
            results["cuda_host_alloc_gbps"] = gbps(
                lambda: dst.copy_(host_alloc, non_blocking=True), ELEMENT_BYTES)
            results["torch_pin_memory_path_gbps"] = gbps(
                lambda: dst.copy_(pageable.pin_memory(), non_blocking=True), ELEMENT_BYTES, 5)
            del held, arena

            # Slot reuse: copy every element with DeviceCopier while dropping
            # the host tensors at once; every device copy must equal the payload.
            expected = torch.from_numpy(payload).to(dev)
            copies = list(sluice.torch.IterableDataset(ds, device=dev))
            torch.cuda.synchronize()
            bad = sum(int(not torch.equal(c, expected)) for c in copies)
            results["copies_checked"] = len(copies)
            if bad:
                failures.append(f"{bad} of {len(copies)} device copies differ: a slot was "
                                "reused under its copy")
        finally:
            worker.stop()
    ratio_ceiling = results["arena_gbps"] / results["cuda_host_alloc_gbps"]
    ratio_torch = results["arena_gbps"] / results["torch_pin_memory_path_gbps"]
    results["arena_vs_cuda_host_alloc"] = ratio_ceiling
    results["arena_vs_torch_pin_memory_path"] = ratio_torch
    print(json.dumps(results))
    print(f"pinned arena {results['arena_gbps']:.1f} GB/s = {ratio_ceiling:.0%} of cudaHostAlloc "
          f"memory (target >= 90%), {ratio_torch:.2f}x torch's pin_memory() path (target >= "
          f"1.5x); pageable {results['pageable_gbps']:.1f} GB/s")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
