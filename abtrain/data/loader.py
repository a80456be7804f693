"""The step sampler, augmentation and crops, and the worker processes that build batches.

The global batch of step t is a fixed slice of that epoch's permutation and rank r takes the
r-th part of it, so what a run sees depends only on (seed, step): resuming is exact, and one
process with batch world·b sees what `world` ranks see together. Augmentation draws from
generators seeded by (seed, step, position in the global batch) for the same reason, so the
ranks' augmented images together are also exactly the one process's.

Images read from files are decoded and augmented ahead of the training step, in DataLoader
worker processes (`_ahead`, which `ImageTask.train_batches` uses); which worker builds a batch
changes nothing.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from abtrain.data.sources import DataError
from abtrain.lifetime import die_with_parent

CROP_SCALE = (0.08, 1.0)  # RandomResizedCrop's defaults, as the paper uses them
CROP_RATIO = (3 / 4, 4 / 3)
# as torchvision computes it (float32), so the drawn ratios are bit-identical to its own
_LOG_RATIO = tuple(torch.log(torch.tensor(CROP_RATIO)).tolist())
PREFETCH = 2  # batches each worker builds ahead


# ---------------------------------------------------------------- sampling
class StepSampler:
    """Which samples step t reads (`indices`, a function of the order's seed and t alone)
    and the streams of its augmentations (`generator`, `image_generator`: the run's seed).
    `order_seed` seeds the order apart from the augmentations (the authors kept one data
    order for every run's seed); None: the run's seed."""

    def __init__(
        self,
        n: int,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        order_seed: int | None = None,
    ) -> None:
        self.global_batch = batch_size * world_size
        if self.global_batch > n:
            raise ValueError(
                f"batch_size·world_size = {self.global_batch} exceeds the {n} training samples"
            )
        self.n, self.batch_size, self.rank, self.seed = n, batch_size, rank, seed
        self.order_seed = seed if order_seed is None else order_seed
        self.steps_per_epoch = n // self.global_batch

    def indices(self, step: int) -> Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.order_seed * 100_003 + epoch)
        perm = torch.randperm(self.n, generator=g)
        start = i * self.global_batch + self.rank * self.batch_size
        return perm[start : start + self.batch_size]

    @property
    def offset(self) -> int:
        """Where this rank's part starts in the global batch."""
        return self.rank * self.batch_size

    def generator(self, step: int) -> torch.Generator:
        """The stream for the augmentations of `step`'s whole global batch.

        The same on every rank: each draws for all global_batch images and uses its own
        part, so the ranks together augment exactly as one process with the whole batch.
        """
        return torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (1 << 64))

    def image_generator(self, step: int, j: int) -> torch.Generator:
        """The stream for image j of this rank's part of `step`'s batch.

        An image read from a file draws a varying number of values (the crop's retries), so
        each gets its own stream, keyed by its position in the global batch.
        """
        key = (self.seed * 1_000_003 + step) * 1_000_003 + self.offset + j
        return torch.Generator().manual_seed(key % (1 << 64))


# ---------------------------------------------------------------- augmentation and crops
def _augment(x: Tensor, g: torch.Generator, offset: int = 0, total: int | None = None) -> Tensor:
    """CIFAR-style: zero-pad 4, random crop back to size, random horizontal flip.

    `g` draws for all `total` images of the global batch and `x` gets rows offset.., so a
    rank's part is augmented as it would be inside the whole batch.
    """
    n, _, h, w = x.shape
    total = n if total is None else total
    padded = F.pad(x, (4, 4, 4, 4))
    part = slice(offset, offset + n)
    dy = torch.randint(0, 9, (total,), generator=g)[part]
    dx = torch.randint(0, 9, (total,), generator=g)[part]
    flip = (torch.rand(total, generator=g) < 0.5)[part]
    out = torch.empty_like(x)
    for i in range(n):
        crop = padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        out[i] = crop.flip(-1) if flip[i] else crop
    return out


def crop_params(height: int, width: int, g: torch.Generator) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box (top, left, height, width), drawn from `g`.

    torchvision's RandomResizedCrop draws from the global RNG, which DataLoader seeds per
    worker, so the crop would depend on which worker decoded the batch. This draws the same
    sequence (the same calls, scale 0.08-1, ratio 3/4-4/3, 10 tries, then its centre-crop
    fallback) from the (seed, step, image) stream instead: the same distribution, and the
    same box torchvision gives when the global RNG holds g's state.
    """
    area = height * width
    for _ in range(10):
        target = area * torch.empty(1).uniform_(*CROP_SCALE, generator=g).item()
        aspect = torch.exp(torch.empty(1).uniform_(*_LOG_RATIO, generator=g)).item()
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=g).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=g).item())
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(CROP_RATIO):
        w, h = width, int(round(width / min(CROP_RATIO)))
    elif in_ratio > max(CROP_RATIO):
        w, h = int(round(height * max(CROP_RATIO))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _draft(img: Image.Image, fx: float, fy: float) -> int:
    """Let libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale; returns the scale's divisor.

    `fx`, `fy` are how much the transform shrinks the image anyway; the request keeps the
    part that is used at least as large as the output, so the transform still shrinks (or
    keeps) it afterwards and no detail the output could hold is lost; only the filter of
    the first reduction differs (DCT scaling instead of bilinear). Other formats: 1.
    """
    width = img.width
    drafted = img.draft("RGB", (math.ceil(width * fx), math.ceil(img.height * fy)))
    return 1 if drafted is None else round(width / drafted[1][2])


def _load(path: str, size: int, g: torch.Generator | None) -> Tensor:
    """One image as uint8 (3, size, size): RandomResizedCrop + flip drawn from `g`, or (g
    None) resize to size·256/224 and centre crop, as the paper's ImageNet pipeline."""
    from torchvision.transforms.v2 import functional as TF

    try:
        with Image.open(path) as src:
            width, height = src.size
            if g is None:
                short = round(size * 256 / 224)
                f = short / min(width, height)
                _draft(src, f, f)
                img = src if src.mode == "RGB" else src.convert("RGB")
                img = TF.center_crop(TF.resize(img, [short]), [size])
            else:
                top, left, h, w = crop_params(height, width, g)
                k = _draft(src, size / w, size / h)
                img = src if src.mode == "RGB" else src.convert("RGB")
                if k == 1:
                    img = TF.resized_crop(img, top, left, h, w, [size, size])
                else:  # in the reduced image the box is fractional, which only PIL takes
                    box = (left / k, top / k, (left + w) / k, (top + h) / k)
                    img = img.resize((size, size), Image.BILINEAR, box=box)
                if torch.rand(1, generator=g).item() < 0.5:
                    img = TF.horizontal_flip(img)
            return TF.pil_to_tensor(img)  # inside: `img` may still be the lazily read `src`
    except (UnidentifiedImageError, OSError) as err:
        raise DataError(f"{path}: unreadable image ({err})") from None


# ---------------------------------------------------------------- worker processes
def _init_worker(worker_id: int) -> None:
    # A rank killed outright leaves its workers to notice by themselves, which they do
    # only between batches, and one whose queue's pipe is full never does: they would
    # outlive the run, holding its log pipe open.
    die_with_parent(signal.SIGKILL)
    # a worker decodes one image at a time; torch's intra-op threads would only compete
    # with the other workers and the training step for the cores
    torch.set_num_threads(1)


class _Items(Dataset):
    """Item k is fn(k), one whole batch; DataLoader builds items in its worker processes."""

    def __init__(self, fn: Callable[[int], tuple[Tensor, Tensor]], n: int) -> None:
        self.fn, self.n = fn, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> tuple[Tensor, Tensor]:
        return self.fn(k)


def _ahead(
    fn: Callable[[int], tuple[Tensor, Tensor]], n: int, workers: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """fn(0), ..., fn(n-1) in order, built ahead by `workers` processes (0: in-process)."""
    if workers == 0 or n == 0:
        for k in range(n):
            yield fn(k)
        return
    loader = DataLoader(
        _Items(fn, n),
        batch_size=None,  # an item is already a batch
        num_workers=min(workers, n),
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=PREFETCH,
        persistent_workers=True,
        worker_init_fn=_init_worker,
    )
    for batch in loader:  # DataLoader turns the (x, y) tuple into a list
        yield tuple(batch)
    # closing this generator early drops the loader and its iterator, which stops the workers
