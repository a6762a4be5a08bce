#!/bin/bash
set -e
exec sh -c 'P="$1"; command -v "$P" >/dev/null 2>&1 || P=python3; exec "$P" -S -c "$2"' ddpctl-agent python3 'import sys, os, json, zlib, marshal, importlib.machinery as m
b = sys.stdin.buffer
size, key = b.readline().split()
blob = b.read(int(size))
srcs = {}
def sources():
    if not srcs:
        srcs.update(json.loads(zlib.decompress(blob).decode()))
    return srcs
tag = sys.implementation.cache_tag
base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ddpctl")
build = "-%s-%x.bin" % (tag, sys.hexversion)
mine = "agent-" + key.decode() + build
codes = None
try:
    st = os.stat(os.path.join(base, mine))
    if tag and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        with open(os.path.join(base, mine), "rb") as f:
            codes = marshal.load(f)
        if not all(type(v) is tuple and len(v) == 2 and type(v[1]) is bytes for v in codes.values()):
            codes = None
except Exception:
    codes = None
def compiled(n):
    return compile(sources()[n][1], "ddpctl-agent/" + n.replace(".", "/") + ".py", "exec")
if not isinstance(codes, dict):
    codes = {}
    if tag and not sys.flags.dont_write_bytecode:
        try:
            os.makedirs(base, mode=0o700, exist_ok=True)
            tmp = os.path.join(base, "%s.%d" % (mine, os.getpid()))
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                marshal.dump({n: (p, marshal.dumps(compiled(n))) for n, (p, s) in sources().items()}, f)
            os.replace(tmp, os.path.join(base, mine))
            for old in os.listdir(base):
                if old.startswith("agent-") and old.endswith(build) and old != mine:
                    os.remove(os.path.join(base, old))
        except OSError:
            pass
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
        exec(marshal.loads(codes[mod.__name__][1]) if codes else compiled(mod.__name__), mod.__dict__)
sys.meta_path.insert(0, F())
import node_agent.__main__ as a
sys.exit(a.main())
'
