"""`python -m abtrain plan`: each method's predicted step and run time on a cluster and link,
and the method it recommends."""

from __future__ import annotations

import json

import pytest
import yaml

from abtrain import schedule
from abtrain.__main__ import main
from abtrain.config import ConfigError, from_dict
from abtrain.plan import data_classes, link_bytes_per_s
from tests.conftest import PARAMS, ROOT

UNSHAPED = ROOT / "bench/results/network-unshaped.json"


def planned_methods() -> list[str]:
    """The committed unshaped run's methods that ran with the shared settings alone (a
    method run with settings of its own, bench.network's --method-set, is left out)."""
    d = json.loads(UNSHAPED.read_text())
    own = d.get("method_overrides", {})
    return [r["method"] for r in d["results"] if not own.get(r["method"])]


def run_plan(capsys, link: str, *extra: str) -> tuple[dict[str, dict[str, float]], str]:
    d = json.loads(UNSHAPED.read_text())
    sets = [x for o in d["overrides"] for x in ("--set", o)]
    args = ["plan", "--config", str(PARAMS), *sets, "--nodes", "2", "--ranks-per-node", "2"]
    if not any(e.startswith("--methods") for e in extra):
        args += ["--methods", ",".join(planned_methods())]
    assert main([*args, "--link", link, "--compute", str(UNSHAPED), "--classes", "10", *extra]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) == 6 and cells[-1].endswith("x"):
            rows[cells[0]] = dict(step=float(cells[1]), run=float(cells[2]))
    return rows, out


def independent(link: float | None) -> dict[str, float]:
    """Each committed method's mean step time over `link`, without the planner: its measured
    unshaped phase times weighted by the schedule, plus the bytes the ledger counted per
    step on its node (2 ranks' worth) over the link."""
    d = json.loads(UNSHAPED.read_text())
    params = yaml.safe_load(PARAMS.read_text())
    out = {}
    for r in d["results"]:
        if r["method"] not in planned_methods():
            continue
        cfg = from_dict(params["train"], [f"method={r['method']}", *d["overrides"]])
        kinds = [schedule.phase_at(t, cfg).kind for t in range(cfg.steps)]
        compute = sum(r["step_seconds"][k] for k in kinds) / len(kinds)
        node_bytes = r["ledger_inter_node_bytes_by_node"]["0"] / r["steps"]
        out[r["method"]] = compute + (node_bytes / link if link else 0.0)
    return out


@pytest.mark.parametrize("link", ["200mbit", "none"])
def test_plan_recommends_what_the_measured_compute_and_bytes_imply(capsys, link):
    rows, out = run_plan(capsys, link)
    expected = independent(link_bytes_per_s(link))
    assert set(rows) == set(expected) == set(planned_methods()) >= {"ddp", "powersgd"}
    for m, seconds in expected.items():
        assert rows[m]["step"] == pytest.approx(seconds, rel=0.05), m
    fastest = min(expected, key=expected.get)
    assert f"recommended: {fastest} " in out
    assert "same number of steps" in out  # the assumption behind the recommendation
    if fastest != "ddp":
        speedup = rows["ddp"]["run"] / rows[fastest]["run"]
        assert f"{speedup:.2f}x the speed of ddp" in out
    rows, out = run_plan(capsys, link, "--methods", "ddp,ab_individual")
    assert "skipped ab_individual: no compute times" in out and set(rows) == {"ddp"}


def test_links_read_as_tc_rates_or_bytes_per_second():
    assert link_bytes_per_s("200mbit") == 25e6
    assert link_bytes_per_s("1gbit") == 125e6
    assert link_bytes_per_s("25e9") == 25e9
    assert link_bytes_per_s("none") is None
    with pytest.raises(ConfigError, match="200mbit"):
        link_bytes_per_s("fast")


def test_classes_come_from_the_prepared_data_or_a_clear_error(tmp_path):
    params = yaml.safe_load(PARAMS.read_text())
    cfg = from_dict(params["train"], [f"data.prepared={tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match="meta.json.*--classes"):
        data_classes(cfg)
    (tmp_path / "p").mkdir()
    (tmp_path / "p/meta.json").write_text(json.dumps({"classes": list("abc")}))
    cfg = from_dict(params["train"], [f"data.prepared={tmp_path / 'p'}"])
    assert data_classes(cfg) == (3, str(tmp_path / "p/meta.json"))


def test_a_compute_file_of_method_and_phase_seconds_is_read(tmp_path, capsys):
    f = tmp_path / "compute.json"
    f.write_text(json.dumps({"ddp": {"full": 0.3}, "powersgd": {"full": 0.34}}))
    args = ["plan", "--config", str(PARAMS), "--nodes", "4", "--ranks-per-node", "1"]
    args += ["--link", "1gbit", "--compute", str(f), "--classes", "10"]
    assert main([*args, "--methods", "ddp,powersgd"]) == 0
    out = capsys.readouterr().out
    assert "recommended: powersgd" in out
    f.write_text(json.dumps({"ddp": "fast"}))
    assert main(args) == 2
    assert "expected {method: {phase: seconds}}" in capsys.readouterr().err


def test_measure_times_each_phase_without_its_first_step_and_charges_phase_changes(
    monkeypatch,
):
    """--measure's reading of the runs (the runs faked): each phase's mean leaves out its
    first step; the training time that leaves unexplained beyond ddp's goes to 'sync'."""
    import abtrain.launch
    from abtrain.plan import measure_compute

    logs = {
        "ddp": [("full", 0.5)] + [("full", 0.2)] * 5,
        "ab": [("warmup", 0.5), ("warmup", 0.2), ("ab", 0.9), ("ab", 0.1), ("ab", 0.1)]
        + [("rebound", 0.6), ("rebound", 0.3)],
    }

    def fake(nodes, ranks, args, env=None):
        out = args[args.index("--out") + 1]
        method = next(a.split("=")[1] for a in args if a.startswith("method="))
        from pathlib import Path

        Path(out).mkdir(parents=True)
        rows = logs[method]
        lines = ["step,loss,lr,phase,seconds,data_seconds"]
        lines += [f"{i},1,0.1,{k},{s},0" for i, (k, s) in enumerate(rows)]
        (Path(out) / "train_log.csv").write_text("\n".join(lines) + "\n")
        extra = {"ddp": 1.0, "ab": 2.5}[method]  # training time beyond the steps
        elapsed = sum(s for _, s in rows) + extra
        (Path(out) / "summary.json").write_text(json.dumps({"evals": [{"seconds": elapsed}]}))
        return 0

    monkeypatch.setattr(abtrain.launch, "run_local", fake)
    got = measure_compute(str(PARAMS), [], ["ddp", "ab"], 2, 1)
    assert got["ddp"] == {"full": pytest.approx(0.2)}
    ab = got["ab"]
    assert ab["warmup"] == pytest.approx(0.2)
    assert ab["ab"] == pytest.approx(0.1)
    assert ab["rebound"] == pytest.approx(0.3)
    # unexplained: ddp 1.0 + 0.3 (its first step), ab 2.5 + 0.3 + 0.8 + 0.3; one sync
    assert ab["sync"] == pytest.approx((2.5 + 1.4) - (1.0 + 0.3))
