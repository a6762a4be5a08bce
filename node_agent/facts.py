"""The "facts" op: everything doctor checks about one host, gathered in one round trip.

Each sub-fact is a command plus a pure parser (node_agent/factparse.py); one that fails records
an error string under result["errors"][name] and never stops the others.
"""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, List, Optional

from node_agent import factparse
from node_agent.protocol import emit_event

CMD_TIMEOUT_S = 10.0
TORCH_TIMEOUT_S = 90.0

# Runs under the inventory's interpreter (which may not be the agent's); constant, no user data.
# argv[1] is a cache directory ("" for none): importing torch costs seconds, so its facts are
# kept under a key of everything they depend on (interpreter, torch files, driver, visible GPUs).
CACHE_KEY_SRC = r"""
import glob, hashlib, importlib.util, json, os, platform, sys, time
def key():
    parts = [sys.executable, platform.python_version(), os.environ.get("CUDA_VISIBLE_DEVICES", "")]
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    root = os.path.dirname(spec.origin)
    for path in [spec.origin, os.path.join(root, "version.py")] + glob.glob(root + "/_C*.so"):
        st = os.stat(path)
        parts.append("%s:%d:%d" % (path, st.st_mtime_ns, st.st_size))
    try:
        with open("/proc/driver/nvidia/version") as f:
            parts.append(f.read())
    except OSError:
        pass
    parts += sorted(glob.glob("/dev/nvidia[0-9]*"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
def cached(cache_dir):
    try:
        k = key() if cache_dir else None
    except Exception:
        k = None
    path = os.path.join(cache_dir, "torch-facts-%s.json" % k) if k else None
    if path and os.path.exists(path) and time.time() - os.path.getmtime(path) < 86400:
        with open(path) as f:
            d = json.load(f)
        d["cached"] = True
        return path, d
    return path, None
"""
TORCH_SNIPPET = CACHE_KEY_SRC + r"""
cache_dir = sys.argv[1] if len(sys.argv) > 1 else ""
path, d = cached(cache_dir)
if d is not None:
    print("@@TORCH@@" + json.dumps(d))
    sys.exit(0)
d = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch
except Exception as e:
    d["importable"] = False
    d["error"] = "%s: %s" % (type(e).__name__, e)
    print("@@TORCH@@" + json.dumps(d))
    sys.exit(0)
d["importable"] = True
d["version"] = torch.__version__
d["cuda"] = torch.version.cuda
try:
    d["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
except Exception:
    d["nccl"] = None
try:
    d["cuda_available"] = torch.cuda.is_available()
    n = torch.cuda.device_count()
    d["device_count"] = n
    d["devices"] = []
    for i in range(n if d["cuda_available"] else 0):
        p = torch.cuda.get_device_properties(i)
        d["devices"].append({"name": p.name, "memory_mib": p.total_memory // 1048576})
except Exception as e:
    d["cuda_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import torch.distributed as dist
    d["nccl_backend"] = dist.is_nccl_available()
    d["gloo_backend"] = dist.is_gloo_available()
except Exception:
    pass
print("@@TORCH@@" + json.dumps(d))
if path and "cuda_error" not in d:
    try:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = "%s.%d" % (path, os.getpid())
        with open(tmp, "w") as f:
            json.dump(d, f)
        os.replace(tmp, path)
    except OSError:
        pass
"""


def cache_dir(req: Dict[str, Any]) -> str:
    """Where torch facts are cached on this host ("" when the request says not to)."""
    if req.get("no_cache"):
        return ""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ddpctl")


def run(argv: List[str], timeout: float = CMD_TIMEOUT_S) -> str:
    """stdout of argv; raises with the command's own error text when it fails."""
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError("%s: command not found" % argv[0])
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(argv), proc.returncode,
                                                 (proc.stderr or proc.stdout).strip()[-300:]))
    return proc.stdout


def fact_python(req: Dict[str, Any]) -> Dict[str, Any]:
    wanted = str(req.get("python") or "python3")
    found = shutil.which(wanted)
    return {"requested": wanted, "found": found, "agent_executable": sys.executable,
            "agent_version": platform.python_version(), "path_env": os.environ.get("PATH", "")}


def cached_in_process(python: str, cache: str) -> Optional[Dict[str, Any]]:
    """When the agent runs under the inventory's interpreter, read the cache without a child."""
    if not cache or os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    namespace: Dict[str, Any] = {}
    exec(compile(CACHE_KEY_SRC, "ddpctl-torch-cache", "exec"), namespace)
    found: Optional[Dict[str, Any]] = namespace["cached"](cache)[1]
    return found


def fact_torch(req: Dict[str, Any]) -> Dict[str, Any]:
    python = shutil.which(str(req.get("python") or "python3"))
    if python is None:
        raise FileNotFoundError("interpreter %s not found" % req.get("python"))
    hit = cached_in_process(python, cache_dir(req))
    if hit is not None:
        return hit
    proc = subprocess.run([python, "-c", TORCH_SNIPPET, cache_dir(req)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=TORCH_TIMEOUT_S, check=False)
    return factparse.parse_torch_output(proc.returncode, proc.stdout, proc.stderr)


def fact_gpus(req: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if shutil.which("nvidia-smi") is None:
        return None
    gpus = factparse.parse_nvidia_gpus(run(["nvidia-smi", "--query-gpu=index,uuid,name,"
                                            "memory.total,memory.used",
                                            "--format=csv,noheader,nounits"]))
    apps = factparse.parse_nvidia_apps(run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,"
                                            "process_name,used_memory",
                                            "--format=csv,noheader,nounits"]))
    return {"gpus": gpus, "apps": apps}


def _sys_class_net() -> List[Dict[str, Any]]:
    out = []
    for path in sorted(Path("/sys/class/net").iterdir()):
        state = (path / "operstate").read_text().strip() if (path / "operstate").exists() else ""
        out.append({"name": path.name, "up": state in ("up", "unknown"), "operstate": state,
                    "loopback": path.name == "lo", "addresses": []})
    return out


def fact_interfaces(req: Dict[str, Any]) -> List[Dict[str, Any]]:
    try:
        return factparse.parse_ip_addr(run(["ip", "-j", "addr"]))
    except (OSError, RuntimeError, ValueError):
        return _sys_class_net()


def fact_resolve(name: str) -> List[Dict[str, str]]:
    seen: List[Dict[str, str]] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP):
        entry = {"family": "inet6" if family == socket.AF_INET6 else "inet",
                 "address": str(sockaddr[0])}
        if entry not in seen:
            seen.append(entry)
    return seen


def fact_routes(addresses: List[Dict[str, str]]) -> Dict[str, Any]:
    """`ip route get` for the first address of each family the master name resolves to."""
    out: Dict[str, Any] = {}
    for family in ("inet", "inet6"):
        first = next((a["address"] for a in addresses if a["family"] == family), None)
        if first is None:
            continue
        try:
            out[first] = factparse.parse_route_get(run(["ip", "-j", "route", "get", first]))
        except (OSError, RuntimeError, ValueError) as exc:
            out[first] = {"error": str(exc)}
    return out


def fact_firewall(req: Dict[str, Any]) -> Dict[str, Any]:
    port = int(req.get("master_port") or 29500)
    out: Dict[str, Any] = {}
    probes: Dict[str, Callable[[], Any]] = {
        "iptables": lambda: factparse.parse_iptables_input(run(["iptables", "-S", "INPUT"]), port),
        "nft": lambda: factparse.parse_nft_ruleset(run(["nft", "list", "ruleset"]), port),
        "ufw": lambda: factparse.parse_ufw_status(run(["ufw", "status", "verbose"])),
    }
    for name, probe in probes.items():
        try:
            out[name] = probe()
        except FileNotFoundError:
            out[name] = None  # the tool is not installed: nothing to report
        except Exception as exc:
            out[name] = {"error": str(exc)}
    return out


def fact_master_port(req: Dict[str, Any]) -> Dict[str, Any]:
    port = int(req["master_port"])
    out: Dict[str, Any] = {"port": port}
    if "_bound_by_probe" in req:  # the probe listener already tried this port
        out["bindable"] = bool(req["_bound_by_probe"])
        out["bind_error"] = req.get("_bind_error")
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
                out["bindable"] = True
            except OSError as exc:
                out["bindable"] = False
                out["bind_error"] = str(exc)
    if out["bindable"]:
        return out
    try:
        from node_agent.ports import find_owners  # lands separately; facts work without it
    except ImportError:
        out["owners"] = None
        return out
    found = find_owners(port, "tcp")
    out["owners"] = (found or {}).get("owners") if isinstance(found, dict) else found
    return out


def fact_script(req: Dict[str, Any]) -> Dict[str, Any]:
    path = Path(str(req["workdir"])) / str(req["script"])
    if not path.is_file():
        return {"path": str(path), "exists": False}
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"path": str(path), "exists": True, "sha256": digest.hexdigest(),
            "size": path.stat().st_size}


def fact_workdir(req: Dict[str, Any]) -> Dict[str, Any]:
    workdir = str(req.get("workdir") or "")
    if not workdir or not os.path.isdir(workdir):
        return {"path": workdir, "exists": False}
    usage = shutil.disk_usage(workdir)
    return {"path": workdir, "exists": True, "free_bytes": usage.free, "total_bytes": usage.total,
            "writable": os.access(workdir, os.W_OK)}


def fact_infiniband(req: Dict[str, Any]) -> List[str]:
    root = Path("/sys/class/infiniband")
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def fact_memlock(req: Dict[str, Any]) -> Dict[str, Optional[int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    return {"soft": None if soft == inf else soft, "hard": None if hard == inf else hard}


def fact_env(req: Dict[str, Any]) -> Dict[str, str]:
    names = set(req.get("env_names") or [])
    prefixes = tuple(req.get("env_prefixes") or ())
    return {k: v for k, v in os.environ.items() if k in names or (prefixes and k.startswith(prefixes))}


def fact_resolution(req: Dict[str, Any]) -> Dict[str, Any]:
    master = fact_resolve(str(req["master_addr"])) if req.get("master_addr") else []
    return {"master": master, "routes": fact_routes(master)}


def fact_hostname_resolution(req: Dict[str, Any]) -> List[Dict[str, str]]:
    return fact_resolve(socket.gethostname())


def sub_facts(req: Dict[str, Any]) -> Dict[str, Callable[[Dict[str, Any]], Any]]:
    table: Dict[str, Callable[[Dict[str, Any]], Any]] = {
        "python": fact_python, "torch": fact_torch, "gpus": fact_gpus,
        "interfaces": fact_interfaces, "firewall": fact_firewall, "workdir": fact_workdir,
        "infiniband": fact_infiniband, "memlock": fact_memlock, "env": fact_env,
        "resolution": fact_resolution, "hostname_resolution": fact_hostname_resolution,
    }
    if req.get("script"):
        table["script"] = fact_script
    if req.get("check_port") and req.get("master_port"):
        table["master_port"] = fact_master_port
    return table


def collect(request: Dict[str, Any], started: float) -> Dict[str, Any]:
    """Run every sub-fact (in parallel threads: the torch import dominates) and collect them."""
    facts: Dict[str, Any] = {"hostname": socket.gethostname()}
    errors: Dict[str, str] = {}
    table = sub_facts(request)
    with ThreadPoolExecutor(max_workers=len(table)) as pool:
        futures = {name: pool.submit(fn, request) for name, fn in table.items()}
        for name, future in futures.items():
            try:
                facts[name] = future.result()
            except Exception as exc:
                errors[name] = "%s: %s" % (type(exc).__name__, exc)
    facts["elapsed_s"] = time.monotonic() - started
    facts["time"] = time.time()
    return {"facts": facts, "errors": errors}


def gather(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """The facts op. With request["probe"] = {"ports": [...], "timeout": s} it first listens on
    those ports (event `listening`), then sends the facts as event `facts`, then serves
    `CONNECT` control lines until stdin EOF (see node_agent/probe.py)."""
    started = time.monotonic()
    spec = request.get("probe")
    if not spec:
        return collect(request, started)
    from node_agent import probe

    sockets, ports = probe.open_listeners([int(p) for p in spec.get("ports") or [0]])
    probe.listening_event(ports)
    master = [p for p in ports if request.get("master_port") and
              p["requested"] == int(request["master_port"])]
    if master:
        request = dict(request, _bound_by_probe=master[0]["port"] is not None,
                       _bind_error=master[0]["error"])
    result = collect(request, started)
    emit_event("facts", **result)
    result["probe"] = probe.serve(sockets, ports, control, float(spec.get("timeout") or 120.0))
    return result
