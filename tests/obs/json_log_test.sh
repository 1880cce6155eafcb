#!/usr/bin/env bash
# sluice-dispatcher and sluice-worker with --log_format json (and the
# dispatcher again through SLUICE_LOG_FORMAT): every line they log is one
# JSON object with time, level, component and message; python3's json
# module parses each.
#   json_log_test.sh DISPATCHER_BIN WORKER_BIN
set -euo pipefail
dispatcher_bin=$1
worker_bin=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice_json_log_XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

wait_for_file() {  # hang guard only
  for _ in $(seq 1 300); do [ -s "$1" ] && return 0; sleep 0.1; done
  echo "timed out waiting for $1"; cat "$dir"/*.log; return 1
}
stop() {  # SIGTERM, then wait (the binaries log "stopping" on the way out)
  kill -TERM "$1"
  for _ in $(seq 1 300); do kill -0 "$1" 2>/dev/null || { wait "$1" || true; return 0; }; sleep 0.1; done
  echo "pid $1 did not exit"; return 1
}

"$dispatcher_bin" --port 0 --port_file "$dir/d.port" --log_format json >"$dir/d.log" 2>&1 &
pids+=($!); dpid=$!
wait_for_file "$dir/d.port"
"$worker_bin" --dispatcher "127.0.0.1:$(cat "$dir/d.port")" --port 0 --port_file "$dir/w.port" \
  --data_transfer_protocol grpc --log_format json >"$dir/w.log" 2>&1 &
pids+=($!); wpid=$!
wait_for_file "$dir/w.port"
stop "$wpid"
stop "$dpid"
SLUICE_LOG_FORMAT=json "$dispatcher_bin" --port 0 --port_file "$dir/e.port" >"$dir/e.log" 2>&1 &
pids+=($!); epid=$!
wait_for_file "$dir/e.port"
stop "$epid"

python3 - "$dir/d.log" sluice-dispatcher "$dir/w.log" sluice-worker "$dir/e.log" sluice-dispatcher <<'PY'
import json, sys
args = sys.argv[1:]
for path, component in zip(args[0::2], args[1::2]):
    lines = open(path, encoding="utf-8").read().splitlines()
    assert lines, f"{path}: no log lines"
    for line in lines:
        obj = json.loads(line)  # raises on a line that is not one JSON object
        assert isinstance(obj, dict), line
        for key in ("time", "level", "component", "message"):
            assert key in obj, f"{path}: no {key!r} in {line}"
        assert obj["component"] == component, line
        assert obj["time"].endswith("Z"), line
    messages = [json.loads(l)["message"] for l in lines]
    assert any("serving" in m for m in messages), f"{path}: no 'serving' line in {messages}"
    print(f"{path}: {len(lines)} JSON lines")
PY
