"""MLflow for real: a SQLite store read back through MLflow's API, and its UI in Chromium."""

import csv
import hashlib
import json
import re
import shutil
import tempfile
import urllib.parse
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from abtrain.commands.localrun import free_port
from tests.helpers import launch, summary

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """Two runs of 2 nodes x 1 rank tracked in one fresh SQLite store: AB (a generated run
    name, tags as the pipeline passes them, the model logged) and DDP (a run name given, a
    tag added by key, no model)."""
    d = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    common = ["tracking.enabled=true", f"tracking.uri={uri}", "tracking.required=true"]
    ab = launch(
        d / "ab",
        *common,
        "method=ab",
        "tracking.log_every=3",
        'tracking.tags={"scale": "2x1", "batch": "local"}',
        nnodes=2,
        nproc=1,
    )
    assert ab.returncode == 0, ab.stderr[-3000:]
    ddp = launch(
        d / "ddp",
        *common,
        "method=ddp",
        "tracking.run_name=ddp-2x1-local",
        "tracking.tags.scale=2x1",
        "tracking.log_model=false",
        nnodes=2,
        nproc=1,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("abtrain")
    runs = {r.data.tags["method"]: r for r in client.search_runs([exp.experiment_id])}
    assert len(runs) == 2  # only rank 0 writes
    return d, uri, client, runs, ab.stdout


@pytest.mark.multiprocess
def test_run_logs_params_tags_metrics_and_artifacts(tracked):
    d, _, client, runs, _ = tracked
    run = runs["ab"]
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert p["method"] == "ab" and p["ab.sigma_cutoff"] == "0.15" and p["model.width"] == "64"
    assert p["steps"] == "40" and p["data.name"] == "synthetic"
    t = run.data.tags
    assert t["method"] == "ab" and t["world_size"] == "2" and t["nodes"] == "2"
    assert t["ranks_per_node"] == "1" and t["batch_size"] == "16" and t["global_batch"] == "32"
    assert t["scale"] == "2x1" and t["batch"] == "local"  # tracking.tags
    assert t["dataset"] == "synthetic" and t["model"] == "mlp" and len(t["git_commit"]) >= 7
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(0, 40, 3))
    phases = {m.value for m in client.get_metric_history(run.info.run_id, "phase")}
    assert phases == {1.0, 2.0, 3.0}  # warm-up, AB, rebound
    evals = client.get_metric_history(run.info.run_id, "val_top1")
    assert len(evals) == len(summary(d / "ab")["evals"]) >= 4
    for key in (
        "val_loss",
        "val_top5",
        "train_loss",
        "train_top1",
        "compression_ratio",
        "rank_fraction_mean",
        "inter_node_bytes",
        "intra_node_bytes",
    ):
        assert client.get_metric_history(run.info.run_id, key), key
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "ledger.jsonl", "config.json", "model.pt", "ranks.csv"} <= names


@pytest.mark.multiprocess
def test_run_names_and_tags_tell_matrix_points_apart(tracked):
    from abtrain.tracking.tracker import run_name_for
    from tests.helpers import tiny_config

    d, _, _, runs, _ = tracked
    assert runs["ab"].info.run_name == "ab-2x1-b16"  # whole in the runs table
    assert runs["ddp"].info.run_name == "ddp-2x1-local"
    assert runs["ddp"].data.tags["scale"] == "2x1" and "batch" not in runs["ddp"].data.tags
    s = summary(d / "ab")
    assert (s["run_name"], s["tags"]) == ("ab-2x1-b16", {"scale": "2x1", "batch": "local"})
    assert (s["batch_size"], s["global_batch"], s["ranks_per_node"]) == (16, 32, 1)
    # the matrix's points of one method: 2x2, 2x1 at a local batch, 2x1 at a global batch
    cfg, small = tiny_config(), tiny_config("batch_size=8")
    names = {run_name_for(cfg, 2, 2), run_name_for(cfg, 2, 1), run_name_for(small, 2, 1)}
    assert len(names) == 3


def test_tags_override_takes_a_mapping_and_single_keys():
    from abtrain import config
    from tests.helpers import tiny_config

    cfg = tiny_config('tracking.tags={"scale": "2x2", "batch": "local"}', "tracking.tags.seed=3")
    assert cfg.tracking.tags == {"scale": "2x2", "batch": "local", "seed": "3"}
    with pytest.raises(config.ConfigError, match=r"tracking\.tags"):
        tiny_config("tracking.tags=[a, b]")
    with pytest.raises(config.ConfigError, match=r"tracking\.run_name"):
        tiny_config("tracking.run_name=")


@pytest.mark.multiprocess
def test_experiment_is_marked_for_training_and_keeps_artifacts_beside_the_store(tracked):
    d, _, client, runs, _ = tracked
    exp = client.get_experiment_by_name("abtrain")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert exp.artifact_location == (d / "mlartifacts").as_uri()
    for run in runs.values():
        assert run.info.artifact_uri.startswith((d / "mlartifacts").as_uri())
    assert (d / "mlartifacts").is_dir() and not (d / "mlruns").exists()
    # an experiment made elsewhere gets the kind when abtrain first uses it
    from abtrain.tracking.tracker import experiment_id

    other = client.create_experiment("made-elsewhere")
    assert experiment_id(client, "made-elsewhere", "sqlite:///x.db") == other
    assert client.get_experiment(other).tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.multiprocess
def test_ranks_are_an_artifact_not_a_metric_each(tracked):
    d, _, client, runs, _ = tracked
    run = runs["ab"]
    assert not [k for k in run.data.metrics if k.startswith("rank/")]
    local = client.download_artifacts(run.info.run_id, "ranks.csv", str(d / "dl"))
    rows = list(csv.DictReader(open(local)))
    facts = summary(d / "ab")["factorizations"]
    assert len(rows) == sum(len(f["ranks"]) for f in facts)
    assert {(int(r["step"]), r["layer"], int(r["rank"])) for r in rows} == {
        (f["step"], layer, k) for f in facts for layer, k in f["ranks"].items()
    }
    shapes = {(r["layer"], r["rows"], r["cols"], r["full_rank"]) for r in rows}
    assert shapes == {("layers.1", "64", "64", "64"), ("layers.2", "64", "64", "64")}


@pytest.mark.multiprocess
def test_epoch_is_samples_over_the_training_set(tracked):
    d, _, client, runs, _ = tracked
    s = summary(d / "ab")
    history = client.get_metric_history(runs["ab"].info.run_id, "epoch")
    by_step = {m.step: m.value for m in history}
    for e in s["evals"]:
        assert e["samples"] == e["step"] * 32
        assert e["epoch"] == pytest.approx(e["samples"] / 2000) == by_step[e["step"]]
    assert by_step[40] == s["epochs"] == pytest.approx(40 * 32 / 2000)


@pytest.mark.multiprocess
def test_final_metrics_equal_the_summary(tracked):
    d, _, client, runs, _ = tracked
    for method, run in runs.items():
        s = summary(d / method)
        final = client.get_run(run.info.run_id).data.metrics
        t = s["traffic"]
        assert t["inter_node_bytes"] > 0
        assert t["inter_node_bytes_per_step"] == t["inter_node_bytes"] / s["steps"]
        assert final["inter_node_bytes"] == t["inter_node_bytes"]
        assert final["intra_node_bytes"] == t["intra_node_bytes"]
        assert final["inter_node_bytes_per_step"] == t["inter_node_bytes_per_step"]
        # rounded as the Key figures view shows them; the series hold every digit
        assert final["final/inter_node_mb_per_step"] == round(
            t["inter_node_bytes_per_step"] / 1e6, 3
        )
        assert final["final/val_top1_best"] == s["val_top1"]["best"]
        assert final["final/val_top1_final"] == s["val_top1"]["final"]
        assert final["final/compression_ratio"] == round(s["compression_ratio"], 3)
        assert final["compression_ratio"] == s["compression_ratio"]
        assert final["final/wall_seconds"] == round(s["wall_seconds"], 1)
        assert final["epoch"] == s["epochs"]
        steps = {m.step for m in client.get_metric_history(run.info.run_id, "inter_node_bytes")}
        assert max(steps) == s["steps"]  # logged at the final step
        # each evaluation has the running per-rank traffic; the last one ties with the
        # summary but for the final checkpoint's collectives, which come after it
        evals = [e["inter_node_bytes"] for e in s["evals"]]
        assert evals == sorted(evals)
        rows = [json.loads(line) for line in open(d / method / "ledger.jsonl")]
        after = [r for r in rows if r["step"] == s["steps"] and r["phase"] == "checkpoint"]
        assert after
        tail = sum(r["wire_bytes"] for r in after if r["inter_node"]) / s["world_size"]
        assert evals[-1] + tail == t["inter_node_bytes"]


def per_step(s: dict) -> float:
    return s["traffic"]["inter_node_bytes_per_step"]


@pytest.mark.multiprocess
def test_headline_is_rounded_compared_with_ddp_and_leads_the_description(tracked):
    """AB finished first, without a DDP run of its point to compare with; DDP, at its end,
    gave it its `Bytes vs DDP` (pipeline/report/tables.py's vs_ddp, rounded)."""
    from abtrain.tracking.views import NOTE_START

    d, _, client, runs, _ = tracked
    ab, ddp = summary(d / "ab"), summary(d / "ddp")
    want = {
        "ab": {
            "Top-1 best": round(ab["val_top1"]["best"], 2),
            "Top-1 final": round(ab["val_top1"]["final"], 2),
            "Bytes vs DDP": round(per_step(ab) / per_step(ddp), 3),
            "Compression": round(ab["compression_ratio"], 3),
        },
        "ddp": {
            "Top-1 best": round(ddp["val_top1"]["best"], 2),
            "Top-1 final": round(ddp["val_top1"]["final"], 2),
            "Bytes vs DDP": 1.0,
            "Compression": 1.0,
        },
    }
    assert 0.05 < want["ab"]["Bytes vs DDP"] < 1  # AB sends less than DDP
    for method, run in runs.items():
        got = client.get_run(run.info.run_id).data
        assert {k: got.metrics[k] for k in want[method]} == want[method], method
        (point,) = client.get_metric_history(run.info.run_id, "Bytes vs DDP")
        assert point.step == summary(d / method)["steps"]  # at the run's last step
        note = got.tags["mlflow.note.content"]
        first, _, rest = note.partition("\n\n")
        shown = " · ".join(f"{k} **{v:g}**" for k, v in want[method].items())
        assert first == f"{NOTE_START} {shown}", note
        assert rest.startswith("Commit ")  # what the description said before stays


def _finished(client, uri, tmp_path, name, method, batch, ab_bytes=None):
    """A run through Tracker as the trainer drives it, its summary.json written by hand."""
    from abtrain import config
    from abtrain.tracking.tracker import Tracker, run_tags
    from tests.helpers import PARAMS, TINY

    out = tmp_path / name
    out.mkdir()
    sets = ["tracking.enabled=true", f"tracking.uri={uri}", f"tracking.run_name={name}"]
    cfg = config.load(PARAMS, [*TINY, *sets, f"method={method}", f"batch_size={batch}"])
    tracker = Tracker(cfg, active=True, out=out)
    where = dict(world_size=2, nodes=2, ranks_per_node=1)
    data = dict(name="synthetic", digest="d1", source="generated", profile={})
    tracker.start(cfg, run_tags(cfg, where, 2 * batch, out), None, name, data)
    per_step = ab_bytes if method != "ddp" else 1000.0
    tracker.metrics(20, {"inter_node_bytes_per_step": per_step})
    s = dict(
        method=method,
        steps=20,
        val_top1=dict(best=31.456, final=30.004),
        compression_ratio=1.23456 if method != "ddp" else 1.0,
        traffic=dict(inter_node_bytes_per_step=per_step),
    )
    (out / "summary.json").write_text(json.dumps(s))
    tracker.finish("FINISHED")
    return client.get_run(tracker.run_id).data


def test_bytes_vs_ddp_pairs_runs_of_one_point_whatever_order_they_end_in(tmp_path):
    """An AB run that ends after its point's DDP run compares itself with it; one that ended
    before gets the figure from DDP's end; a run of another batch size is not paired."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    before = _finished(client, uri, tmp_path, "ab-before", "ab", 16, ab_bytes=412.3456)
    assert "Bytes vs DDP" not in before.metrics  # no DDP run of its point yet
    _finished(client, uri, tmp_path, "ab-b8", "ab", 8, ab_bytes=300.0)
    ddp = _finished(client, uri, tmp_path, "ddp", "ddp", 16)
    after = _finished(client, uri, tmp_path, "ab-after", "ab", 16, ab_bytes=500.0)
    assert ddp.metrics["Bytes vs DDP"] == 1.0
    assert after.metrics["Bytes vs DDP"] == 0.5
    exp = client.get_experiment_by_name("abtrain").experiment_id
    runs = {r.info.run_name: r.data for r in client.search_runs([exp])}
    assert runs["ab-before"].metrics["Bytes vs DDP"] == 0.412  # given by DDP's end
    assert "Bytes vs DDP **0.412**" in runs["ab-before"].tags["mlflow.note.content"]
    assert "Bytes vs DDP" not in runs["ab-b8"].metrics  # another point: no DDP run
    assert after.metrics["Top-1 best"] == 31.46 and after.metrics["Top-1 final"] == 30.0
    assert after.metrics["Compression"] == 1.235


@pytest.mark.multiprocess
def test_source_tags_dataset_input_and_system_metrics(tracked):
    _, _, client, runs, _ = tracked
    run = client.get_run(runs["ab"].info.run_id)
    t = run.data.tags
    assert t["mlflow.source.git.commit"] == t["git_commit"]
    assert t["mlflow.source.name"] == "python -m abtrain train"
    assert t["mlflow.source.type"] == "LOCAL" and t["mlflow.user"]
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.name == "synthetic" and len(inp.dataset.digest) == 16
    assert json.loads(inp.dataset.profile)["train_samples"] == 2000
    assert {(x.key, x.value) for x in inp.tags} == {("mlflow.data.context", "train")}
    # the DDP run trained on the same data: the same digest
    (other,) = client.get_run(runs["ddp"].info.run_id).inputs.dataset_inputs
    assert other.dataset.digest == inp.dataset.digest
    assert [k for k in run.data.metrics if k.startswith("system/cpu")]


@pytest.mark.multiprocess
def test_final_model_is_logged_with_a_signature_and_loads(tracked):
    import mlflow
    import mlflow.pytorch
    import torch

    d, uri, client, runs, _ = tracked
    exp = client.get_experiment_by_name("abtrain").experiment_id
    models = client.search_logged_models([exp])
    assert [m.source_run_id for m in models] == [runs["ab"].info.run_id]  # not ddp's
    (model,) = models
    assert model.name == runs["ab"].info.run_name == "ab-2x1-b16"
    assert model.tags["mlflow.source.name"] == "python -m abtrain train"  # not __main__.py
    assert model.artifact_location.startswith((d / "mlartifacts").as_uri())
    mlflow.set_tracking_uri(uri)
    uri_ = f"models:/{model.model_id}"
    sig = mlflow.models.get_model_info(uri_).signature
    assert list(sig.inputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 64]
    assert list(sig.outputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 10]
    net = mlflow.pytorch.load_model(uri_)
    # the merged full-rank model: plain layers, the weights of model.pt
    assert not any(type(m).__name__ == "LowRankLayer" for m in net.modules())
    saved = torch.load(d / "ab" / "model.pt", weights_only=True)
    for k, v in net.state_dict().items():
        assert torch.equal(v, saved[k]), k


@pytest.mark.multiprocess
def test_plain_log_lines_tell_speed_and_time_left(tracked):
    *_, stdout = tracked
    lines = [ln for ln in stdout.splitlines() if re.match(r"\[abtrain\] step +\d+ ", ln)]
    assert lines and all(re.search(r"\d+\.\d{3} s/step, ETA \d+:\d\d:\d\d$", ln) for ln in lines)
    assert lines[-1].endswith("ETA 0:00:00")


@pytest.mark.multiprocess
def test_unreachable_store_stops_the_run_unless_not_required(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc = launch(
        tmp_path / "a",
        "tracking.enabled=true",
        f"tracking.uri={dead}",
        "tracking.required=true",
        "steps=12",
        "method=ddp",
        nnodes=1,
        nproc=2,
    )
    assert proc.returncode != 0
    assert "can't be reached" in proc.stderr and not (tmp_path / "a" / "summary.json").exists()
    proc = launch(
        tmp_path / "b",
        "tracking.enabled=true",
        f"tracking.uri={dead}",
        "tracking.required=false",
        "steps=12",
        "method=ddp",
        nnodes=1,
        nproc=2,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "training on without tracking" in proc.stderr
    assert summary(tmp_path / "b")["steps"] == 12


def shown(value: float) -> str:
    """A number as the UI's JavaScript writes it."""
    return repr(float(value)).removesuffix(".0")


@pytest.mark.browser
@pytest.mark.multiprocess
def test_key_figures_and_whole_run_names_fit_the_first_screen_in_headless_chromium(tracked):
    """In a 1400 x 900 window (MLflow's Assistant panel closed, as from a browser's second
    visit on): each run's name and headline figures in the runs table's Key figures view,
    and a run's figures atop its page; the compare view sorts them first in its metrics."""
    from abtrain.tracking.views import HEADLINE, NOTE_START, key_figures_link
    from tools.mlflow_browser import Browser, chromium, mlflow_server, stop

    if chromium() is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    d, uri, client, runs, _ = tracked
    exp = runs["ab"].info.experiment_id
    port = free_port()
    server = mlflow_server(uri, port)
    url = f"http://127.0.0.1:{port}"
    figures = {
        m: {k: client.get_run(r.info.run_id).data.metrics[k] for k in HEADLINE}
        for m, r in runs.items()
    }
    try:
        with Browser() as browser:
            width, height = browser.window
            # MLflow 3.17 picks an experiment's landing page from the workflow type (this
            # URL parameter, else the browser's last choice, else GenAI), not from the
            # experiment's tag: docs/tracking.md's link carries it
            browser.open(
                f"{url}/#/experiments/{exp}?workflowType=machine_learning",
                "document.body.innerText.includes('python -m abtrain train')",  # Source
            )
            text = browser.text()
            assert all(run.info.run_name in text for run in runs.values())  # listed by name

            browser.open(
                f"{url}/{key_figures_link(exp)}",
                "document.querySelectorAll('.ag-center-cols-container .ag-row').length >= 2",
            )
            text = browser.text()
            assert "Key figures" in text and "You're viewing a shared view" in text
            table = browser.runs_table()
            columns = [f"metrics.`{k}`" for k in HEADLINE]
            for col in columns:  # the names, whole, in the view's order
                assert table["header"][col]["text"] == col[9:-1] and table["header"][col]["whole"]
            xs = [table["header"][c]["x"] for c in columns]
            assert xs == sorted(xs)
            for method, run in runs.items():
                row = table[run.info.run_id]
                name = row["attributes.`Run Name`"]
                assert name["text"] == run.info.run_name and name["whole"], name
                for key, value in figures[method].items():
                    cell = row[f"metrics.`{key}`"]
                    assert cell["text"] == shown(value), (method, key, cell)
                    # on the first screen, not cut, level with the run's name
                    assert cell["whole"] and cell["x"] + cell["width"] <= width, (key, cell)
                    assert cell["y"] + cell["height"] <= height and cell["y"] == name["y"]
            browser.screenshot(d / "mlflow-runs.png")
            shutil.copy(
                d / "mlflow-runs.png", Path(tempfile.gettempdir()) / "abtrain-mlflow-runs.png"
            )

            ab = runs["ab"].info.run_id
            browser.open(
                f"{url}/#/experiments/{exp}/runs/{ab}?workflowType=machine_learning",
                f"document.body.innerText.includes({json.dumps(NOTE_START)})",
            )
            line = f"{NOTE_START} " + " · ".join(f"{k} {v:g}" for k, v in figures["ab"].items())
            x, y, w, h = browser.find(line)[line]
            assert 0 <= x and x + w <= width and 0 <= y and y + h <= height, (x, y, w, h)

            ids = [runs["ddp"].info.run_id, ab]
            query = urllib.parse.urlencode(
                {"runs": json.dumps(ids), "experiments": json.dumps([exp])},
                quote_via=urllib.parse.quote,
            )
            browser.open(
                f"{url}/#/compare-runs?{query}&workflowType=machine_learning",
                f"document.body.innerText.includes({json.dumps(HEADLINE[0])})",
            )
            text = browser.text()
            assert "Comparing 2 Runs" in text
            # the first plot's metric is the first a run logged: top-1, not CPU utilisation
            assert text.split("Metrics:", 1)[1].split("Clear All", 1)[0].split() == ["val_top1"]
            rows = browser.compare_metrics()
            assert [name for name, _, _ in rows[:4]] == sorted(HEADLINE)  # before all others
            for name, _, values in rows[:4]:
                want = [figures["ddp"][name], figures["ab"][name]]
                assert [float(v) for v in values] == want, name
    finally:
        stop(server)


def test_logged_model_names_follow_the_run_and_pass_mlflows_check():
    from mlflow.utils.validation import _validate_logged_model_name

    from abtrain.tracking.tracker import model_name

    for run, want in (
        ("ab-2x2", "ab-2x2"),
        ("ab-2x1-b16", "ab-2x1-b16"),
        ("ab-2x2 (lucid-bass)", "ab-2x2-(lucid-bass)"),
        ("lr=0.01/b:32 'x'", "lr=0-01-b-32-x"),
    ):
        assert model_name(run) == want
        _validate_logged_model_name(model_name(run))  # raises on a name MLflow refuses


def test_experiment_carries_a_key_figures_view_of_metrics_the_runs_log(tmp_path):
    """The runs table's columns come from the saved view, an experiment tag; its metrics
    are ones a training run (final_metrics, headline) or a search's parent (best_error)
    logs."""
    from abtrain.run.results import final_metrics
    from abtrain.tracking.tracker import experiment_id
    from abtrain.tracking.views import (
        EARLIER_KEY_FIGURES,
        HEADLINE,
        KEY_FIGURES,
        KEY_FIGURES_VIEW,
        headline,
        key_figures_link,
    )

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = experiment_id(client, "abtrain", uri)
    tag = f"mlflow.sharedViewState.{KEY_FIGURES_VIEW}"
    view = json.loads(client.get_experiment(exp).tags[tag])
    assert view["name"] == "Key figures" and isinstance(view["createdAt"], int)
    state = json.loads(view["state"])
    assert (
        state["selectedColumns"] == state["columnOrder"] == [f"metrics.`{k}`" for k in KEY_FIGURES]
    )
    logged = set(final_metrics(_summary_like())) | set(headline(_summary_like(), 4e5))
    assert set(KEY_FIGURES) <= logged | {"best_error"}
    assert set(HEADLINE) <= set(headline(_summary_like(), 4e5))
    assert set(state["columnWidths"]) <= set(state["columnOrder"])
    assert key_figures_link(exp) == (
        f"#/experiments/{exp}/runs?viewStateShareKey={KEY_FIGURES_VIEW}"
        "&workflowType=machine_learning"
    )
    # a view the user overwrote in the UI stays theirs; an older experiment gets one
    client.set_experiment_tag(exp, tag, "edited")
    assert experiment_id(client, "abtrain", uri) == exp
    assert client.get_experiment(exp).tags[tag] == "edited"
    old = client.create_experiment("older")
    experiment_id(client, "older", uri)
    assert json.loads(client.get_experiment(old).tags[tag])["name"] == "Key figures"
    # the view abtrain saved before the headline metrics, unchanged, gives way to today's
    earlier = [f"metrics.`{k}`" for k in EARLIER_KEY_FIGURES]
    view = dict(name="Key figures", state=json.dumps(dict(selectedColumns=earlier)))
    client.set_experiment_tag(old, tag, json.dumps(view))
    experiment_id(client, "older", uri)
    replaced = json.loads(json.loads(client.get_experiment(old).tags[tag])["state"])
    assert replaced["selectedColumns"] == state["selectedColumns"]


def _summary_like() -> dict:
    """The keys final_metrics and headline read, as summary.json has them."""
    return dict(
        method="ab",
        traffic=dict(inter_node_bytes=8e6, inter_node_bytes_per_step=2e5, intra_node_bytes=0),
        val_top1=dict(best=30.5, final=29.0),
        compression_ratio=0.7,
        wall_seconds=61.0,
        epochs=1.5,
        time=dict(share=dict(compute=0.8, comm=0.2)),
    )


def test_a_training_run_records_its_search_record_and_what_tells_it_apart(tmp_path, monkeypatch):
    """pipeline/train.py's tags for the search record the run takes its values from, and
    DVC's experiment, reach a run in a real store; a run of a name already there gets the
    experiment's name after it; the first metrics lead with an evaluation's top-1."""
    from abtrain import config
    from abtrain.tracking.tracker import Tracker, run_tags
    from pipeline.train import search_tags
    from tests.helpers import PARAMS, TINY

    record = tmp_path / "results" / "search" / "optuna" / "best.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"id": "t3", "error": 48.0}))
    monkeypatch.chdir(tmp_path)
    sets = search_tags({"search": {"use_best": ["optim.lr"], "backend": "optuna"}})
    assert search_tags({"search": {"use_best": [], "backend": "optuna"}}) == []
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = ["tracking.enabled=true", f"tracking.uri={uri}", "tracking.run_name=ab-2x2"]
    cfg = config.load(PARAMS, [*TINY, *tracking, *sets])
    plain = config.load(PARAMS, [*TINY, *tracking])
    assert cfg.model_dump(exclude={"tracking"}) == plain.model_dump(exclude={"tracking"})
    where = dict(world_size=2, nodes=2, ranks_per_node=1)

    def start(name: str) -> Tracker:
        tracker = Tracker(cfg, active=True, out=tmp_path)
        tracker.start(cfg, run_tags(cfg, where, 32, tmp_path), None, name)
        return tracker

    first = start("ab-2x2")
    first.metrics(0, {"loss": 2.3, "lr": 0.1})
    first.metrics(10, {"loss": 2.1, "lr": 0.1, "val_loss": 2.0, "val_top1": 21.5})
    assert first._monitor is None  # system metrics wait for the run's own
    first.flush()
    assert first._monitor is not None
    first.finish("FINISHED")
    run = first.client.get_run(first.run_id)
    t = run.data.tags
    digest = hashlib.sha256(record.read_bytes()).hexdigest()[:16]
    assert (t["search_backend"], t["search_sha256"]) == ("optuna", digest)
    assert t["search_record"] == "results/search/optuna/best.json"
    assert list(run.data.metrics)[:3] == ["val_top1", "val_loss", "loss"]
    assert run.info.run_name == "ab-2x2" and "dvc.experiment" not in t

    # `dvc exp run` again: the stage's environment names the experiment
    monkeypatch.setenv("DVC_STAGE", "train@ab-2x2")
    monkeypatch.setenv("DVC_EXP_NAME", "lucid-bass")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "0123456789abcdef")
    second = start("ab-2x2")
    second.finish("FINISHED")
    run = second.client.get_run(second.run_id)
    t = run.data.tags
    assert run.info.run_name == "ab-2x2 (lucid-bass)"
    assert (t["dvc.experiment"], t["dvc.stage"]) == ("lucid-bass", "train@ab-2x2")
    note = t["mlflow.note.content"]
    assert "DVC experiment lucid-bass (from commit 0123456789ab)" in note
    assert t["git_commit"][:12] in note


def test_close_names_a_folder_that_holds_no_stopped_run_or_a_damaged_record(tmp_path):
    """`python -m abtrain close DIR` on a folder of a run that did not stop for its store,
    and on one whose record a full disk cut short: one line naming the file, exit 1."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    close = [sys.executable, "-m", "abtrain", "close", str(tmp_path)]
    proc = subprocess.run(close, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{tmp_path} holds no mlflow_stopped.json" in proc.stderr
    (tmp_path / "mlflow_stopped.json").write_text('{"uri": "sqlite:///m.db", "run_')
    proc = subprocess.run(close, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert str(tmp_path / "mlflow_stopped.json") in proc.stderr, proc.stderr
