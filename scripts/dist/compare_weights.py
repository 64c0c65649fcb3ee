"""compare_weights.py A B [TOL]: the largest per-tensor relative difference ||a - b|| / ||b|| between the
latest checkpoints of two run directories; exits 1 above TOL (default 1e-6). Used by the multi-node and
SLURM checks to compare a distributed run with one process on the same global batch."""
import json
import struct
import sys
from pathlib import Path

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def load_safetensors(path):
    """The file's tensors, read with torch alone (the checks need no package beyond the wheel's torch)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        data = bytearray(raw[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(data, dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).double()
    return out


def weights(run):
    ckpts = Path(run) / "checkpoints"
    name = (ckpts / "latest").read_text().strip()
    return load_safetensors(ckpts / name / "model.safetensors")


a, b = weights(sys.argv[1]), weights(sys.argv[2])
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-6
if a.keys() != b.keys():
    sys.exit(f"compare_weights: error: the runs hold different tensors: {sorted(a.keys() ^ b.keys())[:5]}")
worst, where = max((((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-30)).item(), k) for k in b)
print(f"compare_weights: largest relative difference {worst:.3g} ({where}), tolerance {tol:g}")
sys.exit(0 if worst <= tol else 1)
