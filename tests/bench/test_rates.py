"""Time to accuracy over link rates (bench.rates) and the benchmark's runs over shapes and
rates (bench.network, its runs faked): no emulated cluster."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from abtrain import schedule, timing, traffic
from abtrain.config import from_dict
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


def test_the_summary_and_its_figure_are_written(tmp_path):
    for f in RESULTS.glob("network-*.json"):
        if f.stem != "network-rates":
            shutil.copy(f, tmp_path)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    s = rates.summarise(params, tmp_path)
    written = json.loads((tmp_path / "network-rates.json").read_text())
    assert written["check"] == json.loads(json.dumps(s["check"]))
    assert (tmp_path / "network-rates.png").stat().st_size > 10_000
    # a crossover is where the two predicted times meet, the faster one changing
    for c in written["shapes"][0]["crossovers"]:
        assert c["faster_below"] != c["faster_above"]
    # the committed summary is this one (bench.rates redraws it from the committed files)
    committed = json.loads((RESULTS / "network-rates.json").read_text())
    assert committed["shapes"] == written["shapes"]
    assert rates.load(tmp_path) and all(d.get("results") for d in rates.load(tmp_path))


def test_one_command_runs_every_shape_rate_and_method(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(network, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(network, "plot", lambda results=None: None)
    monkeypatch.setattr(network, "summarise", lambda config, results=None: None)
    seen = []

    def fake_run(method, rate, a, work):
        seen.append((a.nodes, a.ranks_per_node, rate, method, a.method_sets.get(method, [])))
        return dict(
            method=method,
            wall_seconds=60.0,
            val_top1={"best": 30.0, "final": 30.0},
            evals=evals((10, 5.0, 20.0), (20, 10.0, 30.0)),
            ledger_inter_node_bytes_by_node={0: 1},
            interface_bytes_by_node=[{"tx": 1}] * a.nodes,
            step_seconds={},
        )

    monkeypatch.setattr(network, "run_one", fake_run)
    network.main(
        [
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
    assert names == ["network-200mbit.json", "network-4n-200mbit.json", "network-unshaped.json"]
    d = json.loads((tmp_path / "results/network-4n-200mbit.json").read_text())
    assert (d["nodes"], d["ranks_per_node"], d["rate"]) == (4, 1, "200mbit")
    assert d["method_overrides"] == {"ab_powersgd": ["ab.sync_mode=only_learned"]}
    r = d["results"][0]
    assert r["target_top1"] == 25.0 and r["steps_to_target"] == 15.0  # the smoothed point
    out = capsys.readouterr().out
    assert "[bench.network] run 6 of 6 finished: ab_powersgd at 200mbit" in out


def test_a_dry_run_predicts_each_runs_wall_time_from_the_committed_runs(monkeypatch, capsys):
    """The dry run's estimate of a committed 200 Mbit/s run, with that run's settings,
    against the wall time it took."""
    monkeypatch.chdir(ROOT)
    committed = json.loads((RESULTS / "network-200mbit.json").read_text())
    took = {r["method"]: r["wall_seconds"] for r in committed["results"]}
    sets = [x for s in committed["overrides"] for x in ("--set", s)]
    args = ["--dry-run", "--methods", "ddp,ab", "--shape", "2x2=200mbit,none"]
    assert network.main(args + sets) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("predicted wall time:") and len(lines) == 5
    seconds = [float(x.split("~")[1].split()[0]) for x in lines[:2]]
    assert seconds[0] == pytest.approx(took["ddp"], rel=0.15)
    assert seconds[1] == pytest.approx(took["ab"], rel=0.15)


def test_ab_phase_counts_used_by_the_check_come_from_the_schedule():
    """The measured mean of an AB run weights its phases by the schedule's step counts."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    d = json.loads((RESULTS / "network-200mbit.json").read_text())
    cfg = from_dict(params["train"], ["method=ab", *d["overrides"]])
    kinds = [schedule.phase_at(t, cfg).kind for t in range(cfg.steps)]
    ab = next(r for r in d["results"] if r["method"] == "ab")
    pl = traffic.plan(cfg, 2, 2, 10)
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
