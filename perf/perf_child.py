"""What sluice-perf's Python children share (torch_images.py,
torch_transport.py, python_client.py): how a result goes back to the
parent, as one JSON line on stdout and, with --out, in a file."""

import json


def emit(result, out):
    line = json.dumps(result)
    print(line, flush=True)
    if out:
        with open(out, "w") as f:
            f.write(line + "\n")
