"""The paper's profile in miniature: `python -m pipeline.miniature` (`bash scripts/paper_mini.sh`).

`profiles/paper.yaml` with only sizes changed (steps, evaluations, batch sizes, ranks, the
width of the models that have one to spare: the search's mini-ViT and VGG16; ViT-B/16 and
ResNet-50 stay as they are, at 224 px) and the places a run reads from or runs on (the data
sources, the cluster's partition and cores), run end to end: `dvc repro` in a fresh working
copy of this repository, through the SLURM launcher, on generated data in the real formats:

- an ImageNet-style `train/<wnid>/*.JPEG`, `val/<wnid>/*.JPEG` tree of JPEGs of 240-500 px
  a side, as a tar archive written by the system's GNU tar (for ViT-B/16 and ResNet-50);
- a CIFAR-100 archive in the python-version layout (`cifar-100-python/{train,test,meta}`,
  pickled as Python 2 wrote them: keys and file names are py2 `str`; `data` uint8 (N, 3072))
  for the Propulate/Optuna search under mpirun;
- CIFAR-10 for VGG16: the real images from `../shared/data/cifar10-jpg.tar.gz` (a few per
  class, through the ImageFolder path) where that file exists, else a generated CIFAR-10
  python archive.

The matrix keeps ddp and ab for each model on 2 nodes. Every change to the paper's values is
in `overrides()` below (path patterns over the params, run `set` lists read as key=value);
nothing else differs, which tests/pipeline/test_paper_mini.py checks. By default the
local SLURM cluster of the tests (tests/slurm_cluster.py: slurmctld and two slurmd nodes on
127.0.0.1; Debian's slurmctld, slurmd and slurm-client) is started for the run;
`--cluster existing` submits to the cluster that `sbatch` reaches as it is.

The folder (`--out`, default out/paper-mini) holds sources/ (the data), repo/ (the working
copy: params.yaml, runs/, results/, metrics/, reports/), repro.log and miniature.json (what was run).
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import hashlib
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "profiles" / "paper.yaml"
SHARED_CIFAR10 = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"
MARK = ".paper-mini"

# The matrix in miniature: ddp and ab of each model, on 2 nodes (the paper's names).
RUNS = (
    "vit-ddp-2n-local",
    "vit-ab-2n-local",
    "r50-ddp-2n-local",
    "r50-ab-2n-local",
    "vgg-ddp-2n",
    "vgg-ab-2n",
)
# The `key=value` lists of the params, compared and overridden key by key.
SET_LISTS = (("search", "train"), ("experiments", "runs", "*", "set"))

# Generated data: ImageNet-style classes (WordNet ids) and images per class and split.
WNIDS = ("n01440764", "n01443537", "n01484850")
IMAGENET_PER_CLASS = {"train": 4, "val": 2}  # 12 training images: an epoch of 3 steps
JPEG_SIZES = ((500, 375), (375, 500), (256, 256), (320, 240), (480, 480))
CIFAR100_PER_CLASS = {"train": 5, "test": 1}
CIFAR10_PER_CLASS = {"train": 2, "val": 1}  # the real images' subset


def overrides(src: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """Every change to profiles/paper.yaml: (path pattern, value, what kind of change).

    Paths are dotted; `*` matches any run; a run's `set` list and `search.train` are read
    as key=value, so `experiments.runs.vgg-*.set.model.width` is VGG16's width.
    """
    vgg = "experiments.runs.vgg-*.set"
    return [
        # sizes: steps, evaluations, batches, ranks, widths
        ("train.steps", 3, "size"),  # each run's own comes from experiments.epochs
        ("train.eval_every", 3, "size"),
        ("train.batch_size", 2, "size"),  # per rank: 4 images a step on 2 nodes × 1 rank
        ("train.optim.lr_warmup_steps", 1, "size"),
        ("train.ab.warmup_steps", 1, "size"),  # must stay below train.steps
        ("train.tracking.log_every", 1, "size"),
        ("train.data.workers", 1, "size"),  # decoding processes per rank
        ("experiments.evaluations", 1, "size"),
        ("experiments.runs.*.ranks_per_node", 1, "size"),
        ("experiments.runs.*.steps", 3, "size"),  # the authors' run lengths: 15,000-90,000
        # the authors' W/S/R/N schedules of the ab runs, in steps
        ("experiments.runs.*.set.ab.warmup_steps", 1, "size"),
        ("experiments.runs.*.set.ab.ab_steps", 1, "size"),
        ("experiments.runs.*.set.ab.rebound_steps", 1, "size"),
        ("experiments.runs.*.set.ab.lr_rebound_steps", 1, "size"),
        (f"{vgg}.batch_size", 2, "size"),
        (f"{vgg}.model.width", 8, "size"),  # VGG16's 64 (its 4096-wide classifier: 512)
        (f"{vgg}.data.train_per_class", CIFAR10_PER_CLASS["train"], "size"),
        (f"{vgg}.data.val_per_class", CIFAR10_PER_CLASS["val"], "size"),
        ("search.ranks", 4, "size"),  # one worker of search.ranks_per_worker = 4
        ("search.evaluations", 4, "size"),
        ("search.train.steps", 8, "size"),
        ("search.train.eval_every", 4, "size"),  # 2 evaluations: the median rule can prune
        ("search.train.batch_size", 4, "size"),
        ("search.train.model.width", 96, "size"),  # the authors' mini-ViT: 768
        ("experiments.slurm.search_nodes", 2, "size"),
        # places: the data, and the cluster (CPU nodes of 4 cores, partition `debug`)
        ("train.data.source", src["imagenet"], "data"),
        ("train.data.sha256", src["imagenet_sha256"], "data"),
        ("search.train.data.source", src["cifar100"], "data"),
        ("search.train.data.sha256", src["cifar100_sha256"], "data"),
        *((f"{vgg}.data.{k}", v, "data") for k, v in src["cifar10_data"].items()),
        ("train.dist.backend", "auto", "cluster"),  # nccl needs GPUs: gloo here
        ("experiments.slurm.partition", None, "cluster"),
        ("experiments.slurm.gpus_per_node", 0, "cluster"),
        ("experiments.slurm.cpus_per_task", 1, "cluster"),
    ]


# ---------------------------------------------------------------- params
def _match_lists(path: tuple[str, ...]) -> bool:
    return any(
        len(path) == len(p) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(path, p))
        for p in SET_LISTS
    )


def normalize(p: Any, path: tuple[str, ...] = ()) -> Any:
    """The params with every `key=value` list as a mapping (values read as YAML)."""
    from abtrain.config import parse_override

    if isinstance(p, dict):
        return {k: normalize(v, (*path, str(k))) for k, v in p.items()}
    if isinstance(p, list) and _match_lists(path):
        out = {}
        for item in p:
            key, value = parse_override(item)
            out[".".join(key)] = value
        return out
    return p


def _inline(value: Any) -> str:
    """A YAML flow value on one line (what `--set key=VALUE` reads back)."""
    text = yaml.safe_dump([value], default_flow_style=True, sort_keys=False, width=1 << 30)
    return text.strip()[1:-1]


def denormalize(p: Any, path: tuple[str, ...] = ()) -> Any:
    from abtrain.config import parse_override

    if isinstance(p, dict) and _match_lists(path):
        out = [f"{k}={_inline(v)}" for k, v in p.items()]
        for item, (k, v) in zip(out, p.items()):
            assert parse_override(item) == (k.split("."), v), item  # reads back the same
        return out
    if isinstance(p, dict):
        return {k: denormalize(v, (*path, str(k))) for k, v in p.items()}
    return p


def flatten(p: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of the normalized params by dotted path."""
    if isinstance(p, dict) and p:
        out = {}
        for k, v in p.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: p}


def apply(tree: dict[str, Any], pattern: str, value: Any) -> list[str]:
    """Set every existing leaf matching `pattern`; returns their paths. Nothing is added."""
    parts, hits, same = pattern.split("."), [], []

    def walk(node: Any, i: int, at: list[str]) -> None:
        if i == len(parts):
            return
        if not isinstance(node, dict):
            return
        # `set` mappings key by dotted names (optim.lr): match the rest of the path whole
        for key in list(node):
            n = len(str(key).split("."))
            if fnmatch.fnmatchcase(str(key), ".".join(parts[i : i + n])):
                if i + n == len(parts):
                    if node[key] != value:
                        node[key] = copy.deepcopy(value)
                        hits.append(".".join([*at, key]))
                    else:
                        same.append(".".join([*at, key]))
                else:
                    walk(node[key], i + n, [*at, key])

    walk(tree, 0, [])
    if not hits:  # a stale entry: the paper's profile changed under it
        why = f"already {value!r}" if same else "no such key in the paper's profile"
        raise ValueError(f"override {pattern}: {why}")
    return hits


def miniature(paper: dict[str, Any], src: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The paper's params with only `overrides()` changed and the matrix cut to RUNS."""
    tree = normalize(copy.deepcopy(paper))
    missing = [r for r in RUNS if r not in tree["experiments"]["runs"]]
    if missing:
        raise ValueError(f"profiles/paper.yaml has no runs {missing}")
    tree["experiments"]["runs"] = {r: tree["experiments"]["runs"][r] for r in RUNS}
    changed = []
    for pattern, value, _ in overrides(src):
        changed += apply(tree, pattern, value)
    return denormalize(tree), changed


def validate(params: dict[str, Any], counts: dict[str, int]) -> dict[str, dict[str, Any]]:
    """abtrain's own checks on every run and on the search, before anything starts.

    Returns each run's plan: model, method, nodes × ranks, steps, batch per rank.
    """
    from abtrain import config as abconfig
    from pipeline import common
    from search import space

    abconfig.from_dict(params["train"])
    slurm = params["experiments"]["slurm"]
    plan = {}
    for name, run in common.runs(params).items():
        base = common.base_config(params, run)
        sets = common.run_overrides(params, run, None, size=counts[base.data.prepared])
        cfg = abconfig.from_dict(params["train"], sets)
        abconfig.check_world(cfg, run.world, run.ranks_per_node)
        if not 2 <= cfg.steps <= 8:
            raise ValueError(f"{name}: {cfg.steps} steps; the miniature wants a step or two")
        plan[name] = dict(
            model=cfg.model.name,
            method=cfg.method,
            nodes=run.nodes,
            ranks_per_node=run.ranks_per_node,
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            data=cfg.data.name,
        )
    s = space.load(params["search"])
    base = abconfig.apply_overrides(copy.deepcopy(params["train"]), s.train)
    low = space.overrides(space.corner(s.space), s.space, base["steps"])
    search_cfg = abconfig.from_dict(base, low)
    space.check_keys(s.space, abconfig.apply_overrides(base, low))
    if s.ranks % s.ranks_per_worker or s.ranks % int(slurm["search_nodes"]):
        raise ValueError("search.ranks must be a multiple of ranks_per_worker and search_nodes")
    need = s.ranks_per_worker * search_cfg.batch_size
    if counts[search_cfg.data.prepared] < need:
        raise ValueError(f"the search's data holds fewer than {need} training images")
    return plan


# ---------------------------------------------------------------- generated data
class _Py2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2's cPickle wrote the CIFAR batches: `bytes` become py2 `str`
    (SHORT_BINSTRING/BINSTRING), so `pickle.load(f, encoding="bytes")` gives b"data" keys
    and `encoding="latin1"` gives "data", as with the published files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_pickle(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _image(rng: np.random.Generator, c: int, classes: int, h: int, w: int) -> np.ndarray:
    """A smooth, class-coloured image with a little noise (learnable, small as a JPEG)."""
    hue = np.array([np.cos(2 * np.pi * (c / classes + k / 3)) for k in range(3)])
    y, x = np.mgrid[0:h, 0:w]
    ramp = (x / max(w - 1, 1) + y / max(h - 1, 1))[..., None] / 2
    px = 128 + 90 * hue * (0.5 + ramp) + rng.normal(0, 12, (h, w, 3))
    return np.clip(px, 0, 255).astype(np.uint8)


def _tar(folder: Path, member: str, archive: Path, gzip: bool) -> None:
    """The system's GNU tar (its member order and headers, as real archives have)."""
    flags = "-czf" if gzip else "-cf"
    subprocess.run(["tar", flags, str(archive), "-C", str(folder), member], check=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_imagenet(dest: Path, rng: np.random.Generator) -> tuple[Path, int]:
    """imagenet-mini.tar: imagenet-mini/{train,val}/<wnid>/*.JPEG, 240-500 px JPEGs."""
    from PIL import Image

    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        root = Path(tmp) / "imagenet-mini"
        k = 0
        for split, n in IMAGENET_PER_CLASS.items():
            for c, wnid in enumerate(WNIDS):
                (root / split / wnid).mkdir(parents=True)
                for i in range(n):
                    w, h = JPEG_SIZES[k % len(JPEG_SIZES)]
                    k += 1
                    name = (
                        f"{wnid}_{1000 + i}.JPEG"
                        if split == "train"
                        else f"ILSVRC2012_val_{k:08d}.JPEG"
                    )
                    img = Image.fromarray(_image(rng, c, len(WNIDS), h, w))
                    img.save(root / split / wnid / name, "JPEG", quality=85)
        archive = dest / "imagenet-mini.tar"
        _tar(Path(tmp), "imagenet-mini", archive, gzip=False)
    return archive, len(WNIDS) * IMAGENET_PER_CLASS["train"]


def _cifar_rows(rng: np.random.Generator, labels: list[int], classes: int) -> np.ndarray:
    """uint8 (N, 3072): each row the red plane, then green, then blue (32 × 32, row-major)."""
    return np.stack(
        [_image(rng, c, classes, 32, 32).transpose(2, 0, 1).reshape(-1) for c in labels]
    )


def write_cifar100(dest: Path, rng: np.random.Generator) -> tuple[Path, int]:
    """cifar-100-python-mini.tar.gz: cifar-100-python/{train,test,meta} as published.

    Named apart from `cifar-100-python.tar.gz`, whose md5 data.py checks against the
    published archive's; its own sha256 is given as data.sha256 instead.
    """
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        folder = Path(tmp) / "cifar-100-python"
        folder.mkdir()
        fine = [f"fine_{i:02d}".encode() for i in range(100)]
        coarse = [f"coarse_{i:02d}".encode() for i in range(20)]
        for split, n in CIFAR100_PER_CLASS.items():
            labels = [c for c in range(100) for _ in range(n)]
            rng.shuffle(labels)
            data = _cifar_rows(rng, labels, 100)
            batch = {
                b"filenames": [b"%s_s_%06d.png" % (fine[c], i) for i, c in enumerate(labels)],
                b"batch_label": f"{'training' if split == 'train' else 'testing'} batch 1 of 1".encode(),
                b"fine_labels": [int(c) for c in labels],
                b"coarse_labels": [int(c) // 5 for c in labels],
                b"data": data,
            }
            (folder / split).write_bytes(py2_pickle(batch))
        meta = {b"fine_label_names": fine, b"coarse_label_names": coarse}
        (folder / "meta").write_bytes(py2_pickle(meta))
        archive = dest / "cifar-100-python-mini.tar.gz"
        _tar(Path(tmp), "cifar-100-python", archive, gzip=True)
    return archive, 100 * CIFAR100_PER_CLASS["train"]


def write_cifar10(dest: Path, rng: np.random.Generator) -> Path:
    """cifar-10-python-mini.tar.gz: cifar-10-batches-py/{data_batch_1..5,test_batch,
    batches.meta} as published (for machines without the real images)."""
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        folder = Path(tmp) / "cifar-10-batches-py"
        folder.mkdir()
        names = [
            b"airplane",
            b"automobile",
            b"bird",
            b"cat",
            b"deer",
            b"dog",
            b"frog",
            b"horse",
            b"ship",
            b"truck",
        ]
        batches = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for i, name in enumerate(batches):
            labels = [c for c in range(10) for _ in range(2)]
            rng.shuffle(labels)
            data = _cifar_rows(rng, labels, 10)
            batch = {
                b"batch_label": (
                    f"training batch {i + 1} of 5" if i < 5 else "testing batch 1 of 1"
                ).encode(),
                b"labels": [int(c) for c in labels],
                b"data": data,
                b"filenames": [b"%s_s_%06d.png" % (names[c], j) for j, c in enumerate(labels)],
            }
            (folder / name).write_bytes(py2_pickle(batch))
        meta = {b"num_cases_per_batch": 20, b"label_names": names, b"num_vis": 3072}
        (folder / "batches.meta").write_bytes(py2_pickle(meta))
        archive = dest / "cifar-10-python-mini.tar.gz"
        _tar(Path(tmp), "cifar-10-batches-py", archive, gzip=True)
    return archive


def write_sources(dest: Path, cifar10: Path | None) -> tuple[dict[str, Any], dict[str, int]]:
    """The data sources and the training images each prepared folder will hold."""
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    imagenet, n_imagenet = write_imagenet(dest, rng)
    cifar100, n_cifar100 = write_cifar100(dest, rng)
    if cifar10 is not None and cifar10.is_file():  # the real images, as an ImageFolder
        c10 = dict(name="imagefolder", source=str(cifar10.resolve()), sha256=sha256(cifar10))
    else:
        archive = write_cifar10(dest, rng)
        c10 = dict(source=str(archive), sha256=sha256(archive))
    src = dict(
        imagenet=str(imagenet),
        imagenet_sha256=sha256(imagenet),
        cifar100=str(cifar100),
        cifar100_sha256=sha256(cifar100),
        cifar10_data=c10,
    )
    counts = {
        "data/prepared/imagenet": n_imagenet,
        "data/prepared/cifar100": n_cifar100,
        "data/prepared/cifar10": 10 * CIFAR10_PER_CLASS["train"],
    }
    return src, counts


# ---------------------------------------------------------------- the working copy
def working_copy(dest: Path) -> None:
    """This repository's files (tracked and new, not ignored) without its results, as a
    git repository of its own, with this checkout's .venv linked in."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    results = ("dvc.lock", "metrics/", "results/", "plots/", "reports/")  # the default profile's
    # committed benchmarks the report reads: reports/seeds/, every reports/seeds-*/ study,
    # the search-rerun study
    inputs = ("reports/seeds", "reports/table2/", "reports/search-reruns/")
    for f in files:
        if f and (ROOT / f).is_file() and (not f.startswith(results) or f.startswith(inputs)):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    git = ["git", "-c", "user.email=paper-mini@localhost", "-c", "user.name=paper-mini"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "paper profile in miniature"]):
        subprocess.run(git + cmd, cwd=dest, check=True)
    if (ROOT / ".venv").is_dir():
        (dest / ".venv").symlink_to(ROOT / ".venv")  # `source .venv/bin/activate` in jobs


def fresh(out: Path) -> None:
    if out.exists():
        if not (out / MARK).exists():
            raise SystemExit(f"{out} exists and is not a miniature's folder: choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARK).write_text("made by python -m pipeline.miniature; removed by the next run\n")


# ---------------------------------------------------------------- running it
def repro(repo: Path, log: Path, env: dict[str, str]) -> int:
    """`dvc repro` in the working copy; its output to this terminal and to `log`."""
    env = {
        **env,
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
    }
    if os.geteuid() == 0:  # Open MPI refuses root unless told (the search's mpirun)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open(log, "w") as f:
        proc = subprocess.Popen(
            ["dvc", "repro"],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            f.write(line)
            f.flush()
        return proc.wait()


def summarize(repo: Path, plan: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| run | model | method | nodes × ranks | steps | best top-1 | inter-node MB/step/rank |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in plan.items():
        path = repo / "results" / f"{name}.json"
        cells = ["—"] * 3
        if path.exists():
            s = json.loads(path.read_text())
            mb = s["traffic"]["inter_node_bytes"] / s["steps"] / 1e6
            cells = [str(s["steps"]), f"{s['val_top1']['best']:.2f}%", f"{mb:.2f}"]
        lines.append(
            f"| {name} | {p['model']} | {p['method']} | {p['nodes']} × {p['ranks_per_node']} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.miniature", description=__doc__)
    ap.add_argument(
        "--out", default=str(ROOT / "out" / "paper-mini"), help="its folder (made afresh)"
    )
    ap.add_argument(
        "--cluster",
        choices=["local", "existing"],
        default="local",
        help="local: start the tests' SLURM cluster on this machine; existing: use sbatch as is",
    )
    ap.add_argument(
        "--cifar10",
        default=str(SHARED_CIFAR10),
        help="CIFAR-10 as an ImageFolder archive (absent: a generated CIFAR-10 archive)",
    )
    ap.add_argument("--no-repro", action="store_true", help="write the data, params and copy only")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    t0 = time.monotonic()
    out = Path(args.out).resolve()
    fresh(out)
    src, counts = write_sources(out / "sources", Path(args.cifar10))
    paper = yaml.safe_load(PAPER.read_text())
    params, changed = miniature(paper, src)
    plan = validate(params, counts)
    repo = out / "repo"
    working_copy(repo)
    header = (
        "# profiles/paper.yaml in miniature, written by `python -m pipeline.miniature`:\n"
        "# only the keys listed in pipeline/miniature.py (overrides()) differ.\n"
    )
    (repo / "params.yaml").write_text(
        header + yaml.safe_dump(params, sort_keys=False, width=1 << 30)
    )
    record = dict(
        overrides=[dict(path=p, value=v, kind=k) for p, v, k in overrides(src)],
        changed=changed,
        runs=plan,
        sources=src,
        counts=counts,
        repo=str(repo),
    )
    print(f"[miniature] {len(changed)} values of profiles/paper.yaml changed; runs:", flush=True)
    for name, p in plan.items():
        print(
            f"[miniature]   {name}: {p['model']} {p['method']}, {p['nodes']} nodes × "
            f"{p['ranks_per_node']} rank, {p['steps']} steps of {p['batch_size']}/rank",
            flush=True,
        )
    if args.no_repro:
        (out / "miniature.json").write_text(json.dumps(record, indent=2))
        print(f"[miniature] not run: cd {repo} && dvc repro", flush=True)
        return 0
    if args.cluster == "local":
        from tests import slurm_cluster

        if not slurm_cluster.available():
            raise SystemExit(
                "the local SLURM cluster needs Debian's slurmctld, slurmd and slurm-client: "
                "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client"
            )
        cluster = slurm_cluster.local_cluster(out / "slurm")
    else:
        cluster = nullcontext(dict(os.environ))
    t1 = time.monotonic()
    with cluster as env:
        code = repro(repo, out / "repro.log", env)
    t2 = time.monotonic()
    record.update(returncode=code, wall_seconds=dict(setup=t1 - t0, repro=t2 - t1, total=t2 - t0))
    (out / "miniature.json").write_text(json.dumps(record, indent=2))
    print("\n".join(summarize(repo, plan)))
    print(
        f"[miniature] dvc repro exited {code} after {t2 - t1:.0f} s ({t2 - t0:.0f} s in all); "
        f"report: {repo / 'reports' / 'README.md'}",
        flush=True,
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
