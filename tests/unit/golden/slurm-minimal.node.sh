#!/bin/bash
set -e
exec sh -c 'P="$1"; command -v "$P" >/dev/null 2>&1 || P=python3; exec "$P" -c "$2"' ddpctl-agent python3 'import sys, json, zlib, importlib.machinery as m
b = sys.stdin.buffer
srcs = json.loads(zlib.decompress(b.read(int(b.readline()))).decode())
class F:
    def find_spec(self, name, path=None, target=None):
        if name in srcs:
            return m.ModuleSpec(name, self, is_package=srcs[name][0])
    def create_module(self, spec):
        return None
    def get_source(self, name):
        return srcs[name][1]
    def exec_module(self, mod):
        pkg, src = srcs[mod.__name__]
        if pkg:
            mod.__path__ = []
        exec(compile(src, "ddpctl-agent/" + mod.__name__.replace(".", "/") + ".py", "exec"), mod.__dict__)
sys.meta_path.insert(0, F())
import node_agent.__main__ as a
sys.exit(a.main())
'
