#!/usr/bin/env bash
# ddpctl on one local GPU (no network, no sshd): wheels -> ddpctl -> doctor (+ --bandwidth) ->
# `ddpctl up` of a gpus = [0] selection check and of the image classifier (nccl, bf16).
# Every step runs whatever the earlier ones did, each under its own timeout, all within BUDGET_S.
# Everything goes to $OUT/gpu.log; stdout gets the step markers and the final block only.
# Usage (repo root): OUT=/some/dir bash bench/gpu/check.sh
set -u

START=$(date +%s)
BUDGET_S=${BUDGET_S:-300}          # whole script, wall seconds (the device allows ~6 min; a timed-out step may overrun by 30 s)
RESERVE_S=25                       # kept for collecting the results, whatever the steps took
DEADLINE=$((START + BUDGET_S - RESERVE_S))
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-/tmp/gpuout}
mkdir -p "$OUT"
LOG=$OUT/gpu.log
: > "$LOG"
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
RUNS=${RUNS:-/tmp/gpuruns}
WHL=${WHL:-.gpu/whl}                    # the wheels (cp312, manylinux x86-64)
BIN=/tmp/ddpctl-bin
STATUS=()

export PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1
export COLUMNS=160                 # rich tables in the log: wide, not wrapped at 80
export NO_COLOR=1
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$BIN:$PATH"

log() { echo "$*" >> "$LOG"; }
say() { echo "$*" | tee -a "$LOG"; }

# step NAME TIMEOUT_S 'shell command'   (its output goes to the log only)
step() {
    local name=$1 t=$2 cmd=$3 now left rc s e
    now=$(date +%s); left=$((DEADLINE - now))
    if (( left < 8 )); then
        say "=== $name: SKIPPED (time budget of ${BUDGET_S}s spent)"
        STATUS+=("$name: skipped")
        return 0
    fi
    (( t > left )) && t=$left
    say "=== $name (timeout ${t}s) ==="
    log "\$ $cmd"
    s=$(date +%s.%N)
    # its own process group (setsid: pid = pgid), so that on a timeout the whole step gets SIGTERM
    # (ddpctl up then stops its job on every host), SIGKILL 15 s later, and nothing of it outlives it
    setsid bash -c "$cmd" >> "$LOG" 2>&1 < /dev/null &
    local pid=$! now end=$(( $(date +%s) + t )) timed_out=0 kill_at=0
    while kill -0 "$pid" 2>/dev/null; do
        now=$(date +%s)
        if (( !timed_out && now >= end )); then
            timed_out=1; kill_at=$((now + 15)); kill -TERM -- "-$pid" 2>/dev/null
        elif (( timed_out && now >= kill_at )); then
            kill -KILL -- "-$pid" 2>/dev/null; log "(SIGKILL to $name)"
        fi
        sleep 0.5
    done
    wait "$pid"; rc=$?
    (( timed_out )) && rc=124
    local k=0
    while kill -0 -- "-$pid" 2>/dev/null; do     # what is left of its group: a stopping ddpctl
        (( k++ >= 30 )) && { kill -KILL -- "-$pid" 2>/dev/null; log "(killed what was left of $name)"; break; }
        sleep 0.5
    done
    e=$(date +%s.%N)
    local dur; dur=$(awk -v a="$s" -v b="$e" 'BEGIN{printf "%.1f", b-a}')
    local note=""
    (( timed_out )) && note=" TIMED OUT"
    say "=== $name: rc=$rc ${dur}s$note"
    STATUS+=("$name: rc=$rc ${dur}s$note")
    return 0
}

say "=== ddpctl GPU check: $(date -u +%FT%TZ) on $(uname -n), repo $REPO, OUT $OUT"

# --- 1. wheels into $SITE, ddpctl wrapper -------------------------------------------------------
step env 30 '
  uname -a; cat /etc/os-release 2>/dev/null | head -3; nproc; free -g | head -2; df -h /tmp | tail -1
  for c in nvidia-smi ip ss py-spy tar timeout; do printf "%s: %s\n" $c "$(command -v $c || echo MISSING)"; done
  command -v '"$PY"'; '"$PY"' --version; '"$PY"' -m pip --version
  ls '"$WHL"'; rm -rf '"$RUNS"'; echo "cleared '"$RUNS"'"'

step install-wheels 120 '
  rm -rf '"$SITE"' && mkdir -p '"$SITE"'
  if '"$PY"' -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --target '"$SITE"' '"$WHL"'/*.whl; then
      echo "pip install --target: ok"
  else
      echo "pip install failed (rc=$?): unpacking the wheels with zipfile instead (none has a .data dir)"
      rm -rf '"$SITE"' && mkdir -p '"$SITE"'
      '"$PY"' -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]; print(\"unpacked\", len(sys.argv) - 2, \"wheels\")" '"$SITE"' '"$WHL"'/*.whl
  fi
  ls '"$SITE"' | grep -c dist-info'

mkdir -p "$BIN"
cat > "$BIN/ddpctl" <<EOF
#!/bin/sh
# pyproject: [project.scripts] ddpctl = "orchestrator.cli:main"; orchestrator/__main__.py calls it
export PYTHONPATH="$PYTHONPATH"
exec $PY -m orchestrator "\$@"
EOF
chmod +x "$BIN/ddpctl"

step imports 60 '
  '"$PY"' - <<PYEOF
import importlib.metadata as md, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("fabric", "invoke", "paramiko", "cryptography", "bcrypt", "pynacl", "cffi", "typer", "rich",
             "psutil", "pathspec", "wrapt", "deprecated", "decorator", "numpy", "torch", "nvidia-ml-py"):
    try:
        print(f"{name:14} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name:14} MISSING")
import fabric, paramiko, typer, rich, psutil, pathspec  # what the control plane imports
print("fabric/paramiko from", fabric.__file__, paramiko.__file__)
PYEOF
  command -v ddpctl && ddpctl --version'

# --- 2. the GPU as torch sees it ---------------------------------------------------------------
step gpu-info 90 '
  nvidia-smi
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,driver_version --format=csv
  '"$PY"' -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0), torch.cuda.nccl.version(), torch.distributed.is_nccl_available())"'

# --- 3. doctor on the GPU job (gpus = [0], nproc "gpu") ------------------------------------------
step dryrun-image 30 "ddpctl up bench/gpu/image-gpu.toml --dry-run --runs-dir $RUNS"
step doctor-image 90 "ddpctl doctor bench/gpu/image-gpu.toml"
step doctor-image-json 90 "ddpctl doctor bench/gpu/image-gpu.toml --json > $OUT/doctor.json; rc=\$?; head -c 3000 $OUT/doctor.json; echo; exit \$rc"

# --- 4. the image classifier on GPU 0 through `ddpctl up` (nccl, bf16) ---------------------------
# (if the pre-launch checks stop it, it runs again with --no-checks, to see whether they were right)
step up-image 200 "ddpctl up bench/gpu/image-gpu.toml --runs-dir $RUNS --hang-timeout 120 --on-hang stop 2>&1 | tee /tmp/up-image.out
rc=\${PIPESTATUS[0]}
if [ \$rc -ne 0 ] && grep -q 'pre-launch checks found errors' /tmp/up-image.out; then
  echo '--- RETRY with --no-checks'
  ddpctl up bench/gpu/image-gpu.toml --runs-dir $RUNS --hang-timeout 120 --on-hang stop --no-checks; echo \"(retry rc=\$?)\"
fi
exit \$rc"

# --- 5. gpus = [0]: what the rank sees, against nvidia-smi; one NCCL all_reduce ------------------
step up-showgpu 90 "ddpctl up bench/gpu/showgpu.toml --runs-dir $RUNS --nccl-debug --hang-timeout 60 --on-hang stop"

# --- 6. doctor --bandwidth (one host, one GPU: world size 1, so busbw = 0 by definition) ---------
step doctor-bandwidth 150 "ddpctl doctor bench/gpu/image-gpu.toml --bandwidth --max-bytes 256M --runs-dir $RUNS --json > $OUT/bandwidth.json; rc=\$?; $PY - $OUT/bandwidth.json <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f'no bandwidth json: {e}')
bw = d.get('bandwidth')
for f in d.get('findings', []):
    if f.get('check') == 'bandwidth':
        print('finding:', json.dumps(f)[:600])
if not bw:
    sys.exit('no bandwidth table in the doctor json')
print(f\"all_reduce {bw['backend']} {bw['device']} world_size={bw['world_size']}\")
for r in bw['results']:
    print(f\"{r['size_bytes']:>12} B {r['time_us']:>10.1f} us algbw {r['algbw_gbps']:8.2f} GB/s busbw {r['busbw_gbps']:8.3f} GB/s\")
PYEOF
exit \$rc"

step up-allreduce-fallback 90 "if $PY -c 'import json,sys; sys.exit(0 if (json.load(open(sys.argv[1])).get(\"bandwidth\") or {}).get(\"results\") else 1)' $OUT/bandwidth.json 2>/dev/null; then
  echo 'doctor --bandwidth gave its table: fallback not needed'
else
  ddpctl up bench/gpu/allreduce-gpu.toml --runs-dir $RUNS --no-checks --hang-timeout 60 --on-hang stop
fi"

# --- 7. more doctor: absent GPU selected (must fail, naming GPU 1); no inventory; no job ---------
step doctor-gpu1-negative 60 "ddpctl doctor bench/gpu/image-gpu1.toml; rc=\$?; echo \"(rc=\$rc; expected: 1, with a gpu finding naming GPU 1)\"; exit \$rc"
step doctor-local-auto 60 "ddpctl doctor bench/gpu/image-local.toml"
step doctor-plain 60 "ddpctl doctor"

# --- 8. collect: summaries (one file), run logs (one tarball) --------------------------------------
DEADLINE=$((START + BUDGET_S))
step collect 20 "$PY - $RUNS $OUT/summaries.json <<'PYEOF'
import json, pathlib, sys
runs, out = pathlib.Path(sys.argv[1]), sys.argv[2]
found = {}
for p in sorted(runs.glob('*/summary.json')):
    try:
        found[p.parent.name] = json.loads(p.read_text())
    except Exception as e:
        found[p.parent.name] = {'unreadable': str(e)}
json.dump(found, open(out, 'w'), indent=1)
print('summaries:', ', '.join(found) or 'none')
PYEOF
# the runs' logs here and the node state (~/.ddpctl/runs/<job id>: rank logs, NCCL logs) of these runs only
ids=\$(ls $RUNS 2>/dev/null); state=\$HOME/.ddpctl/runs
tar -czf $OUT/runs.tgz --exclude='*.pt' $RUNS \$(for i in \$ids; do [ -d \$state/\$i ] && echo \$state/\$i; done) 2>&1 | grep -v 'Removing leading'
ls -la $OUT"

# --- 9. the key figures -----------------------------------------------------------------------
{
echo
echo "=================== KEY FIGURES ==================="
printf '%s\n' "${STATUS[@]}"
echo "--- gpu"
grep -m2 -E '^[0-9]+\.[0-9]+\.[0-9]+.*(True|False)|^0, ' "$LOG" || echo "(no torch/GPU line)"
echo "--- doctor (image-gpu.toml): checks table row + errors/warnings"
"$PY" - "$OUT/doctor.json" <<'PYEOF' 2>&1 | head -20
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"(no doctor json: {e})")
print("exit_code", d.get("exit_code"), "summary", d.get("summary"))
for h, row in (d.get("table") or {}).items():
    print(" ", h, " ".join(f"{c}={v}" for c, v in row.items()))
for f in d.get("findings", []):
    if f.get("status") in ("fail", "warn"):
        print(f"  {f['status']} {f['check']} {f['host']}: {f['message']}"[:300])
PYEOF
echo "--- image classifier"
grep -E 'data=synthetic|epoch=[0-9]+ loss=|final acc=|rank=0 local_rank=|ddpctl: job image_gpu' "$LOG" | sed 's/^/  /' | tail -11
echo "--- gpus = [0] selection"
grep -E 'GPUENV|GPUSEL|NCCL network|ddpctl: job showgpu' "$LOG" | sed 's/^/  /' | tail -5
echo "--- bandwidth (world size 1)"
grep -E '^all_reduce (nccl|gloo)|^ *268435456 B|^ *67108864 B|^finding:|# all_reduce |^\[gpuhost:0\] +268435456 |# avg busbw' "$LOG" | sed 's/^/  /' | tail -6
echo "--- negative gpus = [1]"
awk '/=== doctor-gpu1-negative \(/{f=1} /=== doctor-gpu1-negative: rc/{f=0} f' "$LOG" | grep -v '^\$' | grep -E 'GPU 1|✗|rc=' | head -4 | cut -c1-240
echo "total $(( $(date +%s) - START ))s; log $LOG; files: $(ls "$OUT" | tr '\n' ' ')"
} 2>&1 | tee -a "$LOG"
exit 0
