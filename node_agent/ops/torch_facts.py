"""The torch sub-facts: torch / CUDA / NCCL versions and devices, read by the inventory's interpreter
(which may not be the agent's) and cached on the host under an exact key; and, for a launch, only
whether that interpreter finds torch, a module lookup that imports nothing. The same lookup tells
doctor whether that interpreter finds ddpctl (`up --detach` with restarts runs it there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from node_agent.host import factparse
from node_agent.host.sitedirs import add_site_packages

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Optional

TORCH_TIMEOUT_S = 90.0
LOOKUP_TIMEOUT_S = 30.0
LOOKUP_MARK = "@@MODULE_LOOKUP@@"
# Runs under the inventory's interpreter, started with site and its .pth files (for torch, the
# launch's way: with the job's PYTHON* variables too): where the module named by argv[1] (data,
# never code) would come from, found without importing it; a dotted name imports its parent
# packages (find_spec does). A missing parent is "not found"; a parent that fails to import is
# not found, with the error.
LOOKUP_SNIPPET = r"""
import importlib.util, json, sys
name = sys.argv[1]
d = {"found": False, "origin": None, "executable": sys.executable}
try:
    spec = importlib.util.find_spec(name)
except Exception as e:
    spec = None
    missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if not (missing and (name == missing or name.startswith(missing + "."))):
        d["error"] = "%s: %s" % (type(e).__name__, e)
if spec is not None:
    d["found"] = True
    d["origin"] = spec.origin
print("@@MODULE_LOOKUP@@" + json.dumps(d))
"""
DDPCTL_MODULE = "orchestrator.cli"  # what `python -m orchestrator up` (a detached job's restarts) needs

# Runs under the inventory's interpreter (which may not be the agent's); constant, no user data.
# argv[1] is a cache directory ("" for none): importing torch costs seconds, so its facts are
# kept under a key of everything they depend on (interpreter, torch files, driver, visible GPUs).
CACHE_KEY_SRC = r"""
import json, os, sys, time, zlib
from importlib.machinery import PathFinder
def key():
    # Read on every host of every doctor run: no hashlib, glob or importlib.util (their imports
    # cost more than the rest of this). crc32 + adler32 is a cache name, not a security check.
    parts = [sys.executable, sys.version.split()[0], os.environ.get("CUDA_VISIBLE_DEVICES", "")]
    spec = PathFinder.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    root = os.path.dirname(spec.origin)
    libs = sorted(os.path.join(root, n) for n in os.listdir(root)
                  if n.startswith("_C") and n.endswith(".so"))
    for path in [spec.origin, os.path.join(root, "version.py")] + libs:
        st = os.stat(path)
        parts.append("%s:%d:%d" % (path, st.st_mtime_ns, st.st_size))
    try:
        with open("/proc/driver/nvidia/version") as f:
            parts.append(f.read())
    except OSError:
        pass
    parts += sorted("/dev/" + n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:7].isdigit())
    data = "\n".join(parts).encode()
    return "%08x%08x" % (zlib.crc32(data), zlib.adler32(data))
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
d = {"python": sys.version.split()[0], "executable": sys.executable}
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


def cached_in_process(python: str, cache: str) -> Optional[Dict[str, Any]]:
    """When the agent runs under the inventory's interpreter, read the cache without a child."""
    if not cache or os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    add_site_packages()  # where torch is found, as the interpreter's own start-up would look
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


def find_torch_here() -> Optional[str]:
    """Where this process finds torch (site-packages added as site would, .pth files not run), or
    None; a path lookup that imports nothing."""
    from importlib.machinery import PathFinder

    add_site_packages()
    spec = PathFinder.find_spec("torch")
    return (spec.origin or "(namespace package)") if spec is not None else None


def fact_torch_lookup(req: Dict[str, Any]) -> Dict[str, Any]:
    """Whether the inventory's interpreter finds torch, imported by no one (a launch asks: importing
    torch costs seconds). This process answers where it is that interpreter, the job sets no PYTHON*
    variable and torch is found; else the interpreter itself, started with the job's PYTHON*
    variables, looks it up (a virtualenv's .pth files may add the path this process does not see)."""
    python = shutil.which(str(req.get("python") or "python3"))
    if python is None:
        raise FileNotFoundError("interpreter %s not found" % req.get("python"))
    import_env = {str(k): str(v) for k, v in (req.get("import_env") or {}).items()}
    if not import_env and os.path.abspath(python) == os.path.abspath(sys.executable):
        origin = find_torch_here()
        if origin is not None:
            return {"found": True, "origin": origin, "executable": python}
    found = lookup_module(python, "torch", import_env)
    if found.get("error"):  # the lookup itself failed: doctor's python check says so
        raise RuntimeError(str(found["error"]))
    return found


def lookup_module(python: str, module: str, import_env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Ask `python` (started in this process's cwd and environment, plus `import_env`) whether it
    finds `module`: {found, origin, executable, error where a parent package failed to import}.
    RuntimeError when the interpreter says nothing (it crashed, or is no Python)."""
    env = dict(os.environ)
    env.update(import_env or {})
    proc = subprocess.run([python, "-c", LOOKUP_SNIPPET, module], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=LOOKUP_TIMEOUT_S,
                          env=env, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(LOOKUP_MARK):
            found: Dict[str, Any] = json.loads(line[len(LOOKUP_MARK):])
            return found
    err = (proc.stderr or proc.stdout).strip().splitlines()
    raise RuntimeError("%s exited %d: %s" % (python, proc.returncode, err[-1] if err else "no output"))


def fact_ddpctl_lookup(req: Dict[str, Any]) -> Dict[str, Any]:
    """Whether the inventory's interpreter finds ddpctl's CLI (`orchestrator.cli`), as `up --detach`
    with restarts checks before it runs `python -m orchestrator up` here (a job's restarts run
    from its first host): the interpreter itself, in this agent's cwd and environment (those of a
    non-interactive SSH command, as that check's), without the job's variables (the check does
    not set them either). Doctor asks it only for a job with restarts (req["ddpctl_lookup"])."""
    python = shutil.which(str(req.get("python") or "python3"))
    if python is None:
        raise FileNotFoundError("interpreter %s not found" % req.get("python"))
    return lookup_module(python, DDPCTL_MODULE)
