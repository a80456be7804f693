"""The skeleton every study of bench/ fills in. A study trains a list of runs and turns what
they leave in their folders into a record (JSON), a figure and a page; this module is the
part they share, read top to bottom:

    runs       the study's runs (`Study.runs`): each a name, its overrides, its launch
               shape, its folder and its estimated seconds
    estimate   "N runs (k finished); the rest about T", printed before anything trains
               (--dry-run lists the runs and stops there)
    train      each run not finished, launched as the pipeline launches one (`python -m
               abtrain.launch`), with "run k of N: ...; elapsed ..., ETA ..." before it. A
               folder holding its summary is read, not trained again; one without is
               resumed from its last checkpoint by the launcher: a killed study continues
    report     the finished runs' record (`Study.aggregate`), its sentence
               (`Study.sentence`), its figure and its page, each file written whole
    render     the summary, sentence, figure and page again from the committed record
               alone (--render): run folders stay on the machine that trained them

A study module subclasses `Study`, gives it a `main` that reads its own options (`options`
adds the shared ones), and hands both to `conduct`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from abtrain.config import ConfigError
from abtrain.files import atomic_write_text, hold, read_record, write_record
from abtrain.run.progress import duration

LAUNCH_SECONDS = 15.0  # start-up and rendezvous a run adds to its training (estimates)


@dataclass
class Run:
    """One run of a study: what the progress lines call it, where it trains, how it is
    launched and about how long it takes."""

    name: str  # how the lines name it: "ab-2x2 at 4 epochs, seed 1"
    folder: Path
    sets: list[str] = field(default_factory=list)  # its --set overrides of `config`
    nodes: int = 1
    ranks_per_node: int = 1
    config: str = "params.yaml"
    seconds: float | None = None  # estimated before it runs; None: nothing to estimate from
    info: dict[str, Any] = field(default_factory=dict)  # the study's own: epochs, seed, ...
    done: str = "summary.json"  # the file in `folder` that says the run finished
    # how it runs where `python -m abtrain.launch` with `sets` is not how (a search; a run
    # whose overrides come from a search that runs before it)
    launch: Callable[[Run], None] | None = None

    def __getitem__(self, key: str) -> Any:
        """The study's own fields, read as the row the run becomes: run["epochs"]."""
        return self.info[key] if key in self.info else getattr(self, key)

    @property
    def finished(self) -> bool:
        return (self.folder / self.done).exists()

    def command(self) -> list[str]:
        """The launcher's command line: one torchrun per node, as the pipeline starts a run."""
        args = [sys.executable, "-m", "abtrain.launch", "--nnodes", str(self.nodes)]
        args += ["--nproc-per-node", str(self.ranks_per_node), "train", "--config", self.config]
        for s in self.sets:
            args += ["--set", s]
        return [*args, "--out", str(self.folder)]


@dataclass
class Study:
    """What a study fills in (a subclass is a dataclass of its own options). The skeleton
    calls `runs`, `found` for each run, then `aggregate`, `sentence`, `figure` and `page`
    (on --render `refresh` in the place of `aggregate`), and prints `closing`."""

    out: Path  # where the record, figure and page go
    command: str = ""  # the command line the page names, to reproduce it

    name: ClassVar[str] = ""  # bench.NAME: its module and its lines' prefix
    record: ClassVar[str] = ""  # the record in `out`: every figure the page and figure need
    keys: ClassVar[tuple[str, ...]] = ()  # what a record must hold to be rendered from
    figure_file: ClassVar[str | None] = None  # its figure in `out`, if it draws one
    page_file: ClassVar[str | None] = "README.md"  # None: the report is its page
    indent: ClassVar[int] = 2  # the record's JSON indent (the committed records' own)
    basis: ClassVar[str] = ""  # how `runs` estimates a run's seconds, said with the estimate

    def runs(self) -> list[Run]:
        """Every run of the study, in the order it trains."""
        raise NotImplementedError

    def found(self, run: Run) -> str | None:
        """Where a finished run's figures are read from (its folder), or None: train it."""
        return str(run.folder) if run.finished else None

    def aggregate(self, runs: list[Run]) -> dict[str, Any]:
        """The record, from the finished runs of the plan."""
        raise NotImplementedError

    def refresh(self, data: dict[str, Any]) -> dict[str, Any]:
        """A record read back, its figures made again from its rows (--render)."""
        return data

    def recorded(self) -> dict[str, Any]:
        """What --render writes from: the committed record, refreshed."""
        how = f"python -m bench.{self.name}"
        return self.refresh(read_record(self.out / self.record, self.keys, how))

    def sentence(self, data: dict[str, Any]) -> str | None:
        """The study in one sentence, every number from `data` (the record's `verdict`);
        None where the study has none."""
        return None

    def figure(self, data: dict[str, Any], path: Path) -> None:
        """Draw `figure_file` from `data`."""

    def page(self, data: dict[str, Any]) -> str:
        """The study's Markdown page, from `data` alone."""
        raise NotImplementedError

    def closing(self, data: dict[str, Any]) -> str:
        """What the command prints when it is done: the sentence."""
        return data.get("verdict") or ""

    def say(self, text: str) -> None:
        print(f"[bench.{self.name}] {text}", flush=True)


# ---------------------------------------------------------------- the command line
def options(
    ap: argparse.ArgumentParser,
    runs_dir: Path,
    out: Path,
    runs_flags: Sequence[str] = (),
    out_flags: Sequence[str] = (),
) -> None:
    """The options every study answers; `runs_flags`, `out_flags`: other names of
    --runs-dir and --out."""
    ap.add_argument("--runs-dir", *runs_flags, type=Path, default=runs_dir, dest="runs_dir")
    ap.add_argument(
        "--out", *out_flags, type=Path, default=out, dest="out", help="the record, figure and page"
    )
    ap.add_argument("--dry-run", action="store_true", help="list the runs and their time")
    ap.add_argument("--report-only", action="store_true", help="read run folders, train none")
    ap.add_argument(
        "--render", action="store_true", help="write again from OUT's record; no run folders"
    )


def shown(module: str, argv: list[str] | None) -> str:
    """The command the page names: the one that trains (--report-only only re-reads)."""
    given = sys.argv[1:] if argv is None else argv
    return " ".join([f".venv/bin/python -m {module}", *(x for x in given if x != "--report-only")])


def conduct(study: Study, a: argparse.Namespace) -> int:
    """A study from its command line: --render; else the plan and its estimate (--dry-run
    stops there), the runs not finished (none with --report-only), and the report."""
    if a.render:
        data = render(study)
    else:
        runs = study.runs()
        found = [study.found(r) for r in runs]
        estimate(study, runs, found, listed=a.dry_run)
        if a.dry_run:
            return 0
        lock = occupy(study, a.runs_dir)  # every study's option (`options`: --runs-dir)
        try:
            if not a.report_only:
                train(study, runs, found)
            data = report(study, runs)
        finally:
            os.close(lock)
    print(study.closing(data), flush=True)
    return 0


def occupy(study: Study, runs_dir: Path) -> int:
    """The study's lock on its runs folder, or ConfigError before anything is touched: two
    studies of one folder would train its runs twice over and write one record. The
    processes the study starts (a search's mpirun) hold it too, so a study killed outright
    keeps it until they are gone."""
    path = runs_dir / ".study.lock"
    fd = hold(path)
    if fd is None:
        raise ConfigError(
            f"{runs_dir} is in use by another bench.{study.name} (it, or a process it started, "
            f"holds {path}): nothing started; wait for it to end, then run this again"
        )
    return fd


# ---------------------------------------------------------------- before and while training
def estimate(study: Study, runs: list[Run], found: list[str | None], listed: bool) -> None:
    """How many runs, how many finished, about how long the rest take; `listed`: each run."""
    left = [r.seconds for r, w in zip(runs, found) if not w]
    unknown = sum(s is None for s in left)
    about = duration(sum(s for s in left if s is not None))
    study.say(
        f"{len(runs)} runs ({len(runs) - len(left)} finished); the rest about {about} on this "
        f"machine ({study.basis})" + (f"; {unknown} of them with no estimate" if unknown else "")
    )
    if listed:
        for k, (r, where) in enumerate(zip(runs, found), 1):
            took = (
                f"finished ({where})"
                if where
                else "~" + (duration(r.seconds) if r.seconds is not None else "?")
            )
            print(f"  run {k:>2} of {len(runs)}  {r.name:<40} {took}", flush=True)


def eta(elapsed: float, done: Sequence[float | None], left: Sequence[float | None]) -> str:
    """The time the runs `left` will take: as predicted, scaled by how the runs `done` in
    `elapsed` seconds compared with their prediction (this machine's pace now); where a
    run has no prediction, the mean of the runs done, and "?" before any is."""
    if all(s is not None for s in [*done, *left]):
        before = sum(s for s in done if s is not None)
        pace = elapsed / before if before and elapsed else 1.0
        return duration(sum(s for s in left if s is not None) * pace)
    if done:
        return duration(elapsed / len(done) * len(left))
    return "?"


def train(study: Study, runs: list[Run], found: list[str | None]) -> None:
    """Every run of the plan not found finished, in order; the ETA from the runs trained
    in this session (a run read back took none of its time)."""
    n, started = len(runs), time.monotonic()
    todo = [r.seconds for r, where in zip(runs, found) if not where]
    done: list[float | None] = []
    trained = 0.0
    for k, (run, where) in enumerate(zip(runs, found), 1):
        if where:
            study.say(f"run {k} of {n}: finished, read from {where}")
            continue
        left = todo[len(done) :]
        study.say(
            f"run {k} of {n}: {run.name}; elapsed {duration(trained)}, "
            f"ETA {eta(trained, done, left)}"
        )
        try:
            trained += launch(run)
        except ConfigError as err:  # a value this run refuses: which run, not only which key
            raise ConfigError(f"run {k} of {n} ({run.name}): {err}") from None
        done.append(run.seconds)
    study.say(f"trained for {duration(time.monotonic() - started)}")


def launch(run: Run) -> float:
    """Train one run; its seconds, start-up included (kept in its folder as
    launch_seconds.txt: summary.json's wall_seconds is the training's alone)."""
    run.folder.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    (run.launch or start)(run)
    seconds = time.monotonic() - began
    if run.folder.is_dir():
        atomic_write_text(run.folder / "launch_seconds.txt", f"{seconds:.3f}\n")
    return seconds


def start(run: Run) -> None:
    """`python -m abtrain.launch` of the run. A failed run ends the study with the
    launcher's exit code (the cause is in its lines above); run again, the study resumes
    it from its last checkpoint."""
    code = subprocess.run(run.command()).returncode
    if code:
        print(
            f"[bench] error: {run.name} failed (exit {code}); its folder: {run.folder}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(code)


# ---------------------------------------------------------------- after training
def report(study: Study, runs: list[Run]) -> dict[str, Any]:
    """The record of the finished runs, its sentence, figure and page."""
    return write(study, study.aggregate(runs))


def render(study: Study) -> dict[str, Any]:
    """The same files again from the committed record alone."""
    return write(study, study.recorded())


def write(study: Study, data: dict[str, Any]) -> dict[str, Any]:
    """The record (with its sentence, `verdict`), the figure and the page, each written
    whole: a reader never sees half a page, and a failed write leaves the last one."""
    said = study.sentence(data)
    if said is not None:
        data["verdict"] = said
    study.out.mkdir(parents=True, exist_ok=True)
    write_record(study.out / study.record, data, indent=study.indent, end="\n")
    if study.figure_file:
        study.figure(data, study.out / study.figure_file)
    if study.page_file:
        atomic_write_text(study.out / study.page_file, study.page(data))
    return data


# ---------------------------------------------------------------- shared by the studies' plans
def stamp() -> str:
    """When a record was made, as every page says it."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def matrix_seconds(name: str, results: Path = Path("results"), scale: float = 1.0) -> float | None:
    """A run of the matrix's committed training time (results/NAME.json) times `scale`,
    plus start-up: the estimate of a study's run made from it (None without the record)."""
    path = results / f"{name}.json"
    if not path.exists():
        return None
    return LAUNCH_SECONDS + read_record(path, ("wall_seconds",))["wall_seconds"] * scale


# ---------------------------------------------------------------- python -m bench.study
# the modules built on it
STUDIES = ("lengths", "network", "rates", "seeds", "search_reruns", "table2", "tradeoff")


def main(argv: list[str] | None = None) -> int:
    """The skeleton runs no study of its own: it names those that fill it in."""
    from pipeline.stage import parser

    parser("bench.study", __doc__).parse_args(argv)
    print("the studies on this skeleton: " + ", ".join(f"python -m bench.{s}" for s in STUDIES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
