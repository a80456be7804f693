"""Runs made with other overrides are not one table: bench.network records what its runs
were made with, and bench.rates refuses to summarise runs of different ones together unless
asked to keep them apart (per-rate files written by bench.network's own writer, from the
committed runs; no training)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from bench import network, rates
from tests.helpers import PARAMS, ROOT

RESULTS = ROOT / "bench/results"


def committed(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def write(folder, rate: str, sets: list[str], method_sets: dict, source: str) -> None:
    """A per-rate file as bench.network writes it, holding the runs of a committed one."""
    runs = [{**r, "rate": rate} for r in committed(source)["results"]]
    bench = network.Network(out=folder, config=PARAMS, sets=sets, method_sets=method_sets)
    bench.write_rate(2, 2, None if rate == "unshaped" else rate, runs)


def two_settings(folder) -> None:
    """The committed 200 Mbit/s runs, and a 300 Mbit/s file of runs made without the
    benchmark's --set values (params.yaml's own schedule)."""
    base = committed("network-200mbit")
    write(folder, "200mbit", base["overrides"], base["method_overrides"], "network-200mbit")
    write(folder, "300mbit", [], {}, "network-1gbit")


def run_rates(folder, *extra: str) -> int:
    return rates.main(["--config", str(PARAMS), "--results", str(folder), *extra])


def test_runs_of_different_overrides_are_refused_with_the_files_and_keys(tmp_path, capsys):
    two_settings(tmp_path)
    assert run_rates(tmp_path) == 2
    err = capsys.readouterr().err
    assert "network-200mbit.json" in err and "network-300mbit.json" in err
    differing = next(x for x in err.splitlines() if "differing:" in x)
    assert "steps" in differing and "ab_powersgd:ab.sync_mode" in differing
    assert "eval_every" in differing
    assert "--by-overrides" in err
    assert not list(tmp_path.glob("network-rates*"))  # no summary of the mixed runs


def test_by_overrides_gives_one_labelled_table_per_set_of_them(tmp_path, capsys):
    two_settings(tmp_path)
    assert run_rates(tmp_path, "--by-overrides") == 0
    out = capsys.readouterr().out
    first = committed("network-200mbit")["overrides"][0]
    assert f"settings 1, made with: {first}" in out
    assert "settings 2, made with: (none)" in out
    summary = json.loads((tmp_path / "network-rates-by-overrides.json").read_text())
    assert (tmp_path / "network-rates-by-overrides.png").exists()
    assert not (tmp_path / "network-rates.json").exists()  # the report's summary untouched
    made = [(s["settings"]["label"], s["settings"]["files"]) for s in summary["shapes"]]
    assert made == [
        ("settings 1", ["network-200mbit.json"]),
        ("settings 2", ["network-300mbit.json"]),
    ]
    # each table's target is its own runs' lowest best
    for shape, name in zip(summary["shapes"], ("200mbit", "1gbit")):
        runs = committed(f"network-{name}")["results"]
        assert shape["target_top1"] == pytest.approx(min(rates.best(r["evals"]) for r in runs))


def test_the_same_settings_spelled_or_ordered_otherwise_are_one_table(tmp_path):
    base = committed("network-200mbit")
    write(tmp_path, "200mbit", base["overrides"], base["method_overrides"], "network-200mbit")
    respelled = ["steps=50", *reversed(base["overrides"])]  # steps=160 comes later
    write(tmp_path, "unshaped", respelled, base["method_overrides"], "network-unshaped")
    summary = rates.summarise(yaml.safe_load(PARAMS.read_text()), tmp_path)
    assert len(summary["shapes"]) == 1
    assert summary["shapes"][0]["settings"]["label"] is None
    assert sorted(summary["shapes"][0]["settings"]["files"]) == [
        "network-200mbit.json",
        "network-unshaped.json",
    ]


def test_a_file_without_the_record_is_read_alone_and_refused_beside_recorded_ones(tmp_path):
    params = yaml.safe_load(PARAMS.read_text())
    old = committed("network-200mbit")
    del old["overrides"], old["method_overrides"]
    (tmp_path / "network-200mbit.json").write_text(json.dumps(old))
    assert rates.summarise(params, tmp_path)["shapes"][0]["settings"]["made_with"] == (
        "not recorded"
    )
    shutil.copy(RESULTS / "network-unshaped.json", tmp_path)
    with pytest.raises(rates.MixedOverrides, match="not recorded"):
        rates.summarise(params, tmp_path)


def test_the_committed_runs_are_one_table():
    assert len(rates.groups(rates.load(RESULTS))) == 1


def fake_measure(self, run):
    """A committed run in place of training: bench.network's records, not its runs."""
    run.folder.mkdir(parents=True, exist_ok=True)
    (run.folder / network.MEASURED).write_text(json.dumps(dict(sets=run.sets)))


def fake_result(self, run):
    got = next(r for r in committed("network-200mbit")["results"] if r["method"] == run["method"])
    return {**got, "rate": run["rate"] or "unshaped"}


def test_network_runs_the_matrixs_values_and_records_what_it_changed(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(network.Network, "measure", fake_measure)
    monkeypatch.setattr(network.Network, "result", fake_result)
    monkeypatch.setattr(network, "plot", lambda results=None: None)
    common = ["--results", str(tmp_path), "--work", str(tmp_path / "work")]
    common += ["--methods", "ddp,ab_powersgd"]
    assert network.main([*common, "--rates", "200mbit"]) == 0
    d = json.loads((tmp_path / "network-200mbit.json").read_text())
    # no --set: each method as the matrix's run of it at 2 x 2 trains (the search's values,
    # the schedule's fractions of its steps, its own set), and the benchmark's measurement
    from pipeline.matrix import BENCHMARK_SETS, best_config, run_overrides, runs
    from pipeline.stage import params

    p = params()
    ddp = [s for s in run_overrides(p, runs(p)["ddp-2x2"], best_config(p)) if "method=" not in s]
    abps = run_overrides(p, runs(p)["abps-2x2"], best_config(p))
    sets = d["overrides"] + d["method_overrides"]["ddp"]
    assert {*ddp, *BENCHMARK_SETS} - {"eval_every=39"} == set(sets) - {"eval_every=39"}
    assert d["method_overrides"]["ab_powersgd"] == ["ab.sync_mode=only_learned"] == abps[-1:]
    # so a new rate joins the committed runs
    assert d["overrides"] == committed("network-200mbit")["overrides"]
    # a changed value replaces the default; runs of it are not summarised with the others
    assert network.main([*common, "--rates", "300mbit", "--set", "steps=100"]) == 2
    d = json.loads((tmp_path / "network-300mbit.json").read_text())
    was = committed("network-200mbit")["overrides"]
    assert d["overrides"][-1] == "steps=100" and "steps=100" not in was
    assert len(d["overrides"]) == len(was)


def test_merge_is_refused_before_any_run_where_the_kept_runs_had_other_settings(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    ran = []
    monkeypatch.setattr(
        network.Network, "measure", lambda self, run: ran.append(run) or fake_measure(self, run)
    )
    monkeypatch.setattr(network.Network, "result", fake_result)
    monkeypatch.setattr(network, "plot", lambda results=None: None)
    base = committed("network-200mbit")
    write(tmp_path, "200mbit", base["overrides"], base["method_overrides"], "network-200mbit")
    args = ["--results", str(tmp_path), "--work", str(tmp_path / "work"), "--rates", "200mbit"]
    with pytest.raises(SystemExit, match="--merge: .*network-200mbit.json was made with"):
        network.main([*args, "--methods", "ab", "--merge", "--set", "steps=100"])
    assert ran == []
    # the same settings: merged, and the kept runs' own overrides stay recorded
    assert network.main([*args, "--methods", "ddp", "--merge"]) == 0
    d = json.loads((tmp_path / "network-200mbit.json").read_text())
    assert [r["method"] for r in d["results"]] == [r["method"] for r in base["results"]]
    assert d["method_overrides"] == base["method_overrides"]
