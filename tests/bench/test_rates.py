"""Time to accuracy over link rates (bench.rates) and the benchmark's runs over shapes and
rates (bench.network, its runs faked): no emulated cluster."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from abtrain.config import from_dict
from abtrain.method import schedule
from abtrain.predict import timing, traffic
from bench import network, paper_scale, rates
from tests.helpers import ROOT

RESULTS = ROOT / "bench/results"


def evals(*points):
    return [dict(step=s, seconds=t, val_top1=a) for s, t, a in points]


def test_a_crossover_is_contradicted_where_the_measured_order_is_not_the_models():
    def row(m, measured, model):
        return dict(method=m, seconds_to_target=measured, predicted_seconds_to_target=model)

    at = [
        dict(rate="1gbit", methods=[row("a", 70, 90), row("b", 83, 76)]),  # a first, b in model
        dict(rate="200mbit", methods=[row("a", 70, 90), row("b", 73, 76)]),  # 4% apart: a tie
        dict(rate="unshaped", methods=[row("a", 88, 88), row("b", 63, 63)]),
        dict(rate="50mbit", methods=[row("a", 110, 124), row("b", None, None)]),
    ]
    assert rates.contradicted(["a", "b"], at) == ["1gbit"]
    assert rates.contradicted(["b", "a"], at) == ["1gbit"]


def test_the_target_is_reached_on_the_smoothed_curve_between_evaluations():
    e = evals((10, 5.0, 20.0), (20, 10.0, 30.0), (30, 15.0, 26.0), (40, 20.0, 34.0))
    # means of consecutive pairs at their mid step and time: (15, 7.5, 25), (25, 12.5, 28),
    # (35, 17.5, 30); one evaluation of 30% alone does not reach 30%
    assert rates.best(e) == 30.0
    got = rates.reach(e, 29.0)
    assert got["step"] == pytest.approx(25 + 10 * (29 - 28) / (30 - 28))
    assert got["seconds"] == pytest.approx(12.5 + 5 * 0.5)
    assert rates.reach(e, 30.5) is None
    assert timing.elapsed_at(e, 15) == pytest.approx(7.5)
    assert timing.elapsed_at(e, 50) == pytest.approx(25.0)  # past the end: the last pace


def test_per_rate_files_are_named_by_rate_and_by_nodes_beyond_two_by_two():
    assert rates.result_name(2, 2, "200mbit") == "network-200mbit"
    assert rates.result_name(2, 2, None) == "network-unshaped"
    assert rates.result_name(4, 1, "200mbit") == "network-4n-200mbit"
    assert rates.result_name(4, 2, "1gbit") == "network-4n2r-1gbit"
    # the planner's check reads rates from file names: these are no rate to it
    assert paper_scale.rate_bytes_per_s("4n-200mbit") is None
    assert paper_scale.rate_bytes_per_s("rates") is None
    assert paper_scale.rate_bytes_per_s("50mbit") == 50e6 / 8


def test_the_time_model_picks_the_measured_fastest_method_at_every_committed_rate():
    """bench/results/network-*.json: predicted time to the common target within 10% of the
    measured for every method, rate and shape, and its mean step too (ab_powersgd's on 4
    nodes x 1: 20%); the method predicted to reach the target first is the one that did, or
    one measured within the model's 10% of it (a tie); no crossover drawn is contradicted."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    s = rates.analyse(params, rates.load(RESULTS))
    assert s["check"]
    for c in s["check"]:
        error = c["predicted_seconds_to_target"] / c["seconds_to_target"] - 1
        assert abs(error) <= 0.10, c
        step = 0.20 if (c["method"], c["nodes"]) == ("ab_powersgd", 4) else 0.10
        assert abs(c["step_error"]) <= step, c
        assert c["recommendation_matches"], c
    for shape in s["shapes"]:
        for c in shape["crossovers"]:
            assert c["contradicted_by"] == rates.contradicted(c["methods"], shape["rates"]) == []
    base = next(x for x in s["shapes"] if (x["nodes"], x["ranks_per_node"]) == (2, 2))
    # the committed runs span links from ones where bytes decide to a free one
    assert {"unshaped", "200mbit"} <= {r["rate"] for r in base["rates"]}
    # every method reaches the common target, at the same step at every rate
    by_method: dict[str, set] = {}
    for r in base["rates"]:
        for x in r["methods"]:
            assert x["seconds_to_target"] is not None
            by_method.setdefault(x["method"], set()).add(round(x["steps_to_target"], 6))
    assert all(len(v) == 1 for v in by_method.values()), by_method


def test_the_summary_and_its_figure_are_written_again_byte_for_byte(tmp_path, monkeypatch):
    """`python -m bench.rates` from the committed per-rate files gives the committed
    summary and figure back, and `bench.network --render` is the same study."""
    monkeypatch.chdir(ROOT)
    for f in RESULTS.glob("network-*.json"):
        if f.stem != "network-rates":
            shutil.copy(f, tmp_path)
    assert rates.main(["--out", str(tmp_path)]) == 0
    for name in ("network-rates.json", "network-rates.png"):
        assert (tmp_path / name).read_bytes() == (RESULTS / name).read_bytes(), name
    written = json.loads((tmp_path / "network-rates.json").read_text())
    # a crossover is where the two predicted times meet, the faster one changing
    for c in written["shapes"][0]["crossovers"]:
        assert c["faster_below"] != c["faster_above"]
    (tmp_path / "network-rates.json").unlink()
    assert network.main(["--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "network-rates.json").read_bytes() == (
        RESULTS / "network-rates.json"
    ).read_bytes()


def test_one_command_runs_every_shape_rate_and_method(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(network, "plot", lambda results=None: None)
    monkeypatch.setattr(network.Rates, "summary", lambda self: {"shapes": [], "check": []})
    monkeypatch.setattr(network.Rates, "figure", lambda self, data, path: None)
    seen = []

    def fake_measure(self, run):
        own = [
            s for s in run.sets if s not in self.sets and not s.startswith(("method=", "tracking."))
        ]
        seen.append((run.nodes, run.ranks_per_node, run["rate"], run["method"], own))
        run.folder.mkdir(parents=True)
        (run.folder / network.MEASURED).write_text(json.dumps(dict(sets=run.sets)))

    def fake_result(self, run):
        return dict(
            method=run["method"],
            wall_seconds=60.0,
            val_top1={"best": 30.0, "final": 30.0},
            evals=evals((10, 5.0, 20.0), (20, 10.0, 30.0)),
            ledger_inter_node_bytes_by_node={0: 1},
            interface_bytes_by_node=[{"tx": 1}] * run.nodes,
            step_seconds={},
        )

    monkeypatch.setattr(network.Network, "measure", fake_measure)
    monkeypatch.setattr(network.Network, "result", fake_result)
    network.main(
        [
            "--out",
            "results",
            "--methods",
            "ddp,ab_powersgd",
            "--shape",
            "2x2=200mbit,none",
            "--shape",
            "4x1=200mbit",
            "--method-set",
            "ab_powersgd:ab.sync_mode=only_learned",
            "--no-matrix",  # no params.yaml here
        ]
    )
    assert [x[:4] for x in seen] == [
        (2, 2, "200mbit", "ddp"),
        (2, 2, "200mbit", "ab_powersgd"),
        (2, 2, None, "ddp"),
        (2, 2, None, "ab_powersgd"),
        (4, 1, "200mbit", "ddp"),
        (4, 1, "200mbit", "ab_powersgd"),
    ]
    assert seen[1][4] == ["ab.sync_mode=only_learned"] and seen[0][4] == []
    names = sorted(f.name for f in (tmp_path / "results").iterdir())
    assert names == [
        "network-200mbit.json",
        "network-4n-200mbit.json",
        "network-rates.json",  # the summary (its analysis faked here)
        "network-unshaped.json",
    ]
    d = json.loads((tmp_path / "results/network-4n-200mbit.json").read_text())
    assert (d["nodes"], d["ranks_per_node"], d["rate"]) == (4, 1, "200mbit")
    assert d["method_overrides"] == {"ab_powersgd": ["ab.sync_mode=only_learned"]}
    r = d["results"][0]
    assert r["target_top1"] == 25.0 and r["steps_to_target"] == 15.0  # the smoothed point
    out = capsys.readouterr().out
    assert "[bench.network] run 6 of 6: ab_powersgd at 200mbit on 4x1" in out


def fake_measure(self, run):
    """A run in place of training: the files the report reads from its folder."""
    run.folder.mkdir(parents=True, exist_ok=True)
    measured = dict(sets=run.sets, wall_seconds=60.0, interface_bytes_by_node=[{"tx": 1}])
    (run.folder / network.MEASURED).write_text(json.dumps(measured))


def fake_result(self, run):
    return dict(
        method=run["method"],
        rate=run["rate"] or "unshaped",
        wall_seconds=60.0,
        val_top1={"best": 30.0, "final": 30.0},
        evals=[{"step": 1, "seconds": 1.0, "val_top1": 30.0}],
        ledger_inter_node_bytes_by_node={0: 1},
        interface_bytes_by_node=[{"tx": 1}],
        step_seconds={},
    )


def test_a_killed_benchmark_continues_and_announces_each_run(tmp_path, monkeypatch, capsys):
    """The benchmark takes minutes per run: each one says which of how many, and the ETA;
    killed, it continues with the runs not measured, and a run measured with other values
    is not one of its runs."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(network.Network, "result", fake_result)
    monkeypatch.setattr(network, "plot", lambda results=None: None)
    monkeypatch.setattr(network.Rates, "summary", lambda self: {"shapes": [], "check": []})
    monkeypatch.setattr(network.Rates, "figure", lambda self, data, path: None)
    measured = []

    def killed_at_third(self, run):
        if len(measured) == 2:
            raise SystemExit(1)
        measured.append(run.name)
        fake_measure(self, run)

    monkeypatch.setattr(network.Network, "measure", killed_at_third)
    args = [
        "--rates",
        "200mbit,none",
        "--methods",
        "ddp,ab",
        "--ranks-per-node",
        "1",
        "--no-matrix",
    ]
    args += ["--out", str(tmp_path / "results"), "--runs-dir", str(tmp_path / "work")]
    with pytest.raises(SystemExit):
        network.main(args)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[bench.network]")]
    assert lines[0].startswith("[bench.network] 4 runs (0 finished); the rest about ")
    assert lines[1].startswith("[bench.network] run 1 of 4: ddp at 200mbit on 2x1; elapsed 0 s")
    assert lines[2].startswith("[bench.network] run 2 of 4: ab at 200mbit on 2x1; elapsed ")
    assert "ETA" in lines[2]
    assert measured == ["ddp at 200mbit on 2x1", "ab at 200mbit on 2x1"]
    assert not (tmp_path / "results").exists()  # killed in training: nothing reported
    # run again: the two measured are read back, the two others trained
    measured.clear()
    monkeypatch.setattr(network.Network, "measure", fake_measure)
    assert network.main(args) == 0
    out = capsys.readouterr().out
    assert "[bench.network] 4 runs (2 finished)" in out
    assert "run 1 of 4: finished, read from" in out and "run 3 of 4: ddp at unshaped" in out
    names = sorted(f.name for f in (tmp_path / "results").glob("network-*[!s].json"))
    assert names == ["network-2n-200mbit.json", "network-2n-unshaped.json"]
    # a run measured with other values is trained again
    again = [*args, "--set", "steps=100"]
    assert network.main([*again, "--dry-run"]) == 0
    assert "4 runs (0 finished)" in capsys.readouterr().out


def test_merge_replaces_only_the_rerun_methods_and_keeps_their_order(tmp_path):
    """--merge: a rerun of one method leaves the other methods' committed runs in place."""
    old = [{"method": m, "steps": 160, "tag": "old"} for m in ("ddp", "ab", "ab_powersgd")]
    (tmp_path / "network-200mbit.json").write_text(json.dumps({"results": old}))
    bench = network.Network(out=tmp_path)
    new = [{"method": "ab_powersgd", "steps": 160, "tag": "new"}]
    got = bench.merged(2, 2, "200mbit", new)
    assert [(r["method"], r["tag"]) for r in got] == [
        ("ddp", "old"),
        ("ab", "old"),
        ("ab_powersgd", "new"),
    ]
    # a shape and rate with no committed file: just the new runs
    assert bench.merged(2, 2, "50mbit", new) == new


def test_a_dry_run_predicts_each_runs_wall_time_from_the_committed_runs(monkeypatch, capsys):
    """The plan's estimate of a committed 200 Mbit/s run, with that run's settings, against
    the wall time it took; the dry run lists each run and trains none."""
    monkeypatch.chdir(ROOT)
    committed = json.loads((RESULTS / "network-200mbit.json").read_text())
    took = {r["method"]: r["wall_seconds"] for r in committed["results"]}
    bench = network.Network(
        out=RESULTS,
        shapes=[(2, 2, ["200mbit", None])],
        methods=["ddp", "ab"],
        sets=committed["overrides"],
        method_sets=committed["method_overrides"],
    )
    runs = bench.runs()
    assert [r.name for r in runs][:2] == ["ddp at 200mbit on 2x2", "ab at 200mbit on 2x2"]
    assert runs[0].seconds == pytest.approx(took["ddp"], rel=0.15)
    assert runs[1].seconds == pytest.approx(took["ab"], rel=0.15)
    sets = [x for s in committed["overrides"] for x in ("--set", s)]
    args = ["--dry-run", "--methods", "ddp,ab", "--shape", "2x2=200mbit,none", "--no-matrix"]
    assert network.main(args + sets) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[bench.network] 4 runs (") and len(lines) == 5
    assert all(x.lstrip().startswith(f"run  {k} of 4") for k, x in enumerate(lines[1:], 1))


def test_ab_phase_counts_used_by_the_check_come_from_the_schedule():
    """The measured mean of an AB run weights its phases by the schedule's step counts."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    d = json.loads((RESULTS / "network-200mbit.json").read_text())
    cfg = from_dict(params["train"], ["method=ab", *d["overrides"]])
    kinds = [schedule.phase_at(t, cfg).kind for t in range(cfg.steps)]
    ab = next(r for r in d["results"] if r["method"] == "ab")
    pl = traffic.estimate(cfg, 2, 2, 10)
    expected = sum(ab["step_seconds"][k] for k in kinds) / len(kinds)
    assert paper_scale.measured_mean(pl, ab["step_seconds"]) == pytest.approx(expected)


def colours_in(png) -> set[str]:
    from PIL import Image

    image = Image.open(png).convert("RGB")
    pixels = image.getcolors(image.width * image.height)
    return {"#" + "".join(f"{v:02x}" for v in c) for _, c in pixels}


def test_the_benchmark_figures_draw_each_method_in_its_colour_of_the_palette(tmp_path, monkeypatch):
    """network-rates.png and network.png from the committed results: every method in its
    colour of pipeline.style (the report's), none of matplotlib's own cycle (its orange
    was ab_powersgd here and ab_nogroups in the report), one legend outside the panels,
    and the same bytes each time they are drawn, with no matplotlib version in them."""
    from pipeline import style

    summary = json.loads((RESULTS / "network-rates.json").read_text())
    methods = {m for shape in summary["shapes"] for m in shape["model_curves"]}
    assert methods >= {"ddp", "ab", "powersgd", "ab_powersgd"}
    for name in ("a.png", "b.png"):
        rates.plot(summary, tmp_path / name)
    png = (tmp_path / "a.png").read_bytes()
    assert png == (tmp_path / "b.png").read_bytes()
    assert b"tEXt" not in png and b"Matplotlib" not in png
    seen = colours_in(tmp_path / "a.png")
    assert {style.COLOURS[m] for m in methods} <= seen
    assert not {"#ff7f0e", "#1f77b4", "#2ca02c", "#d62728"} & seen  # matplotlib's C0-C3

    results = tmp_path / "results"
    results.mkdir()
    for f in RESULTS.glob("network-*.json"):
        if f.stem != "network-rates":
            shutil.copy(f, results)
    monkeypatch.setattr(network, "RESULTS", results)
    network.plot()
    first = (results / "network.png").read_bytes()
    network.plot()
    assert (results / "network.png").read_bytes() == first and b"tEXt" not in first
    ran = {r["method"] for d in rates.load(results) for r in d["results"]}
    seen = colours_in(results / "network.png")
    assert {style.COLOURS[m] for m in ran} <= seen
    assert not {"#ff7f0e", "#1f77b4", "#2ca02c", "#d62728"} & seen


def test_the_figures_legends_and_crossover_lists_stay_outside_the_panels(tmp_path, monkeypatch):
    """No legend or list of crossovers inside a panel of network-rates.png, where it could
    cover a point; the legend beside the panels."""
    import matplotlib.pyplot as plt

    summary = json.loads((RESULTS / "network-rates.json").read_text())
    drawn = []
    monkeypatch.setattr("pipeline.style.save", lambda fig, path, dpi: drawn.append(fig))
    rates.plot(summary, tmp_path / "x.png")
    (fig,) = drawn
    fig.canvas.draw()
    render = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(summary["shapes"])
    for ax in panels:
        assert ax.get_legend() is None
        box = ax.get_window_extent(render)
        for text in ax.texts:
            if text.get_text().startswith("crossovers"):
                assert text.get_window_extent(render).y1 < box.y0  # under the axis
    (legend,) = fig.legends
    right = max(ax.get_window_extent(render).x1 for ax in panels)
    assert legend.get_window_extent(render).x0 >= right
    plt.close(fig)
