#!/usr/bin/env python3
"""Checks deploy/: the Kubernetes manifests and the Slurm script.

  check_deploy.py --deploy DIR --dispatcher BIN --worker BIN
      (a) parses every YAML file under DIR/kubernetes and checks the
          structure of the base (kinds present; the dispatcher StatefulSet
          mounts a volumeClaimTemplate at --work_dir and runs
          --fault_tolerant_mode; worker args name the dispatcher's Service;
          ports agree between args, containerPorts, Services, probes and
          the Prometheus annotation; secrets are mounted where the flags
          point); with kubectl on PATH, also renders the base and the base
          with every component (kubectl kustomize, offline) and checks the
          rendered objects the same way;
      (b) collects every --flag passed to sluice-dispatcher / sluice-worker
          in the manifests, the component patches and the Slurm script's
          *_ARGS arrays, and checks that the binary's --help lists it;
      (c) bash -n (and shellcheck, when installed) on the Slurm scripts.
  check_deploy.py --dispatcher BIN --worker BIN --flags-only BINARY:--FLAG ...
      checks only the given flags (the negative control in ctest).

Exit status 0 when everything holds, 1 otherwise; every failure is printed.
Standard library plus PyYAML (Debian python3-yaml, scripts/install-deps.sh).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    sys.exit("check_deploy: needs PyYAML (apt-get install python3-yaml; scripts/install-deps.sh)")

BINARIES = ("sluice-dispatcher", "sluice-worker")
KIND_TO_BINARY_HINT = {"StatefulSet": "sluice-dispatcher", "Deployment": "sluice-worker"}

failures = []
ROOT = os.getcwd()  # paths in messages are relative to this (the repository root)


def fail(msg):
    failures.append(msg)
    print(f"FAIL: {msg}")


def note(msg):
    print(f"  {msg}")


# ---------------------------------------------------------------- helpers


def parse_args_list(args):
    """['--a', 'x', '--b', '--c=y'] -> {'--a': 'x', '--b': True, '--c': 'y'}."""
    out = {}
    i = 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                out[a] = str(args[i + 1])
                i += 1
            else:
                out[a] = True
        i += 1
    return out


def flags_in(strings):
    """Every --flag token (the part before '=') in a list of strings."""
    found = set()
    for s in strings:
        for m in re.finditer(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)", str(s)):
            found.add(m.group(1))
    return found


def pod_spec(obj):
    return (((obj.get("spec") or {}).get("template") or {}).get("spec")) or {}


def pod_labels(obj):
    return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {})
            .get("labels")) or {}


def pod_annotations(obj):
    return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {})
            .get("annotations")) or {}


def binary_of(container):
    cmd = container.get("command") or []
    return os.path.basename(str(cmd[0])) if cmd else None


def sluice_container(obj, binary):
    for c in pod_spec(obj).get("containers") or []:
        if binary_of(c) == binary:
            return c
    return None


def container_ports(c):
    return {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}


def as_int(v, what):
    try:
        return int(str(v))
    except (TypeError, ValueError):
        fail(f"{what}: '{v}' is not a port number")
        return None


def host_port(value, what):
    if not isinstance(value, str) or ":" not in value:
        fail(f"{what}: '{value}' is not host:port")
        return None, None
    host, port = value.rsplit(":", 1)
    return host, as_int(port, what)


def mount_for_path(obj, c, path):
    """The (volumeMount, volume) whose mountPath contains `path`, or (None, None)."""
    vols = {v.get("name"): v for v in pod_spec(obj).get("volumes") or []}
    best = None
    for m in c.get("volumeMounts") or []:
        mp = str(m.get("mountPath", "")).rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best.get("mountPath", "")):
                best = m
    if best is None:
        return None, None
    return best, vols.get(best.get("name"))


def selects(service, labels):
    sel = (service.get("spec") or {}).get("selector") or {}
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


# ------------------------------------------------------- structural checks


def check_probes(where, c, port):
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe)
        if p is None:
            if probe != "startupProbe":
                fail(f"{where}: no {probe}")
            continue
        handler = p.get("grpc") or p.get("tcpSocket")
        if handler is None:
            fail(f"{where}: {probe} is neither a grpc nor a tcpSocket probe")
            continue
        if as_int(handler.get("port"), f"{where} {probe} port") != port:
            fail(f"{where}: {probe} probes port {handler.get('port')}, the server's --port is {port}")


def check_metrics(where, obj, c, flags):
    if "--metrics_port" not in flags:
        fail(f"{where}: no --metrics_port")
        return
    m = as_int(flags["--metrics_port"], f"{where} --metrics_port")
    if m not in container_ports(c).values():
        fail(f"{where}: --metrics_port {m} is not a containerPort")
    ann = pod_annotations(obj)
    if ann.get("prometheus.io/scrape") != "true":
        fail(f"{where}: pod template lacks prometheus.io/scrape: \"true\"")
    if as_int(ann.get("prometheus.io/port"), f"{where} prometheus.io/port") != m:
        fail(f"{where}: prometheus.io/port is {ann.get('prometheus.io/port')}, --metrics_port is {m}")


def check_secret_file(where, obj, c, flags, flag, secret_names):
    path = flags.get(flag)
    if not isinstance(path, str):
        fail(f"{where}: {flag} has no path")
        return
    mount, vol = mount_for_path(obj, c, path)
    if mount is None:
        fail(f"{where}: {flag} {path} is not under any volumeMount")
        return
    secret = (vol or {}).get("secret")
    if secret is None:
        fail(f"{where}: {flag} {path} is on volume '{mount.get('name')}', which is not a Secret")
        return
    name = secret.get("secretName")
    if secret_names is not None and name not in secret_names:
        fail(f"{where}: {flag} reads Secret '{name}', which neither a Secret nor a "
             f"secretGenerator defines (have: {sorted(secret_names)})")


def check_server(where, obj, c, flags, secret_names, tls_expected):
    """What the dispatcher and the worker share: bind 0.0.0.0, --port is a
    containerPort and the probes' port, metrics, the token and TLS files on
    Secret volumes. Returns --port."""
    if flags.get("--bind_address") != "0.0.0.0":
        fail(f"{where}: --bind_address is {flags.get('--bind_address')}, want 0.0.0.0")
    port = as_int(flags.get("--port"), f"{where} --port")
    ports = container_ports(c)
    if port not in ports.values():
        fail(f"{where}: --port {port} is not a containerPort ({ports})")
    check_probes(where, c, port)
    check_metrics(where, obj, c, flags)
    check_secret_file(where, obj, c, flags, "--auth_token_file", secret_names)
    for f in ("--tls_cert", "--tls_key", "--tls_ca"):
        if tls_expected and f not in flags:
            fail(f"{where}: TLS component applied but no {f}")
        if f in flags:
            check_secret_file(where, obj, c, flags, f, None)
    return port


def check_objects(label, docs, secret_names, tls_expected=False):
    """Structure of one set of objects: the base files, or a rendered build."""
    print(f"structure: {label}")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    for kind in ("StatefulSet", "Deployment", "Service"):
        if not by_kind.get(kind):
            fail(f"{label}: no {kind}")
    services = by_kind.get("Service", [])
    if secret_names is None:
        secret_names = {s["metadata"]["name"] for s in by_kind.get("Secret", [])}

    for obj in by_kind.get("StatefulSet", []) + by_kind.get("Deployment", []):
        sel = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        labels = pod_labels(obj)
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            fail(f"{label}: {obj['kind']} {obj['metadata']['name']}: selector {sel} "
                 f"does not match its pod labels {labels}")

    dispatchers = [o for o in by_kind.get("StatefulSet", [])
                   if sluice_container(o, "sluice-dispatcher")]
    workers = [o for o in by_kind.get("Deployment", []) if sluice_container(o, "sluice-worker")]
    if len(dispatchers) != 1:
        fail(f"{label}: want exactly one StatefulSet running sluice-dispatcher, have {len(dispatchers)}")
    if len(workers) != 1:
        fail(f"{label}: want exactly one Deployment running sluice-worker, have {len(workers)}")

    dispatcher_port = None
    dispatcher_services = []
    for obj in dispatchers:
        name = obj["metadata"]["name"]
        where = f"{label}: StatefulSet {name}"
        spec = obj.get("spec") or {}
        c = sluice_container(obj, "sluice-dispatcher")
        flags = parse_args_list(c.get("args") or [])
        if spec.get("replicas") != 1:
            fail(f"{where}: replicas is {spec.get('replicas')}; the journal allows exactly 1")
        # The journal volume.
        if flags.get("--fault_tolerant_mode") is not True:
            fail(f"{where}: no --fault_tolerant_mode (boolean flag, without a value)")
        work_dir = flags.get("--work_dir")
        vct = {t.get("metadata", {}).get("name") for t in spec.get("volumeClaimTemplates") or []}
        if not vct:
            fail(f"{where}: no volumeClaimTemplates")
        if not isinstance(work_dir, str):
            fail(f"{where}: no --work_dir")
        else:
            mounts = [m for m in c.get("volumeMounts") or []
                      if str(m.get("mountPath", "")).rstrip("/") == work_dir.rstrip("/")]
            if not mounts:
                fail(f"{where}: nothing is mounted at --work_dir {work_dir}")
            elif mounts[0].get("name") not in vct:
                fail(f"{where}: --work_dir {work_dir} is volume '{mounts[0].get('name')}', "
                     f"not a volumeClaimTemplate ({sorted(vct)})")
        # Its governing Service.
        gov = [s for s in services if s["metadata"]["name"] == spec.get("serviceName")]
        if not gov:
            fail(f"{where}: serviceName '{spec.get('serviceName')}' is no Service")
        elif (gov[0].get("spec") or {}).get("clusterIP") != "None":
            fail(f"{where}: serviceName '{spec.get('serviceName')}' is not headless (clusterIP: None)")
        # Ports.
        dispatcher_port = check_server(where, obj, c, flags, secret_names, tls_expected)
        ports = container_ports(c)
        # Services in front of it: every port must reach a containerPort.
        labels = pod_labels(obj)
        dispatcher_services = [s for s in services if selects(s, labels)]
        if not dispatcher_services:
            fail(f"{where}: no Service selects the dispatcher pod")
        for s in dispatcher_services:
            for sp in (s.get("spec") or {}).get("ports") or []:
                tp = sp.get("targetPort", sp.get("port"))
                target = ports.get(tp) if isinstance(tp, str) else tp
                if target not in ports.values():
                    fail(f"{label}: Service {s['metadata']['name']} port {sp.get('port')} targets "
                         f"{tp}, which is no containerPort of the dispatcher")
                sp["_resolved_target"] = target

    for obj in workers:
        where = f"{label}: Deployment {obj['metadata']['name']}"
        c = sluice_container(obj, "sluice-worker")
        flags = parse_args_list(c.get("args") or [])
        ports = container_ports(c)
        port = check_server(where, obj, c, flags, secret_names, tls_expected)
        env = {e.get("name"): e for e in c.get("env") or []}
        pod_ip = ((env.get("POD_IP") or {}).get("valueFrom") or {}).get("fieldRef") or {}
        if pod_ip.get("fieldPath") != "status.podIP":
            fail(f"{where}: env POD_IP is not the downward API's status.podIP")
        # Dispatcher address: a Service in front of the dispatcher, at the
        # Service port that reaches the dispatcher's --port.
        host, dport = host_port(flags.get("--dispatcher"), f"{where} --dispatcher")
        if host is not None:
            svc = [s for s in dispatcher_services if s["metadata"]["name"] == host.split(".")[0]]
            if not svc:
                fail(f"{where}: --dispatcher host '{host}' is not a Service of the dispatcher "
                     f"({[s['metadata']['name'] for s in dispatcher_services]})")
            else:
                sps = [sp for sp in svc[0]["spec"].get("ports") or [] if sp.get("port") == dport]
                if not sps:
                    fail(f"{where}: Service {host} has no port {dport}")
                elif dispatcher_port is not None and sps[0].get("_resolved_target") != dispatcher_port:
                    fail(f"{where}: Service {host} port {dport} reaches "
                         f"{sps[0].get('_resolved_target')}, the dispatcher serves on {dispatcher_port}")
        # Advertised addresses: the pod IP, at the ports the pod exposes.
        _, wport = host_port(flags.get("--worker_address"), f"{where} --worker_address")
        if not str(flags.get("--worker_address", "")).startswith("$(POD_IP):"):
            fail(f"{where}: --worker_address {flags.get('--worker_address')} is not $(POD_IP):port")
        if wport is not None and wport != port:
            fail(f"{where}: --worker_address port {wport} differs from --port {port}")
        if flags.get("--data_transfer_protocol", "ucx") == "ucx":
            dta = flags.get("--data_transfer_address")
            if not str(dta or "").startswith("$(POD_IP):"):
                fail(f"{where}: --data_transfer_address {dta} is not $(POD_IP):port (bound to "
                     "0.0.0.0 the UCX listener would publish 0.0.0.0)")
            else:
                _, uport = host_port(dta, f"{where} --data_transfer_address")
                if uport not in ports.values():
                    fail(f"{where}: --data_transfer_address port {uport} is not a containerPort")
                if uport == port:
                    fail(f"{where}: the UCX listener and gRPC share port {port}")
            if "UCX_TLS" not in env:
                fail(f"{where}: no UCX_TLS in env")


# ------------------------------------------------------------- Kubernetes


def load_yaml_files(kdir):
    """{path: [documents]} for every .yaml/.yml under kdir; parse errors fail."""
    out = {}
    for root, _, files in os.walk(kdir):
        for f in sorted(files):
            if f.endswith((".yaml", ".yml")):
                p = os.path.join(root, f)
                try:
                    with open(p, encoding="utf-8") as fh:
                        out[p] = [d for d in yaml.safe_load_all(fh) if d is not None]
                except yaml.YAMLError as e:
                    fail(f"{p}: not valid YAML: {e}")
    return out


def kustomize_files(files):
    return {p: docs[0] for p, docs in files.items()
            if docs and isinstance(docs[0], dict)
            and docs[0].get("kind") in ("Kustomization", "Component")}


def check_kubernetes(kdir, flag_uses):
    files = load_yaml_files(kdir)
    print(f"parsed {len(files)} YAML files under {kdir}")
    kfiles = kustomize_files(files)
    base_k = kfiles.get(os.path.join(kdir, "kustomization.yaml"))
    if base_k is None:
        fail(f"{kdir}: no kustomization.yaml")
        return

    # Every file a kustomization names exists; the base names every manifest.
    referenced = set()
    for kp, k in kfiles.items():
        d = os.path.dirname(kp)
        for r in (k.get("resources") or []) + (k.get("components") or []):
            p = os.path.normpath(os.path.join(d, r))
            if not os.path.exists(p):
                fail(f"{kp}: names {r}, which does not exist")
            referenced.add(p)
        for patch in k.get("patches") or []:
            if "path" in patch:
                p = os.path.normpath(os.path.join(d, patch["path"]))
                if not os.path.exists(p):
                    fail(f"{kp}: patch {patch['path']} does not exist")
                referenced.add(p)
    for p, docs in files.items():
        if p in kfiles:
            continue
        if p not in referenced:
            fail(f"{p}: no kustomization.yaml uses it")
        for d in docs:
            if isinstance(d, dict) and not (d.get("apiVersion") and d.get("kind")
                                            and (d.get("metadata") or {}).get("name")):
                fail(f"{p}: a document without apiVersion/kind/metadata.name")

    # Components that exist on disk are all offered (commented out or not)
    # in the base kustomization, so users can find them.
    with open(os.path.join(kdir, "kustomization.yaml"), encoding="utf-8") as fh:
        base_text = fh.read()
    comps = sorted(os.path.relpath(os.path.dirname(p), kdir) for p, k in kfiles.items()
                   if k.get("kind") == "Component")
    for comp in comps:
        if comp not in base_text:
            fail(f"{kdir}/kustomization.yaml does not mention component {comp}")

    # The base objects, straight from the files.
    base_docs = []
    for r in base_k.get("resources") or []:
        base_docs += [d for d in files.get(os.path.normpath(os.path.join(kdir, r)), [])
                      if isinstance(d, dict)]
    secret_names = {g.get("name") for g in base_k.get("secretGenerator") or []}
    secret_names |= {d["metadata"]["name"] for d in base_docs if d.get("kind") == "Secret"}
    check_objects("base manifests", base_docs, secret_names)

    # Flags: container args of the base manifests ...
    for p, docs in files.items():
        for d in docs:
            if not isinstance(d, dict):
                continue
            for c in pod_spec(d).get("containers") or []:
                b = binary_of(c)
                if b in BINARIES:
                    for f in flags_in(a for a in c.get("args") or [] if str(a).startswith("--")):
                        flag_uses.setdefault(b, {}).setdefault(f, set()).add(p)
                    for f in flags_in(c.get("command")[1:]):
                        flag_uses.setdefault(b, {}).setdefault(f, set()).add(p)
    # ... and the args component patches add, attributed through the patch
    # target's kind.
    for kp, k in kfiles.items():
        d = os.path.dirname(kp)
        for patch in k.get("patches") or []:
            binary = KIND_TO_BINARY_HINT.get((patch.get("target") or {}).get("kind"))
            if binary is None:
                continue
            if "path" in patch:
                src = os.path.normpath(os.path.join(d, patch["path"]))
                ops = (files.get(src) or [None])[0]
            else:
                src = kp
                ops = yaml.safe_load(patch.get("patch", "")) if patch.get("patch") else None
            if isinstance(ops, list):  # JSON 6902
                for op in ops:
                    if "/args" in str(op.get("path", "")) and str(op.get("value", "")).startswith("--"):
                        for f in flags_in([op["value"]]):
                            flag_uses.setdefault(binary, {}).setdefault(f, set()).add(src)
            elif isinstance(ops, dict):  # strategic merge
                for c in pod_spec(ops).get("containers") or []:
                    for f in flags_in(a for a in c.get("args") or [] if str(a).startswith("--")):
                        flag_uses.setdefault(binary, {}).setdefault(f, set()).add(src)

    render_with_kubectl(kdir, comps)


def render_with_kubectl(kdir, comps):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: kubectl not on PATH: not rendering the kustomization "
              "(no schema validation either; kubeconform/kubectl are not in Debian)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "kubernetes")
        shutil.copytree(kdir, copy)
        with open(os.path.join(copy, "auth-token"), "w", encoding="utf-8") as fh:
            fh.write("test-token\n")
        variants = [("kustomize build: base", [])]
        variants += [(f"kustomize build: base + {c}", [c]) for c in comps]
        variants += [("kustomize build: base + all components", comps)]
        for i, (label, use) in enumerate(variants):
            overlay = os.path.join(tmp, f"overlay{i}")
            os.makedirs(overlay)
            with open(os.path.join(overlay, "kustomization.yaml"), "w", encoding="utf-8") as fh:
                yaml.safe_dump({
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": ["../kubernetes"],
                    "components": [f"../kubernetes/{c}" for c in use],
                }, fh)
            r = subprocess.run([kubectl, "kustomize", overlay], capture_output=True, text=True,
                               timeout=120, check=False)
            if r.returncode != 0:
                fail(f"{label}: kubectl kustomize failed: {r.stderr.strip()}")
                continue
            docs = [d for d in yaml.safe_load_all(r.stdout) if isinstance(d, dict)]
            check_objects(label, docs, None, tls_expected=any("tls" in c for c in use))


# ------------------------------------------------------------------ Slurm


def array_bodies(text, names):
    """Bodies of bash array assignments NAME=( ... ) / NAME+=( ... ),
    balanced over parentheses (bodies may hold $((...)))."""
    out = []
    for m in re.finditer(r"\b(%s)\+?=\(" % "|".join(names), text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        body = "\n".join(line.split("#", 1)[0] if line.lstrip().startswith("#") else line
                         for line in text[m.end():i - 1].splitlines())
        out.append((m.group(1), body))
    return out


def check_slurm(sdir, flag_uses):
    scripts = sorted(os.path.join(sdir, f) for f in os.listdir(sdir)
                     if f.endswith((".sh", ".sbatch")))
    if not scripts:
        fail(f"{sdir}: no .sbatch/.sh scripts")
    for s in scripts:
        r = subprocess.run(["bash", "-n", s], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            fail(f"bash -n {s}: {r.stderr.strip()}")
        else:
            print(f"bash -n {s}: ok")
        if shutil.which("shellcheck"):
            r = subprocess.run(["shellcheck", "-x", s], capture_output=True, text=True, check=False)
            if r.returncode != 0:
                fail(f"shellcheck {s}:\n{r.stdout.strip()}")
            else:
                print(f"shellcheck {s}: ok")
        else:
            print("SKIP: shellcheck not installed")
        with open(s, encoding="utf-8") as fh:
            text = fh.read()
        bodies = array_bodies(text, ["DISPATCHER_ARGS", "WORKER_ARGS", "COMMON_ARGS"])
        owners = {"DISPATCHER_ARGS": ["sluice-dispatcher"], "WORKER_ARGS": ["sluice-worker"],
                  "COMMON_ARGS": list(BINARIES)}
        for name in ("DISPATCHER_ARGS", "WORKER_ARGS"):
            if not any(n == name for n, _ in bodies):
                fail(f"{s}: no {name}=( ... ) array (the test reads the flags from it)")
        for name, body in bodies:
            for f in flags_in([body]):
                for b in owners[name]:
                    flag_uses.setdefault(b, {}).setdefault(f, set()).add(s)
        # Each binary is started with its arrays, and only with them.
        for b, arr in (("sluice-dispatcher", "DISPATCHER_ARGS"), ("sluice-worker", "WORKER_ARGS")):
            calls = [line for line in text.splitlines()
                     if re.search(r"/%s\"?\s" % b, line) and not line.lstrip().startswith("#")]
            if not calls:
                fail(f"{s}: never starts {b}")
            for line in calls:
                rest = re.sub(r'"\$\{(%s|COMMON_ARGS)\[@\]\}"' % arr, "", line.split(b, 1)[1])
                if flags_in([rest]):
                    fail(f"{s}: {b} gets flags outside {arr}/COMMON_ARGS: {line.strip()}")


# ------------------------------------------------------------------ flags


def help_flags(binary_path):
    r = subprocess.run([binary_path, "--help"], capture_output=True, text=True, timeout=30,
                       check=False)
    if r.returncode != 0:
        fail(f"{binary_path} --help exited with {r.returncode}: {r.stderr.strip()}")
        return set()
    flags = set()
    for line in r.stdout.splitlines():
        m = re.match(r"^\s*(?:-\w,)?(--[A-Za-z0-9][A-Za-z0-9_-]*)", line)
        if m:
            flags.add(m.group(1))
    # The parser must see the flags every build has, or it checks nothing.
    for must in ("--help", "--port"):
        if must not in flags:
            fail(f"{binary_path} --help: could not find {must}; is the help format different?")
    return flags


def check_flags(paths, flag_uses):
    for b in BINARIES:
        known = help_flags(paths[b])
        uses = flag_uses.get(b, {})
        print(f"flags of {b}: {len(uses)} used, {len(known)} in --help")
        for f in sorted(uses):
            if f in known:
                note(f"{f}: ok")
            else:
                where = ", ".join(sorted(os.path.relpath(p, ROOT) if p.startswith("/") else p for p in uses[f]))
                fail(f"{b} --help does not list {f} (used in {where})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deploy", help="the deploy/ directory")
    ap.add_argument("--dispatcher", required=True, help="path of sluice-dispatcher")
    ap.add_argument("--worker", required=True, help="path of sluice-worker")
    ap.add_argument("--flags-only", nargs="+", metavar="BINARY:--FLAG",
                    help="check only these flags (e.g. sluice-worker:--port)")
    a = ap.parse_args()
    paths = {"sluice-dispatcher": a.dispatcher, "sluice-worker": a.worker}
    flag_uses = {}
    if a.flags_only:
        for spec in a.flags_only:
            b, _, f = spec.partition(":")
            if b not in BINARIES or not f.startswith("--"):
                sys.exit(f"--flags-only: '{spec}' is not BINARY:--FLAG")
            flag_uses.setdefault(b, {}).setdefault(f, set()).add("--flags-only")
    else:
        if not a.deploy:
            sys.exit("--deploy is required")
        global ROOT
        ROOT = os.path.dirname(os.path.abspath(a.deploy))
        check_kubernetes(os.path.join(a.deploy, "kubernetes"), flag_uses)
        check_slurm(os.path.join(a.deploy, "slurm"), flag_uses)
    check_flags(paths, flag_uses)
    if failures:
        print(f"\n{len(failures)} failure(s)")
        return 1
    print("\nall deploy checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
