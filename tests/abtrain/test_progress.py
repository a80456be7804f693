"""What a run prints off a terminal: the step of how many, and the line it ends with."""

from __future__ import annotations

import re

from abtrain.__main__ import done_line
from abtrain.run.progress import Progress


def run_through(progress: Progress, steps: range) -> None:
    progress.start(steps.start)
    for step in steps:
        progress.step_done(step, "ab loss 1.0")
    progress.close()


def test_log_lines_count_the_steps_done_of_the_run(capsys):
    run_through(Progress(rank=0, steps=156), range(156))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "s/step" in ln]
    done = [int(re.match(r"\[abtrain\] step +(\d+) of 156 ab loss", ln)[1]) for ln in lines]
    # 1-based as tqdm's bar and the evaluation lines: after the first step, and the last
    assert done[0] == 1 and done[-1] == 156 and done == sorted(set(done))
    assert lines[-1].endswith("ETA 0:00:00")


def test_a_resumed_run_counts_on_from_its_step(capsys):
    run_through(Progress(rank=0, steps=156), range(100, 156))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "s/step" in ln]
    assert "step 106 of 156" in lines[0] and "step 156 of 156" in lines[-1]


def test_other_ranks_print_nothing(capsys):
    run_through(Progress(rank=1, steps=20), range(20))
    assert capsys.readouterr().out == ""


def summary(tops: list[float]) -> dict:
    evals = [dict(step=10 * (i + 1), val_top1=t) for i, t in enumerate(tops)]
    return dict(
        val_top1=dict(best=max(tops), final=tops[-1]),
        evals=evals,
        traffic=dict(inter_node_bytes=12_345_678),
    )


def test_the_done_line_gives_the_best_and_where_besides_the_final():
    line = done_line(summary([20.0, 34.05, 31.5, 34.05, 33.0]), "runs/x")
    assert line == (
        "done: best val top1 34.05% (step 20), final 33.00%, inter-node 12.35 MB/rank, "
        "summary in runs/x/summary.json"
    )
