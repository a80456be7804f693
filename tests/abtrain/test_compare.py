"""`python -m abtrain compare`: each run against the ddp run of its own scale and batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abtrain.__main__ import main
from tests.helpers import ROOT


def run_folders(dest: Path) -> list[Path]:
    """The committed runs (results/NAME.json) as run folders as the trainer leaves them: the
    summary as it was written then (without batch_size), and config.json beside it."""
    folders = []
    for path in sorted((ROOT / "results").glob("*.json")):
        summary = json.loads(path.read_text())
        run = summary.pop("run")
        folder = dest / path.stem
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps(summary))
        config = {
            "batch_size": run["global_batch"] // summary["world_size"],
            "model": {"name": "vit"},
            "data": {"name": "imagefolder"},
        }
        (folder / "config.json").write_text(json.dumps(config))
        folders.append(folder)
    return folders


def table(capsys, folders: list[Path]) -> dict[str, list[str]]:
    assert main(["compare", *map(str, folders)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "run"
    return {line.split()[0]: line.split() for line in lines[1:]}


def test_every_run_is_measured_against_the_ddp_run_of_its_own_scale(tmp_path, capsys):
    folders = run_folders(tmp_path)
    assert {"ddp-2x2", "ab-2x2", "ddp-2x1-local", "ab-2x1-global"} <= {f.name for f in folders}
    rows = table(capsys, folders)
    assert set(rows) == {f.name for f in folders}  # rows are named
    for name, row in rows.items():
        if row[1] == "ddp":
            assert row[-1] == "1.000", name
    mb = {name: float(row[-2]) for name, row in rows.items()}
    for ab, ddp in (
        ("ab-2x2", "ddp-2x2"),
        ("ab-2x1-local", "ddp-2x1-local"),
        ("ab-2x1-global", "ddp-2x1-global"),
        ("abng-2x1-global", "ddp-2x1-global"),
        ("abps-2x2", "ddp-2x2"),
        ("psgd-2x2", "ddp-2x2"),
    ):
        assert float(rows[ab][-1]) == pytest.approx(mb[ab] / mb[ddp], abs=1e-3), ab
    assert rows["ab-2x2"][2:4] == ["2x2", "32/128"]
    assert rows["ab-2x1-global"][2:4] == ["2x1", "64/128"]  # constant global batch
    assert rows["ab-2x1-local"][2:4] == ["2x1", "32/64"]


def test_a_run_without_its_own_ddp_reads_a_dash(tmp_path, capsys):
    folders = {f.name: f for f in run_folders(tmp_path)}
    rows = table(capsys, [folders["ddp-2x2"], folders["ab-2x1-local"], folders["ab-2x2"]])
    assert rows["ab-2x1-local"][-1] == "—"  # 2 ranks: ddp-2x2 is not its baseline
    assert rows["ab-2x2"][-1] != "—"


def test_a_summary_with_its_batch_needs_no_config(tmp_path, capsys):
    folder = run_folders(tmp_path)[0]
    summary = json.loads((folder / "summary.json").read_text())
    summary["batch_size"] = 64
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.json").unlink()
    assert table(capsys, [folder])[folder.name][3] == "64/128"
    summary.pop("batch_size")
    (folder / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(folder)]) == 2
    assert "batch_size" in capsys.readouterr().err
