#!/usr/bin/python3
"""Fails when an #include points against sluice's module order.

    core <- dataset <- rpc <- control / dataplane / topology <- worker / client
         <- python / tools / perf / examples

A module may include its own headers and those of the modules below it;
modules on one level (control, dataplane, topology; worker, client) do not
include each other. Headers are named from the source root, as
"sluice/<module>/..." or, for generated protobuf code, "<module>/x.pb.h".
tests/ and fuzz/ may include anything. docs/building.md states the order.

    scripts/check_modules.py [--root DIR]

Prints one line per include against the order (file:line: what) and exits 1
if there is any, else prints a summary and exits 0.
"""
import argparse
import os
import re
import sys

# Each module and the modules it may include (besides itself).
BELOW = {
    "core": set(),
    "dataset": {"core"},
    "rpc": {"core", "dataset"},
    "control": {"core", "dataset", "rpc"},
    "dataplane": {"core", "dataset", "rpc"},
    "topology": {"core"},
    "worker": {"core", "dataset", "rpc", "dataplane", "topology"},
    "client": {"core", "dataset", "rpc", "dataplane", "topology"},
}
TOP = {"python", "tools", "perf", "examples"}
for top in TOP:
    BELOW[top] = set(BELOW) - TOP
MODULES = set(BELOW)
# Headers private to their module: the dispatcher's state machine and its
# parts are reached through control/dispatch_server.h.
PRIVATE = {"control/dispatcher_impl.h", "control/dispatcher_state.h",
           "control/split_provider.h", "control/shard_claims.h",
           "control/coordinated_rounds.h", "control/iteration_versions.h",
           "control/journal_committer.h", "control/request_checks.h",
           "control/task_policy.h", "control/liveness.h"}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?:sluice/)?([a-z_]+)/[^>"]*[>"]')
SOURCES = (".h", ".cc", ".cu", ".cpp", ".hpp")


def check(root):
    violations, files = [], 0
    for module in sorted(MODULES):
        top_dir = os.path.join(root, module)
        for dirpath, _, names in os.walk(top_dir):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, name)
                files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in MODULES:
                            continue
                        target = m.group(1)
                        rel = os.path.relpath(path, root)
                        header = re.sub(r'^.*?[<"](?:sluice/)?', "", line.strip()).rstrip('>"')
                        if target != module and target not in BELOW[module]:
                            allowed = ", ".join(sorted(BELOW[module]))
                            violations.append(
                                f"{rel}:{lineno}: {module}/ includes {target}/ ({header}); "
                                + (f"{module}/ may include only {allowed}" if allowed
                                   else f"{module}/ includes no other module"))
                        elif header in PRIVATE and target != module:
                            violations.append(
                                f"{rel}:{lineno}: {header} is private to {target}/")
    return violations, files


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    violations, files = check(os.path.abspath(args.root))
    for v in violations:
        print(v)
    if violations:
        print(f"module order: {len(violations)} include(s) against the order "
              "(docs/building.md, Targets)")
        return 1
    if files == 0:
        print(f"module order: no sources under {args.root}")
        return 1
    print(f"module order: {files} files, every include follows the order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
