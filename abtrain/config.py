"""The one typed training config, and the method's part of it.

`Config` is a whole training run as `abtrain train` makes it; every value lives in
`params.yaml` (section `train`) and the schema has no defaults on purpose, so a missing key
is an error rather than a silently different run. `MethodConfig` is the part the method
itself reads (`ABTraining`: method, steps, seed, `ab`, `powersgd`, `dist`); a user's own loop
gives it without a file through `abtrain.method.guidelines.method_config(steps=N, ...)`, which
fills what is not given with the paper's published guidelines. Validation happens before
any process group exists, and every error names the offending key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from abtrain.errors import ConfigError
from abtrain.modelspec import check_timm_arch, split_spec

Method = Literal[
    "ddp", "ab", "ab_nogroups", "ab_individual", "powersgd", "ab_powersgd", "localsgd", "diloco"
]
AB_METHODS = ("ab", "ab_nogroups", "ab_individual", "ab_powersgd")  # for validation here
BASELINE: Method = "ddp"  # what every other method is compared with


def one_line(err: BaseException) -> str:
    """An error's message on one line (the last thing on screen): its lines joined,
    indentation dropped, e.g. `p.yaml: invalid config: steps: Input should be > 0`."""
    return "; ".join(x.strip() for x in str(err).splitlines() if x.strip()).replace(":;", ":")


class _Section(BaseModel):
    # YAML reads .inf and .nan as floats; no value of this config means either
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class _Model(_Section):
    # ortho_sigma: the authors' polar-factor init; default: the model's own (what a model
    # named by its architecture alone means)
    init: Literal["default", "ortho_sigma"] = "default"


class MLPModel(_Model):
    """A small MLP: the built-in model for synthetic data (abtrain.models.mlp)."""

    name: Literal["mlp"]
    width: int = Field(gt=0)
    depth: int = Field(ge=1)


def _no_reserved(kwargs: dict[str, Any], reserved: tuple[str, ...]) -> dict[str, Any]:
    why = {
        "num_classes": "the number of classes comes from the data",
        "pretrained": "the weights are built from the seed on every rank, never downloaded",
    }
    given = [k for k in reserved if k in kwargs]
    if given:
        raise ValueError("; ".join(f"{k} may not be given: {why[k]}" for k in given))
    return kwargs


class TimmModel(_Model):
    """Any timm architecture by name, e.g. vit_base_patch16_224, resnet50, vgg16, built as
    timm.create_model(arch, pretrained=False, num_classes=<the data's>, **kwargs)."""

    name: Literal["timm"]
    arch: str = Field(min_length=1)
    # the model's own arguments (timm's names: drop_rate, img_size...); none: timm's own
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arch")
    @classmethod
    def _known(cls, arch: str) -> str:
        # here rather than on every rank inside the run: a typo fails before anything starts
        check_timm_arch(arch)
        return arch

    @field_validator("kwargs")
    @classmethod
    def _kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return _no_reserved(kwargs, ("num_classes", "pretrained"))


class PythonModel(_Model):
    """A user's own model: `factory` "package.module:function" is imported on every rank and
    called as function(num_classes=<the data's>, **kwargs); it must return an nn.Module."""

    name: Literal["python"]
    factory: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("factory")
    @classmethod
    def _spec(cls, factory: str) -> str:
        split_spec(factory)  # the form only: the module is imported where the model is built
        return factory

    @field_validator("kwargs")
    @classmethod
    def _kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return _no_reserved(kwargs, ("num_classes",))


ModelConfig = Annotated[MLPModel | TimmModel | PythonModel, Field(discriminator="name")]


def comparison_point(model: str, data: str, nodes: int, ranks_per_node: int, batch: int) -> str:
    """The one answer to "is this DDP run the baseline of that run?": it is when both give
    the same point, the same model (`model_label`) and data on the same nodes × ranks per
    node with the same batch per rank. `compare`, the report and MLflow all ask it here."""
    return f"{model} on {data}: {nodes}x{ranks_per_node}, {batch}/rank"


def model_label(model: ModelConfig | Mapping[str, Any]) -> str:
    """A short name for the model, for tags and for pairing a run with its baseline:
    the timm architecture, the factory's function name, or "mlp". Takes a run's saved
    config too (a mapping); one from before timm (name: vit, resnet50, vgg16) gives its name.
    """
    m = model if isinstance(model, Mapping) else model.model_dump()
    if m["name"] == "timm":
        return m["arch"]
    if m["name"] == "python":
        return split_spec(m["factory"])[1].rpartition(".")[2]
    return m["name"]


class SyntheticData(_Section):
    name: Literal["synthetic"]
    features: int = Field(gt=0)
    classes: int = Field(ge=2)
    train_samples: int = Field(gt=0)
    val_samples: int = Field(gt=0)


class ImageData(_Section):
    """A real image data set, read by `python -m abtrain prepare` into `prepared`."""

    name: Literal["cifar10", "cifar100", "imagefolder", "imagenet"]
    source: str | None  # archive or folder; None: torchvision's download (CIFAR only)
    sha256: str | None  # of an archive source; CIFAR's own archives are checked anyway
    prepared: str  # folder the prepare step writes and training reads
    train_per_class: int = Field(ge=0)  # stratified subset; 0: all
    val_per_class: int = Field(ge=0)
    # ImageNet's ReaL labels (real.json: one list per validation image, in file-number
    # order): an image without one is left out of validation, the rest scored with their
    # original labels. None: every image
    real_labels: str | None
    # which images real.json keeps out: `labelled` the ones it gives no label (the intent);
    # `authors` the ones at those positions of ImageFolder's class-by-class order, as the
    # authors' `use_real` deleted them (docs/choices.md). Only with real_labels
    real_subset: Literal["labelled", "authors"] | None = None
    image_size: int = Field(gt=0)  # training crop; small sizes are cached as tensors
    augment: bool
    workers: int = Field(ge=0)  # decoding processes for images read from files; 0: in-process

    @model_validator(mode="after")
    def _source(self) -> ImageData:
        if self.source is None and self.name not in ("cifar10", "cifar100"):
            raise ValueError(f"data.source is required for data set {self.name!r}")
        if self.real_labels is not None and self.name != "imagenet":
            raise ValueError(f"data.real_labels is for ImageNet's validation set, not {self.name}")
        if (self.real_labels is None) != (self.real_subset is None):
            raise ValueError(
                "data.real_subset (labelled | authors) goes with data.real_labels, and only "
                "with it: which of ImageNet's validation images real.json keeps out"
            )
        return self


DataConfig = Annotated[SyntheticData | ImageData, Field(discriminator="name")]


def _scalar_as_str(v: Any) -> Any:
    # a tag given on the command line as `batch: 32` is meant as the text "32"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return str(v)
    return v


TagValue = Annotated[str, BeforeValidator(_scalar_as_str), Field(max_length=5000)]
TagKey = Annotated[str, Field(min_length=1, max_length=250, pattern=r"^[\w\-. /]+$")]


class TrackingConfig(_Section):
    enabled: bool
    uri: str | None  # None: sqlite:///mlflow.db in the working directory
    experiment: str
    # None: method-model-dataset-<nodes>x<ranks per node>-b<batch per rank>
    run_name: str | None = Field(min_length=1, max_length=250)
    tags: dict[TagKey, TagValue]  # set on the run, beside abtrain's own
    log_model: bool  # the final merged model as an MLflow model, with a signature
    required: bool  # false: train on without tracking if the store can't be reached
    log_every: int = Field(gt=0)  # steps between per-step metric rows
    # one ledger row per collective per rank (ledger.jsonl): steps x buckets x ranks rows,
    # for short runs and tests; otherwise per-step aggregates only (ledger.csv)
    ledger_rows: bool


class OptimConfig(_Section):
    lr: float = Field(gt=0)
    min_lr: float = Field(ge=0)
    lr_warmup_steps: int = Field(ge=0)
    weight_decay: float = Field(ge=0)
    betas: list[Annotated[float, Field(ge=0, lt=1)]] = Field(min_length=2, max_length=2)
    max_grad_norm: float  # <= 0 turns clipping off
    label_smoothing: float = Field(ge=0, lt=1)
    # abtrain: a linear warm-up from lr/(W+1), then cosine to min_lr. authors: timm's
    # CosineLRScheduler as the authors' trainer ran it: its first step at the peak lr (the
    # scheduler is built before their trainer replaces the optimizer's param groups), then
    # a warm-up from min_lr and the cosine (abtrain.method.schedule.scheduled_lr)
    schedule: Literal["abtrain", "authors"]


class ABConfig(_Section):
    warmup_steps: int = Field(ge=0)
    ab_steps: int = Field(gt=0)
    rebound_steps: int = Field(ge=0)
    # algorithm1: cycles counted from the warm-up's end; authors: syncs at multiples of
    # ab_steps + rebound_steps, as the authors' code runs them
    phase_rule: Literal["algorithm1", "authors"]
    lr_rebound_steps: int = Field(ge=0)
    # abtrain: the scheduled LR times a ramp (i+1)/(N+1) after each change; authors: their
    # min(scheduled, f·i), f = (the LR at the change - min_lr)/N (abtrain.method.schedule)
    lr_rebound: Literal["abtrain", "authors"]
    sigma_cutoff: float = Field(gt=0, lt=1)
    # true: A = UΣ^½, B = Σ^½Vᵀ; false: the trained factor takes Σ (the authors' "no
    # groups" at c3dbc10: A = U, B = ΣVᵀ), which only a method whose ranks all train the
    # same factor admits (the sync averages A and B as they are)
    split_sigma: bool
    # with_stale (the paper's) | only_learned | rank0: no averaging, rank 0's state to
    # every rank (the authors' "no groups" at c3dbc10; ab_nogroups only)
    sync_mode: Literal["with_stale", "only_learned", "rank0"]
    group_size: int | None = Field(gt=0)  # None: the ranks of one node
    full_rank_layers: list[str] | None  # None: first and last weight layer
    optimizer_state: Literal["carry", "reset"]


class PowerSGDConfig(_Section):
    rank: int = Field(ge=1)
    start_iter: int = Field(ge=2)  # torch requires > 1 with error feedback
    error_feedback: bool
    warm_start: bool


class LocalSGDConfig(_Section):
    """Post-local SGD: DDP over the world for `warmup_steps`, then DDP inside each node with
    the parameters averaged across nodes every `period` steps. `schedule: ab` follows AB's
    phases (`ab.*`) instead, a local phase in place of each AB phase: AB without its
    factorisation, the matched ablation."""

    warmup_steps: int = Field(ge=0)
    period: int = Field(gt=0)
    schedule: Literal["own", "ab"]


class DiLoCoConfig(_Section):
    """DiLoCo (Douillard et al. 2023): the run's optimizer inside each node, and every
    `period` steps an outer SGD step with Nesterov momentum on the averaged pseudo-gradient."""

    warmup_steps: int = Field(ge=0)
    period: int = Field(gt=0)
    outer_lr: float = Field(gt=0)
    outer_momentum: float = Field(ge=0, lt=1)


class DistConfig(_Section):
    backend: Literal["auto", "gloo", "nccl"]
    timeout_s: int = Field(gt=0)
    bucket_cap_mb: float = Field(gt=0)
    # BatchNorm's batch statistics (abtrain.distributed.batchnorm). local: each rank's own, as
    # torchvision's BatchNorm. group: over the phase's DDP group with all-reduces, so an AB
    # phase keeps its promise of no traffic across groups. world: as the authors' runs
    # (torch's SyncBatchNorm over the world): the statistics all-gathered from every rank
    # on every step, AB phases included, a cost that grows with the world
    sync_batchnorm: Literal["local", "group", "world"]


class EarlyStop(_Section):
    """The authors' early stopping (their ImageNet configs): stop once `after` of the run's
    evaluations are done (counted from 0, as their epochs) with the best top-1 below
    `min_top1` percent."""

    after: float = Field(gt=0, le=1)
    min_top1: float = Field(ge=0, le=100)


# The schedule's step counts may be given as fractions of the run's `steps` (a number
# strictly between 0 and 1: `ab.warmup_steps: 0.2`), so that a shorter or longer run keeps
# its shape; they are resolved to steps when the config is read (config.json holds steps).
SCHEDULE_KEYS = (
    ("optim", "lr_warmup_steps"),
    ("ab", "warmup_steps"),
    ("ab", "ab_steps"),
    ("ab", "rebound_steps"),
    ("ab", "lr_rebound_steps"),
    ("localsgd", "warmup_steps"),
    ("localsgd", "period"),
    ("diloco", "warmup_steps"),
    ("diloco", "period"),
)
STEP_FLOORS = {
    ("ab", "ab_steps"): 1,
    ("ab", "rebound_steps"): 1,
    ("localsgd", "period"): 1,
    ("diloco", "period"): 1,
}  # a phase of 0 steps: none


def to_steps(fraction: float, steps: int, *, floor: int) -> int:
    """A schedule knob given as a fraction of a run's `steps`, in steps: the nearest whole
    number, `floor` at the least. The one rule of the config, the search and the matrix."""
    return max(floor, round(fraction * steps))


def resolve_fractions(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each schedule key given as a fraction of `steps` in steps (a copy where
    one is; ConfigError naming a key whose number is neither)."""
    steps = data.get("steps")
    out = data
    for section, key in SCHEDULE_KEYS:
        given = data.get(section)
        value = given.get(key) if isinstance(given, dict) else None
        if not isinstance(value, float):
            continue
        if value.is_integer():  # 80.0 or 0.0: a number of steps written as a float
            value = int(value)
        elif not 0 < value < 1:
            raise ConfigError(
                f"{section}.{key}: {value} is neither a number of steps nor a fraction of "
                "steps (a number strictly between 0 and 1)"
            )
        elif not isinstance(steps, int):
            continue  # `steps` itself is refused by the validation
        else:
            value = to_steps(value, steps, floor=STEP_FLOORS.get((section, key), 0))
        if out is data:
            out = {**data}
        out[section] = {**out[section], key: value}
    return out


class MethodConfig(_Section):
    """What the method reads (`ABTraining`): which method, how long, its seed and knobs.

    Built from a file or a mapping with every key, or by `abtrain.method.guidelines.method_config`
    from the paper's guidelines and a few keywords."""

    method: Method
    seed: int
    steps: int = Field(gt=0)
    ab: ABConfig
    powersgd: PowerSGDConfig
    localsgd: LocalSGDConfig
    diloco: DiLoCoConfig
    dist: DistConfig

    def __init__(self, **data: Any) -> None:
        data = resolve_fractions(data)
        try:
            super().__init__(**data)
        except ValidationError as err:  # one line per key, not pydantic's dump
            raise ConfigError(_format(err, data) + _hint(type(self), data)) from None
        # (pydantic calls this from model_validate too: validate through `validate()`)

    @model_validator(mode="after")
    def _consistent_method(self) -> MethodConfig:
        ab_method = self.method in AB_METHODS
        if ab_method and self.ab.warmup_steps >= self.steps:
            raise ValueError("ab.warmup_steps must be smaller than steps, or no AB phase runs")
        local = getattr(self, self.method, None)
        if isinstance(local, LocalSGDConfig) and local.schedule == "ab":
            if self.ab.warmup_steps >= self.steps:
                raise ValueError(
                    "ab.warmup_steps must be smaller than steps (localsgd.schedule=ab follows "
                    "AB's phases), or no local phase runs"
                )
        elif isinstance(local, LocalSGDConfig | DiLoCoConfig) and local.warmup_steps >= self.steps:
            raise ValueError(
                f"{self.method}.warmup_steps must be smaller than steps, or the nodes never "
                "train on their own"
            )
        if not self.ab.split_sigma and ab_method and self.method != "ab_nogroups":
            raise ValueError(
                f"ab.split_sigma=false needs every rank to train the same factor "
                f"(ab_nogroups); {self.method} averages A and B trained in different forms"
            )
        if self.ab.sync_mode == "rank0" and ab_method and self.method != "ab_nogroups":
            raise ValueError(
                f"ab.sync_mode=rank0 (rank 0's state to every rank, the authors' no-groups "
                f"runs at c3dbc10) is for ab_nogroups; {self.method} would drop the other "
                "groups' factor"
            )
        return self

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Config(MethodConfig):
    """A whole training run (`abtrain train`): the method's part, and the model, data,
    optimizer, evaluation, checkpoints and tracking around it."""

    batch_size: int = Field(gt=0)  # per rank
    # the seed of the order the training data is drawn in; None: the run's seed. The
    # authors' DistributedSampler kept 0 whatever their run's seed (docs/choices.md)
    data_seed: int | None
    eval_every: int = Field(gt=0)  # steps between evaluations (the per-epoch metrics)
    # plain: cross-entropy; smoothed: the training's criterion (optim.label_smoothing), as
    # the authors' validate scores it (the paper's validation losses)
    val_loss: Literal["plain", "smoothed"]
    bf16: bool  # autocast the forward pass to bfloat16
    checkpoint_every: int = Field(ge=0)  # 0: only at the end
    keep_checkpoints: int = Field(ge=1)
    early_stopping: list[EarlyStop]  # [] never stops early
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    tracking: TrackingConfig

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if self.optim.min_lr > self.optim.lr:
            raise ValueError("optim.min_lr must not exceed optim.lr")
        return self


METHOD_KEYS = tuple(MethodConfig.model_fields)


def _hint(cls: type, data: Mapping[str, Any]) -> str:
    if cls is MethodConfig or set(data) <= set(METHOD_KEYS):
        return (
            "\n  (for the method alone, abtrain.method_config(steps=N, ...) fills every key "
            "not given with the paper's guidelines)"
        )
    return ""


def _format(err: ValidationError, raw: dict[str, Any]) -> str:
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        # a tagged section (model, data) puts its tag in the path: model.vit.width -> model.width
        section = raw.get(loc[0]) if loc else None
        if len(loc) > 1 and isinstance(section, dict) and loc[1] == section.get("name"):
            del loc[1]
        key = ".".join(str(p) for p in loc) or "<config>"
        lines.append(f"  {key}: {e['msg']}")
    return "invalid config:\n" + "\n".join(lines)


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last, so
    `lr: 0.002` then `lr: 0.2` would train at 0.2 without a word)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(
                f"{key_node.start_mark.name}:{line}: key {key!r} is given twice in one mapping "
                f"(first at line {seen[key]}); remove one"
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)
# YAML 1.1 reads 1e30 (no dot) as a string; as a value here it can only mean the number
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def read_yaml(path: str | Path) -> Any:
    """A YAML file, refusing duplicate keys (ConfigError naming the file, line and key)."""
    path = Path(path)
    with open(path) as f:
        return yaml.load(f, Loader=_StrictLoader)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (['a', 'b'], value); the value is read as YAML (so 3, 0.1, true, [x])."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    try:
        value = yaml.load(raw, Loader=_StrictLoader) if raw else ""
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(
            f"override {text!r}: the value of {key} is not valid YAML ({problem})"
        ) from None
    if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        value = float(value)
    return key.split("."), value


# values that are free mappings rather than sections: `--set tracking.tags.scale=2x2` adds a key
FREE_MAPPINGS = {("tracking", "tags"), ("model", "kwargs")}


def apply_overrides(
    raw: dict[str, Any], overrides: list[str], free: bool = False
) -> dict[str, Any]:
    """`overrides` (key=value) applied to `raw` in place. A key not in `raw` is refused,
    unless `free` (a partial file whose missing keys come from elsewhere: sections are
    made as needed; what is unknown is refused where the whole is validated)."""
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            if free and part not in node:
                node[part] = {}
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"override {text!r}: {'.'.join(path[:-1])} is not a section")
            node = node[part]
        if path[-1] not in node and tuple(path[:-1]) not in FREE_MAPPINGS and not free:
            raise ConfigError(f"override {text!r}: unknown key {'.'.join(path)}")
        node[path[-1]] = value
    return raw


def from_dict(raw: dict[str, Any], overrides: list[str] = ()) -> Config:
    import copy

    return validate(Config, apply_overrides(copy.deepcopy(raw), list(overrides)))


def validate(cls: type[MethodConfig], raw: dict[str, Any]) -> Any:
    """`raw` as a `cls` (Config or MethodConfig); ConfigError naming each key at fault."""
    odd = [k for k in raw if not isinstance(k, str)]
    if odd:
        raise ConfigError(f"invalid config:\n  {odd[0]!r}: not a key of the config")
    # through the constructor, which words the errors (pydantic would wrap its words again)
    return cls(**raw)


def load(path: str | Path, overrides: list[str] = (), section: str = "train") -> Config:
    """Read a whole run's config file, every key required. A file with a top-level `section`
    (params.yaml) is read from it. (A file of the method's keys alone:
    `abtrain.method.guidelines.load_config`.)"""
    path = Path(path)
    raw = read_mapping(path, section)
    try:
        return from_dict(raw, overrides)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def read_mapping(path: Path, section: str = "train") -> dict[str, Any]:
    """A config file's mapping (its `section`, where it has one); ConfigError naming the
    file where it is missing, not YAML or not a mapping."""
    try:
        raw = read_yaml(path)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping")
    return raw[section] if isinstance(raw.get(section), dict) else raw


# Settings that change no number a run trains: where it reports (MLflow), how long a peer
# may take, how many checkpoints stay on disk. A run may resume with other values of them.
NOT_TRAINING = ("tracking", "dist.timeout_s", "keep_checkpoints")


def training_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ and change what is trained."""
    return [
        k
        for k in diff_keys(old, new)
        if not any(k == x or k.startswith(x + ".") for x in NOT_TRAINING)
    ]


def diff_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out
