"""One rank per selected GPU: print CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER, the device this rank
uses and its UUID, match it against `nvidia-smi` (which ignores CUDA_VISIBLE_DEVICES), and run one
NCCL all_reduce. Prints `GPUSEL rank=R ok=True|False ...`; exit 1 when the check fails."""

import os
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def smi() -> dict[str, tuple[str, str]]:
    """nvidia-smi index -> (uuid, pci bus id)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    rows = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            rows[parts[0]] = (parts[1], parts[2])
    return rows


def main() -> int:
    local_rank = int(os.environ["LOCAL_RANK"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = os.environ.get("CUDA_DEVICE_ORDER")
    print(f"GPUENV rank={os.environ['RANK']} CUDA_VISIBLE_DEVICES={visible} CUDA_DEVICE_ORDER={order} "
          f"device_count={torch.cuda.device_count()}", flush=True)
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", timeout=timedelta(seconds=60), device_id=dev)
    props = torch.cuda.get_device_properties(dev)
    uuid = "GPU-" + str(getattr(props, "uuid", "?"))
    x = torch.full((1 << 20,), float(dist.get_rank() + 1), device=dev)
    dist.all_reduce(x)
    n = dist.get_world_size()
    sum_ok = bool((x == n * (n + 1) / 2).all())
    table = smi()
    selected = (visible or "").split(",")[local_rank] if visible else str(local_rank)
    want_uuid, want_bus = table.get(selected, ("?", "?"))
    ok = sum_ok and uuid == want_uuid and visible is not None
    print(f"GPUSEL rank={dist.get_rank()} world={n} ok={ok} cuda:{local_rank}={props.name} uuid={uuid} "
          f"nvidia-smi[{selected}]={want_uuid} bus={want_bus} allreduce_ok={sum_ok} "
          f"backend={dist.get_backend()} nccl={'.'.join(map(str, torch.cuda.nccl.version()))}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
