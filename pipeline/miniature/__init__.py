"""The paper's profile in miniature: `python -m pipeline.miniature` (`bash scripts/paper_mini.sh`).

`profiles/paper.yaml` with only sizes changed (steps, evaluations, batch sizes, ranks, the
width of the models that have one to spare: the search's mini-ViT and VGG16; ViT-B/16
stays as it is, at 224 px) and the places a run reads from or runs on (the data
sources, the cluster's partition and cores), run end to end: `dvc repro` in a fresh working
copy of this repository, through the SLURM launcher, on generated data in the real formats:

- an ImageNet-style `train/<wnid>/*.JPEG`, `val/<wnid>/*.JPEG` tree of JPEGs of 240-500 px
  a side, as a tar archive written by the system's GNU tar (for ViT-B/16);
- a CIFAR-100 archive in the python-version layout (`cifar-100-python/{train,test,meta}`,
  pickled as Python 2 wrote them: keys and file names are py2 `str`; `data` uint8 (N, 3072))
  for the Propulate/Optuna search under mpirun;
- CIFAR-10 for VGG16: the real images from `../shared/data/cifar10-jpg.tar.gz` (a few per
  class, through the ImageFolder path) where that file exists, else a generated CIFAR-10
  python archive.

The matrix keeps ab of ViT-B/16 and VGG16 and ddp of VGG16 on 2 nodes. Every change to the paper's values is
in `overrides()` of profile.py (path patterns over the params, run `set` lists read as key=value);
nothing else differs, which tests/pipeline/test_paper_mini.py checks. By default the
local SLURM cluster of the tests (tests/slurm_cluster.py: slurmctld and two slurmd nodes on
127.0.0.1; Debian's slurmctld, slurmd and slurm-client) is started for the run;
`--cluster existing` submits to the cluster that `sbatch` reaches as it is.

The folder (`--out`, default out/paper-mini) holds sources/ (the data), repo/ (the working
copy: params.yaml, runs/, results/, metrics/, reports/), repro.log and miniature.json (what was run).
"""

from __future__ import annotations

# The parts: profile (the paper's params shrunk: `overrides()`, applied and checked), data
# (the generated sources in the real formats), run (the working copy, `dvc repro` in it, and
# the command line). What tests/pipeline/test_paper_mini.py reads is here as before.
from pipeline.miniature.data import write_cifar100
from pipeline.miniature.profile import RUNS
from pipeline.miniature.run import main

__all__ = ["RUNS", "main", "write_cifar100"]
