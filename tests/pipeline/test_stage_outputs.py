"""What DVC may delete: no output of any stage, committed or not, is removed before its stage
runs (a stage that fails would leave none); the failure itself, through `dvc exp run`, is
tests/pipeline/test_pipeline.py's."""

import yaml

from tests.helpers import ROOT


def outputs(stage: dict) -> list[tuple[str, dict]]:
    found = []
    for kind in ("outs", "metrics", "plots"):
        for item in stage.get(kind, []):
            path, opts = next(iter(item.items())) if isinstance(item, dict) else (item, {})
            found.append((path, opts or {}))
    return found


def test_every_output_persists_and_lives_in_git():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    seen = 0
    for name, stage in stages.items():
        for path, opts in outputs(stage.get("do", stage)):
            assert opts.get("persist") is True, f"{name}: {path} is deleted before the stage runs"
            assert opts.get("cache") is False, f"{name}: {path}"
            seen += 1
    assert seen >= 17
