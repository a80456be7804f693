"""Input pipeline: abtrain's loader against torchvision's ImageFolder + DataLoader, and the
share of a training step spent waiting for data.

    python -m bench.loader [--images 2000 --workers 2 --out bench/results/loader.json]

Generates (once, under --data) an ImageFolder tree of photo-like ~500x375 JPEGs, prepares it
through `abtrain.data.prepare.prepare`, then measures
  (a) images/s of `ImageTask.train_batches` (RandomResizedCrop + flip + normalise),
  (b) images/s of torchvision's ImageFolder + DataLoader with the same workers, batch,
      prefetch and transforms, rounds alternating with (a) on this shared machine,
  (c) a short training run of a model whose compute per step exceeds the decoding of one
      batch, consuming `train_batches`: the time blocked in next() against the step time.
Prints a table and writes all figures, the machine and the command as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from abtrain import config as abconfig
from abtrain.data.datasets import ImageTask, make_task
from abtrain.data.loader import CROP_RATIO, CROP_SCALE, PREFETCH, StepSampler, _init_worker
from abtrain.data.prepare import IMAGENET_STATS, prepare
from abtrain.files import write_record

ROOT = Path(__file__).resolve().parents[1]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.loader", description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2000, help="training images, over --classes")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--data", default=None, help="where the generated tree lives (kept)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--size", type=int, default=224, help="training crop")
    p.add_argument("--batch", type=int, default=32, help="images per batch, throughput")
    p.add_argument("--batches", type=int, default=40, help="timed batches per round")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds per loader")
    p.add_argument("--model", default="resnet18", help="torchvision model for the run")
    p.add_argument("--train-batch", type=int, default=16)
    p.add_argument("--train-steps", type=int, default=12, help="timed training steps")
    p.add_argument("--train-warmup", type=int, default=2, help="untimed first steps")
    p.add_argument("--train-workers", type=int, default=None, help="default: --workers")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "loader.json"))
    a = p.parse_args(argv)
    if a.data is None:
        a.data = f"/tmp/abtrain-bench-loader/{a.images}x{a.width}x{a.height}-c{a.classes}"
    if a.train_workers is None:
        a.train_workers = a.workers
    return a


def say(text: str) -> None:
    print(text, flush=True)


# ---------------------------------------------------------------- data
def photo(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Smooth colour gradients, a few soft blobs and sensor-like noise: compresses (and
    decodes) like a photograph rather than like flat colour or pure noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32) / max(w, h)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(1, 6), rng.uniform(1, 6), rng.uniform(0, 6.3)
        img[..., c] = 110 + 70 * np.sin(fx * xx + fy * yy + ph)
    for _ in range(6):
        cx, cy, r = (
            rng.uniform(0, w / max(w, h)),
            rng.uniform(0, h / max(w, h)),
            rng.uniform(0.03, 0.2),
        )
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
        img += blob[..., None] * rng.uniform(-80, 80, 3)
    img += rng.normal(0, 7, img.shape)
    return img.clip(0, 255).astype(np.uint8)


def make_tree(a: argparse.Namespace) -> Path:
    """train/<class>/*.jpg (and one val image per class, which prepare requires), once."""
    tree = Path(a.data) / "tree"
    done = Path(a.data) / "tree.complete"
    if done.exists():
        return tree
    say(f"generating {a.images} JPEGs of {a.width}x{a.height} in {tree} ...")
    rng = np.random.default_rng(0)
    for split, n in (("train", a.images), ("val", a.classes)):
        for i in range(n):
            folder = tree / split / f"class{i % a.classes:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo(rng, a.width, a.height)).save(folder / f"{i:06d}.jpg", quality=90)
    done.write_text("")
    return tree


def image_task(a: argparse.Namespace, tree: Path, workers: int) -> ImageTask:
    d = dict(
        name="imagefolder",
        source=str(tree),
        sha256=None,
        prepared=str(Path(a.data) / f"prepared-{a.size}"),
        train_per_class=0,
        val_per_class=0,
        real_labels=None,
        image_size=a.size,
        augment=True,
        workers=workers,
    )
    cfg = abconfig.load(ROOT / "params.yaml", [f"data={json.dumps(d)}", "tracking.enabled=false"])
    prepare(cfg.data)
    task = make_task(cfg)
    assert isinstance(task, ImageTask) and not task.meta["cached"]
    return task


# ---------------------------------------------------------------- throughput
def cpu_s() -> float:
    """CPU seconds of this process and of its ended children (workers, once joined)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(
    make: Callable[[], Iterator[Any]], warmup: int, timed: int, batch: int
) -> dict[str, float]:
    """Images/s over `timed` batches after `warmup` (worker start-up, the queue's first
    fill); and CPU ms per image over the loader's whole life, workers included, which a
    shared machine's other load disturbs much less than the wall clock."""
    cpu = cpu_s()
    batches = make()
    for _ in range(warmup):
        next(batches)
    start = time.perf_counter()
    for _ in range(timed):
        next(batches)
    wall = time.perf_counter() - start
    for _ in batches:  # none left: the loader ends and joins its workers
        raise AssertionError("the loader built more batches than asked for")
    return dict(
        images_per_s=timed * batch / wall,
        cpu_ms_per_image=1e3 * (cpu_s() - cpu) / ((warmup + timed) * batch),
    )


def abtrain_loader(
    task: ImageTask, a: argparse.Namespace, rnd: int, n: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    return task.train_batches(StepSampler(len(task), a.batch, 0, 1, seed=rnd), 0, n)


def torchvision_dataset(tree: Path, a: argparse.Namespace) -> Any:
    """torchvision's own recipe: ImageFolder with per-image v2 transforms."""
    from torchvision import datasets
    from torchvision.transforms import v2

    mean, std = IMAGENET_STATS
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(a.size, scale=CROP_SCALE, ratio=CROP_RATIO),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )
    return datasets.ImageFolder(str(tree / "train"), transform=transform)


def torchvision_loader(
    dataset: Any, a: argparse.Namespace, rnd: int, n: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """DataLoader batching with the same workers, prefetch, pinning and worker set-up."""
    sampler = torch.utils.data.RandomSampler(
        dataset, num_samples=n * a.batch, generator=torch.Generator().manual_seed(rnd)
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=a.batch,
        sampler=sampler,
        drop_last=True,
        num_workers=a.workers,
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=PREFETCH if a.workers else None,
        worker_init_fn=_init_worker if a.workers else None,
    )
    return iter(loader)


# ---------------------------------------------------------------- training
def train_run(a: argparse.Namespace, task: ImageTask) -> dict[str, Any]:
    import torchvision

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = getattr(torchvision.models, a.model)(num_classes=task.classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = StepSampler(len(task), a.train_batch, 0, 1, seed=0)
    n = a.train_warmup + a.train_steps
    # what the workers have to keep up with: one batch decoded in-process, on one core
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t = time.perf_counter()
    for s in range(n, n + 3):
        task.train_batch(sampler, s)
    decode = (time.perf_counter() - t) / 3
    torch.set_num_threads(threads)
    waits, steps = [], []
    batches = task.train_batches(sampler, 0, n)
    for i in range(n):
        t0 = time.perf_counter()
        x, y = next(batches)
        t1 = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        steps.append(t2 - t0)
        timed = "warm-up" if i < a.train_warmup else "timed"
        say(f"  step {i:3d} ({timed}): wait {t1 - t0:7.3f} s  step {t2 - t0:7.3f} s")
    w, s = waits[a.train_warmup :], steps[a.train_warmup :]
    compute = (sum(s) - sum(w)) / len(s)
    return dict(
        model=a.model,
        device=str(device),
        batch=a.train_batch,
        size=a.size,
        workers=a.train_workers,
        torch_threads=threads,
        warmup_steps=a.train_warmup,
        timed_steps=len(s),
        decode_s_per_batch_one_core=decode,
        compute_s_per_step=compute,
        compute_exceeds_decode=compute > decode,
        step_s_mean=sum(s) / len(s),
        wait_s_mean=sum(w) / len(w),
        wait_share=sum(w) / sum(s),
        first_wait_s=waits[0],
        waits_s=waits,
        steps_s=steps,
    )


# ---------------------------------------------------------------- main
def machine() -> dict[str, Any]:
    import PIL
    import torchvision
    from PIL import features

    return dict(
        cpu_count=os.cpu_count(),
        usable_cores=len(os.sched_getaffinity(0)),
        processor=platform.processor() or platform.machine(),
        python=platform.python_version(),
        torch=torch.__version__,
        torchvision=torchvision.__version__,
        pillow=PIL.__version__,
        libjpeg_turbo=features.check_feature("libjpeg_turbo"),
        cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    )


def write_json(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_record(path, obj, end="\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    command = shlex.join(
        ["python", "-m", "bench.loader", *(sys.argv[1:] if argv is None else argv)]
    )
    tree = make_tree(a)
    task = image_task(a, tree, a.workers)
    jpegs = list((tree / "train").rglob("*.jpg"))
    say(
        f"{len(task)} training images, mean {np.mean([p.stat().st_size for p in jpegs]) / 1e3:.0f} kB"
    )
    warmup = max(2, 2 * a.workers)  # worker start-up and the prefetch queue's first fill
    n = warmup + a.batches
    dataset = torchvision_dataset(tree, a)
    makers = {
        "abtrain": lambda rnd: abtrain_loader(task, a, rnd, n),
        "torchvision": lambda rnd: torchvision_loader(dataset, a, rnd, n),
    }
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in makers}
    for rnd in range(a.rounds):  # alternating, so both see the machine's changing load
        for name, make in makers.items():
            r = measure(functools.partial(make, rnd), warmup, a.batches, a.batch)
            rounds[name].append(r)
            say(
                f"round {rnd}: {name:<12} {r['images_per_s']:8.1f} images/s"
                f"  {r['cpu_ms_per_image']:6.2f} CPU ms/image"
            )
    through = {
        name: dict(
            images_per_s=statistics.median(r["images_per_s"] for r in rs),
            cpu_ms_per_image=statistics.median(r["cpu_ms_per_image"] for r in rs),
            rounds=rs,
        )
        for name, rs in rounds.items()
    }
    ratio = through["abtrain"]["images_per_s"] / through["torchvision"]["images_per_s"]
    cpu_ratio = through["torchvision"]["cpu_ms_per_image"] / through["abtrain"]["cpu_ms_per_image"]
    say(f"training {a.model}, batch {a.train_batch}, {a.train_workers} workers ...")
    train = train_run(a, image_task(a, tree, a.train_workers))
    result = dict(
        command=command,
        machine=machine(),
        data=dict(
            path=str(tree),
            images=len(task),
            classes=task.classes,
            width=a.width,
            height=a.height,
            jpeg_kb_mean=float(np.mean([p.stat().st_size for p in jpegs]) / 1e3),
        ),
        throughput=dict(
            workers=a.workers,
            batch=a.batch,
            size=a.size,
            prefetch_per_worker=PREFETCH,
            warmup_batches=warmup,
            timed_batches=a.batches,
            **through,
            abtrain_over_torchvision=ratio,
            abtrain_over_torchvision_per_cpu_s=cpu_ratio,
        ),
        train=train,
        done=dict(
            abtrain_at_least_as_fast=ratio >= 1,
            wait_share_at_most_5_percent=train["wait_share"] <= 0.05,
            compute_exceeds_decode=train["compute_exceeds_decode"],
        ),
    )
    write_json(Path(a.out), result)
    t = result["throughput"]
    say("")
    say(f"{a.workers} workers, batch {a.batch}, {a.size} px, median of {a.rounds} rounds")
    say(f"{'loader':<28}{'images/s':>10}{'CPU ms/image':>14}")
    for name, label in (
        ("abtrain", "abtrain train_batches"),
        ("torchvision", "torchvision ImageFolder"),
    ):
        say(f"{label:<28}{t[name]['images_per_s']:>10.1f}{t[name]['cpu_ms_per_image']:>14.2f}")
    say(f"{'abtrain / torchvision':<28}{ratio:>10.2f}{cpu_ratio:>14.2f}  (speed-up)")
    say(
        f"training {a.model} b{a.train_batch} on {train['device']}: step {train['step_s_mean']:.3f} s, "
        f"compute {train['compute_s_per_step']:.3f} s vs decode {train['decode_s_per_batch_one_core']:.3f} s"
        f"/batch, wait {train['wait_s_mean']:.4f} s = {100 * train['wait_share']:.2f}% of step time"
    )
    say(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
