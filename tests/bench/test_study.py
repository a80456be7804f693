"""The studies' skeleton (bench.study), on a study of its own whose runs are Python calls
(no training): the estimate before any run, a killed study continued without training its
finished runs again, the ETA, and the record, sentence, figure and page made from the
aggregated numbers and rendered again byte for byte from the record alone. And every
committed study's files, rendered again from its committed record, byte for byte."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import lengths, search_reruns, seeds, study, table2
from bench.study import Run
from tests.helpers import ROOT


@dataclass
class Toy(study.Study):
    """Three runs, each leaving a summary.json with a value; the record: their mean."""

    name, record, keys = "toy", "toy.json", ("values",)
    figure_file = "toy.png"
    basis = "ten seconds a run"

    runs_dir: Path = Path("runs")
    launch: Callable[[Run], None] | None = None  # each run's, in place of training

    def runs(self) -> list[Run]:
        return [
            Run(
                f"run {i}",
                self.runs_dir / f"r{i}",
                seconds=10.0,
                info=dict(i=i),
                launch=self.launch,
            )
            for i in range(3)
        ]

    def aggregate(self, runs: list[Run]) -> dict[str, Any]:
        values = [json.loads((r.folder / "summary.json").read_text())["value"] for r in runs]
        return dict(command=self.command, values=values, mean=statistics.fmean(values))

    def refresh(self, data: dict[str, Any]) -> dict[str, Any]:
        data["mean"] = statistics.fmean(data["values"])
        return data

    def sentence(self, data: dict[str, Any]) -> str:
        return f"The runs' mean value is {data['mean']:.1f} over {len(data['values'])} runs."

    def figure(self, data: dict[str, Any], path: Path) -> None:
        from pipeline import style

        with style.matplotlib_defaults() as plt:
            fig, ax = plt.subplots(figsize=(3, 2))
            ax.bar(range(len(data["values"])), data["values"])
            ax.axhline(data["mean"])
            style.save(fig, path, dpi=50)

    def page(self, data: dict[str, Any]) -> str:
        return f"# Toy\n\n**{data['verdict']}**\n"


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"render": False, "dry_run": False, "report_only": False, **kw})


def test_a_killed_study_continues_without_training_its_finished_runs_again(tmp_path, capsys):
    trained, said = [], []

    def launch(run: Run) -> None:
        said.append(capsys.readouterr().out)  # what was printed before this run started
        if run["i"] == 1 and not trained[1:]:
            trained.append(f"{run.name} killed")
            raise KeyboardInterrupt  # killed halfway: its folder holds no summary
        run.folder.mkdir(parents=True)
        (run.folder / "summary.json").write_text(json.dumps({"value": 10 * (run["i"] + 1)}))
        trained.append(run.name)

    toy = Toy(tmp_path / "out", "python -m toy", tmp_path / "runs", launch)
    with pytest.raises(KeyboardInterrupt):
        study.conduct(toy, args(runs_dir=toy.runs_dir))
    # the estimate came before the first run started, then each run's line with its ETA
    assert said[0].splitlines() == [
        "[bench.toy] 3 runs (0 finished); the rest about 30 s on this machine (ten seconds a run)",
        "[bench.toy] run 1 of 3: run 0; elapsed 0 s, ETA 30 s",
    ]
    assert said[1].startswith("[bench.toy] run 2 of 3: run 1; elapsed 0 s, ETA ")
    assert not (tmp_path / "out").exists()

    assert study.conduct(toy, args(runs_dir=toy.runs_dir)) == 0
    assert trained == ["run 0", "run 1 killed", "run 1", "run 2"]  # run 0 not again
    out = said[2] + capsys.readouterr().out
    assert "[bench.toy] 3 runs (1 finished); the rest about 20 s" in out
    assert "[bench.toy] run 1 of 3: finished, read from " + str(tmp_path / "runs" / "r0") in out
    # the record, its sentence and its figure from the aggregated numbers
    data = json.loads((tmp_path / "out" / "toy.json").read_text())
    assert data["values"] == [10, 20, 30] and data["mean"] == 20.0
    assert data["verdict"] == "The runs' mean value is 20.0 over 3 runs."
    assert out.rstrip().endswith(data["verdict"])  # the command's last words
    assert data["verdict"] in (tmp_path / "out" / "README.md").read_text()
    assert (tmp_path / "out" / "toy.png").stat().st_size > 1000
    assert (tmp_path / "runs" / "r2" / "launch_seconds.txt").exists()

    # --render: the same files again from the record alone, no run folder read
    made = {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()}
    shutil.rmtree(tmp_path / "runs")
    assert study.conduct(toy, args(render=True)) == 0
    assert {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()} == made


def test_a_dry_run_lists_the_runs_and_trains_none(tmp_path, capsys):
    def launch(run: Run) -> None:
        raise AssertionError("a dry run trains nothing")

    toy = Toy(tmp_path / "out", "python -m toy", tmp_path / "runs", launch)
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "summary.json").write_text('{"value": 1}')
    assert study.conduct(toy, args(dry_run=True)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[bench.toy] 3 runs (1 finished); the rest about 20 s")
    assert lines[1].split() == ["run", "1", "of", "3", "run", "0", "~10", "s"]
    assert lines[2].endswith(f"finished ({tmp_path / 'runs' / 'r1'})")
    assert not (tmp_path / "out").exists()


def test_the_eta_scales_the_prediction_by_the_pace_of_the_runs_done():
    assert study.eta(0.0, [], [10.0, 20.0]) == "30 s"  # before any: the prediction
    assert study.eta(40.0, [10.0], [20.0, 30.0]) == "3m20s"  # 4x slower than predicted
    assert study.eta(60.0, [None], [None, None]) == "2m00s"  # no prediction: the mean
    assert study.eta(0.0, [], [None]) == "?"
    assert study.eta(90.0, [30.0], []) == "0 s"


def test_a_run_is_launched_as_the_pipeline_launches_one(tmp_path):
    run = Run("x", tmp_path / "x", ["seed=1", "steps=4"], 2, 1, config="profiles/table2.yaml")
    cmd = run.command()
    assert cmd[1:] == [
        "-m", "abtrain.launch", "--nnodes", "2", "--nproc-per-node", "1", "train",
        "--config", "profiles/table2.yaml", "--set", "seed=1", "--set", "steps=4",
        "--out", str(tmp_path / "x"),
    ]  # fmt: skip


# ------------------------------------------------- the committed studies, rendered again
COMMITTED = [
    (lengths.main, "reports/lengths", ("lengths.json", "README.md", "lengths.png")),
    (search_reruns.main, "reports/search-reruns", ("reruns.json", "README.md")),
    (table2.main, "reports/table2", ("table2.json", "tables.md", "table2.png")),
    *(
        (seeds.main, f"reports/{d.name}", ("seeds.json", "README.md"))
        for d in sorted(ROOT.glob("reports/seeds*"))
    ),
]


@pytest.mark.parametrize(("main", "folder", "files"), COMMITTED, ids=[c[1] for c in COMMITTED])
def test_every_committed_study_renders_its_files_byte_for_byte(
    main, folder, files, tmp_path, monkeypatch, capsys
):
    """The redesign moved code, not numbers: --render, from the committed record alone,
    writes every file of the committed study as it is."""
    monkeypatch.chdir(ROOT)
    shutil.copy(ROOT / folder / files[0], tmp_path / files[0])
    assert main(["--render", "--out", str(tmp_path)]) == 0
    for name in files:
        assert (tmp_path / name).read_bytes() == (ROOT / folder / name).read_bytes(), name
