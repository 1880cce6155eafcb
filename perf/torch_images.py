#!/usr/bin/python3
"""The torch side of `sluice-perf images` (perf/images.cc, docs/perf.md).

torchvision's ImageFolder with the ImageNet training transforms, read by a
DataLoader with `--num_workers` worker processes, as the sluice rows: a
warm-up pass over the corpus, then a timed pass (a fresh iterator read to
the end and deleted, repeated until --min_seconds). torch's defaults are left as they are (intra-op
threads, fork start method, prefetch_factor 2) and reported.

With --webdataset DIR the same images are read from the WebDataset shards
DIR/shard-*.tar (<key>.jpg, <key>.cls) the way the webdataset library reads
them: an IterableDataset streams each shard with the standard library's
tarfile, groups consecutive members by key and decodes with PIL; the shards
are divided between the DataLoader workers (worker i reads every
num_workers-th shard).

Prints one JSON line (and writes it to --out):
  images, batches, passes, seconds   the timed passes
  cpu_seconds                    cpu_self_seconds + cpu_children_seconds
  cpu_self_seconds               RUSAGE_SELF user+sys over the timed pass
  cpu_children_seconds           RUSAGE_CHILDREN user+sys over the timed pass:
                                 the DataLoader workers, which are reaped
                                 (persistent_workers=False) before it is read
  peak_rss_bytes                 main_peak_rss_bytes + workers_peak_rss_bytes
  main_peak_rss_bytes            RUSAGE_SELF ru_maxrss
  workers_peak_rss_bytes         the sum of the timed pass's workers' VmHWM,
                                 read from /proc after each batch
  children_max_rss_bytes         RUSAGE_CHILDREN ru_maxrss (the largest child)
  torch, torchvision, torch_threads, num_workers
Exits with status 3 (and {"error": "import", "message": ...}) when torch or
torchvision cannot be imported, so that sluice-perf skips the torch rows.
"""
import argparse
import gc
import glob
import io
import os
import resource
import sys
import time

from perf_child import emit  # beside this script

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
TORCH_MISSING_EXIT = 3


def cpu_seconds(who):
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def vm_hwm_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tar_samples(path):
    """The samples of one shard, streamed: {field: bytes} per key, in order."""
    import tarfile
    key, sample = None, {}
    with tarfile.open(path, "r|*") as tar:
        for m in tar:
            if not m.isreg():
                continue
            base = os.path.basename(m.name)
            dot = base.find(".")
            if dot <= 0:
                continue
            k = m.name[:len(m.name) - len(base) + dot]
            if k != key and sample:
                yield sample
                sample = {}
            key = k
            sample[base[dot + 1:].lower()] = tar.extractfile(m).read()
    if sample:
        yield sample


def webdataset_images(shards_dir, transform):
    import torch
    from PIL import Image

    class Shards(torch.utils.data.IterableDataset):
        def __init__(self):
            self.shards = sorted(glob.glob(os.path.join(shards_dir, "shard-*.tar")))

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            mine = self.shards if info is None else self.shards[info.id::info.num_workers]
            for path in mine:
                for s in tar_samples(path):
                    img = Image.open(io.BytesIO(s["jpg"])).convert("RGB")
                    yield transform(img), int(s["cls"])

    return Shards()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="the image folder (root/<class>/<image>)")
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--min_seconds", type=float, default=0,
                   help="repeat whole timed passes until this long (at least one)")
    p.add_argument("--out", help="also write the JSON line here")
    p.add_argument("--webdataset", help="read DIR/shard-*.tar (jpg, cls) instead of --root")
    a = p.parse_args()
    try:
        import torch
        import torchvision
        from torch.utils.data import DataLoader
        from torchvision import datasets, transforms
    except Exception as e:  # ImportError, or a broken install's own error
        emit({"error": "import", "message": f"{type(e).__name__}: {e}"}, a.out)
        return TORCH_MISSING_EXIT

    torch.manual_seed(a.seed)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])
    if a.webdataset:
        dataset = webdataset_images(a.webdataset, transform)
    else:
        dataset = datasets.ImageFolder(a.root, transform=transform)
    loader = DataLoader(dataset, batch_size=a.batch, num_workers=a.num_workers, shuffle=False,
                        persistent_workers=False)

    def one_pass():
        """A fresh iterator read to the end; returns images, batches, the workers' VmHWM sum."""
        it = iter(loader)
        workers = [w.pid for w in getattr(it, "_workers", [])]
        images = batches = 0
        hwm = {}
        for x, _ in it:
            images += x.shape[0]
            batches += 1
            for pid in workers:  # VmHWM only grows; the last reading is the peak so far
                hwm[pid] = max(hwm.get(pid, 0), vm_hwm_bytes(pid))
        # Exhausting the iterator shut its workers down and joined (reaped)
        # them; deleting it makes sure before RUSAGE_CHILDREN is read.
        del it
        gc.collect()
        return images, batches, sum(hwm.values())

    one_pass()  # warm-up: page cache, imports inside the transforms, allocator
    self0, children0 = cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    images = batches = passes = workers_hwm = 0
    while True:
        i, b, hwm = one_pass()
        images, batches, passes = images + i, batches + b, passes + 1
        workers_hwm = max(workers_hwm, hwm)  # each pass has its own workers
        seconds = time.perf_counter() - t0
        if seconds >= a.min_seconds:
            break
    self_cpu = cpu_seconds(resource.RUSAGE_SELF) - self0
    children_cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - children0
    main_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children_max_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if a.num_workers > 0 and workers_hwm == 0:
        # /proc unreadable: every worker counted at the largest child's peak.
        workers_hwm = a.num_workers * children_max_rss
    emit({
        "images": images,
        "batches": batches,
        "passes": passes,
        "seconds": seconds,
        "cpu_seconds": self_cpu + children_cpu,
        "cpu_self_seconds": self_cpu,
        "cpu_children_seconds": children_cpu,
        "peak_rss_bytes": main_rss + workers_hwm,
        "main_peak_rss_bytes": main_rss,
        "workers_peak_rss_bytes": workers_hwm,
        "children_max_rss_bytes": children_max_rss,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "torch_threads": torch.get_num_threads(),
        "num_workers": a.num_workers,
    }, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
