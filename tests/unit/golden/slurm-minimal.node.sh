#!/bin/bash
set -e
exec sh -c 'P="$1"; command -v "$P" >/dev/null 2>&1 || P=python3; exec "$P" -S -c "$2"' ddpctl-agent python3 'import sys, os, marshal, importlib.machinery as m
b = sys.stdin.buffer
size, key = b.readline().split()
blob = b.read(int(size))
request = b.readline()
tag = sys.implementation.cache_tag
base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ddpctl")
path = os.path.join(base, "agent-%s-%s-%x.bin" % (key.decode(), tag, sys.hexversion))
try:
    from _blake2 import blake2b
except ImportError:
    from hashlib import blake2b
def digest(data):
    return blake2b(data, digest_size=16).hexdigest().encode()
codes, state = None, "absent"
try:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        head, body = f.readline().split(), f.read()
    if not tag or st.st_uid != os.getuid() or st.st_mode & 0o022:
        state = "not trusted: others may write it"
    elif head != [b"ddpctl-agent", key, digest(body)]:
        state = "damaged: its content does not match its hash"
    else:
        blob, codes = marshal.loads(body)
        state = "cached"
        import time
        if st.st_mtime < time.time() - 86400:  # in use: kept when older keys are pruned
            os.utime(path)
except FileNotFoundError:
    pass
except Exception as e:
    state = "unreadable: %s" % e
if not int(size):
    import json
    sys.stdout.write("@@DDPCTL-EVENT@@ %s\n" % json.dumps({"event": "agent", "cached": bool(codes), "state": state}))
    sys.stdout.flush()
    if not codes:
        blob = b.read(int(b.readline()))
srcs = {}
def sources():
    if not srcs:
        import json, zlib
        srcs.update(json.loads(zlib.decompress(blob).decode()))
    return srcs
def compiled(n):
    return marshal.dumps(compile(sources()[n][1], "ddpctl-agent/" + n.replace(".", "/") + ".py", "exec"))
if not codes:
    codes = {}
    try:
        if not tag or sys.flags.dont_write_bytecode:
            raise OSError(0, "")
        os.makedirs(base, mode=0o700, exist_ok=True)
        tmp = "%s.%d" % (path, os.getpid())
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                body = marshal.dumps((blob, {n: (p, compiled(n)) for n, (p, s) in sources().items()}))
                f.write(b"ddpctl-agent %s %s\n" % (key, digest(body)) + body)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        codes = marshal.loads(body)[1]
        state = "written"
        now = os.stat(path).st_mtime
        for old in os.listdir(base):
            try:
                if old.startswith("agent-") and os.stat(os.path.join(base, old)).st_mtime < now - 14 * 86400:
                    os.remove(os.path.join(base, old))
            except OSError:
                pass  # gone meanwhile (another call'"'"'s prune)
    except OSError as e:
        state = "not written: %s" % e.strerror if e.errno else "not kept: no bytecode here (PYTHONDONTWRITEBYTECODE)"
    if not int(size):
        sys.stdout.write("@@DDPCTL-EVENT@@ %s\n" % json.dumps({"event": "agent", "state": state}))
names = codes or sources()
class F:
    def find_spec(self, name, path=None, target=None):
        if name in names:
            return m.ModuleSpec(name, self, is_package=names[name][0])
    def create_module(self, spec):
        return None
    def get_source(self, name):
        return sources()[name][1]
    def exec_module(self, mod):
        if names[mod.__name__][0]:
            mod.__path__ = []
        exec(marshal.loads(codes[mod.__name__][1] if codes else compiled(mod.__name__)), mod.__dict__)
sys.meta_path.insert(0, F())
import node_agent.__main__ as a
sys.exit(a.main(request))
'
