# files/s of list_files(...).map(read_file) locally and in distributed_epoch
# over 2 sluice-worker processes, with --file_split_files 1 (one file per
# split, as before runs) and 0 (automatic runs), in one run.
# Usage: /usr/bin/python3 perf/list_files_splits.py BUILD_DIR [FILES]
import os, subprocess, sys, tempfile, time
sys.path.insert(0, sys.argv[1] + "/python")
import sluice
from sluice import x
build = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
d = tempfile.mkdtemp(prefix="sluice_files_")
for i in range(n):
    with open(f"{d}/f{i:06d}", "wb") as f:
        f.write(os.urandom(64))
pattern = d + "/f*"
def pipeline():
    return sluice.Dataset.list_files(pattern).map(sluice.io.read_file(x))
t = time.time(); c = sum(1 for _ in pipeline()); dt = time.time() - t
print(f"local: {c} files in {dt:.2f} s: {c/dt:,.0f} files/s", flush=True)
for run in ["1", "0"]:
    port_file = d + f"/../disp_{run}.port"
    disp = subprocess.Popen([build + "/tools/sluice-dispatcher", "--port", "0", "--port_file", port_file,
                             "--file_split_files", run], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    while not os.path.exists(port_file) or not open(port_file).read().strip():
        time.sleep(0.05)
    port = open(port_file).read().strip()
    workers = [subprocess.Popen([build + "/tools/sluice-worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0"],
                                stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for _ in range(2)]
    time.sleep(1.0)
    ds = pipeline().distribute("distributed_epoch", f"grpc://127.0.0.1:{port}")
    for epoch in range(2):
        t = time.time(); got = [bytes(e) for e in ds]; dt = time.time() - t
        print(f"distributed_epoch, 2 workers, --file_split_files {run}, epoch {epoch}: {len(got)} files "
              f"({len(set(got))} distinct) in {dt:.2f} s: {len(got)/dt:,.0f} files/s", flush=True)
    for w in workers: w.terminate(); w.wait()
    disp.terminate(); disp.wait()
    os.remove(port_file)
subprocess.run(["rm", "-rf", d])
