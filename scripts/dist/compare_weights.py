"""compare_weights.py A B [TOL]: the largest per-tensor relative difference ||a - b|| / ||b|| between the
latest checkpoints of two run directories; exits 1 above TOL (default 1e-6). Used by the multi-node and
SLURM checks to compare a distributed run with one process on the same global batch."""
import sys
from pathlib import Path

from safetensors.torch import load_file


def weights(run):
    ckpts = Path(run) / "checkpoints"
    name = (ckpts / "latest").read_text().strip()
    return load_file(str(ckpts / name / "model.safetensors"))


a, b = weights(sys.argv[1]), weights(sys.argv[2])
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-6
if a.keys() != b.keys():
    sys.exit(f"compare_weights: error: the runs hold different tensors: {sorted(a.keys() ^ b.keys())[:5]}")
worst, where = max((((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-30)).item(), k) for k in b)
print(f"compare_weights: largest relative difference {worst:.3g} ({where}), tolerance {tol:g}")
sys.exit(0 if worst <= tol else 1)
