"""The paper's params in miniature: every change to profiles/paper.yaml (`overrides()`),
applied to the paper's params with the matrix cut to RUNS, and abtrain's own checks of
the result (`validate()`)."""

from __future__ import annotations

import copy
import fnmatch
from pathlib import Path
from typing import Any

import yaml

from pipeline.miniature.data import CIFAR10_PER_CLASS

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "profiles" / "paper.yaml"

# The matrix in miniature, on 2 nodes (the paper's names): ab of ViT-B/16 and of VGG16, and
# VGG16's ddp run for the report's ab-against-its-own-ddp comparison (the cheapest model's
# pair: a ddp run of ViT-B/16 cost a minute and 1.4 GB here). ViT-B/16 needs no ddp run of
# its own: an ab run's warm-up and rebound steps are DDP steps of its model. ResNet-50's ab
# run (about 40 CPU-seconds here) differs from ViT-B/16's in its `set` list only, which
# tests/pipeline/test_paper_profile.py checks; tests/abtrain/test_batchnorm.py trains
# ResNet-50 through AB with the authors' SyncBatchNorm on 2 nodes.
RUNS = (
    "vit-ab-2n-local",
    "vgg-ddp-2n",
    "vgg-ab-2n",
)
# The `key=value` lists of the params, compared and overridden key by key.
SET_LISTS = (("search", "train"), ("experiments", "runs", "*", "set"))


def overrides(src: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """Every change to profiles/paper.yaml: (path pattern, value, what kind of change).

    Paths are dotted; `*` matches any run; a run's `set` list and `search.train` are read
    as key=value, so `experiments.runs.vgg-*.set.model.kwargs.width` is VGG16's width.
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
        ("experiments.seeds", 1, "size"),  # the paper's 3 would triple the miniature's runs
        ("experiments.runs.*.ranks_per_node", 1, "size"),
        ("experiments.runs.*.steps", 3, "size"),  # the authors' run lengths: 15,000-90,000
        # the authors' W/S/R/N schedules of the ab runs, in steps
        ("experiments.runs.*.set.ab.warmup_steps", 1, "size"),
        ("experiments.runs.*.set.ab.ab_steps", 1, "size"),
        ("experiments.runs.*.set.ab.rebound_steps", 1, "size"),
        ("experiments.runs.*.set.ab.lr_rebound_steps", 1, "size"),
        (f"{vgg}.batch_size", 2, "size"),
        (f"{vgg}.model.kwargs.width", 8, "size"),  # VGG16's 64 (its 4096-wide classifier: 512)
        (f"{vgg}.data.train_per_class", CIFAR10_PER_CLASS["train"], "size"),
        (f"{vgg}.data.val_per_class", CIFAR10_PER_CLASS["val"], "size"),
        ("search.ranks", 4, "size"),  # one worker of search.ranks_per_worker = 4
        ("search.evaluations", 2, "size"),  # one worker: two individuals, two trials
        ("search.train.steps", 8, "size"),
        ("search.train.eval_every", 4, "size"),  # 2 evaluations: the median rule can prune
        ("search.train.batch_size", 4, "size"),
        ("search.train.model.kwargs.embed_dim", 96, "size"),  # the authors' mini-ViT: 768
        ("experiments.slurm.search_nodes", 2, "size"),
        # places: the data, and the cluster (CPU nodes of 4 cores, partition `debug`)
        ("train.data.source", src["imagenet"], "data"),
        ("train.data.sha256", src["imagenet_sha256"], "data"),
        ("train.data.real_labels", src["imagenet_real"], "data"),
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
    from abtrain.config import model_label as label
    from abtrain.method import methods
    from pipeline import matrix
    from search import space

    abconfig.from_dict(params["train"])
    slurm = params["experiments"]["slurm"]
    plan = {}
    for name, run in matrix.runs(params).items():
        base = matrix.base_config(params, run)
        sets = matrix.run_overrides(params, run, None, size=counts[base.data.prepared])
        cfg = abconfig.from_dict(params["train"], sets)
        methods.check_world(cfg, run.world, run.ranks_per_node)
        if not 2 <= cfg.steps <= 8:
            raise ValueError(f"{name}: {cfg.steps} steps; the miniature wants a step or two")
        plan[name] = dict(
            model=label(cfg.model),
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
