"""The loader benchmark end to end on a tiny setting: it runs and reports what it should."""

import json

from bench import loader


def test_loader_benchmark_reports_throughput_and_wait_share(tmp_path):
    out = tmp_path / "loader.json"
    loader.main(
        [
            *("--images", "24", "--classes", "2", "--width", "100", "--height", "80"),
            *("--size", "72", "--batch", "4", "--batches", "2", "--rounds", "1"),
            *("--model", "mobilenet_v3_small", "--train-batch", "4"),
            *("--train-steps", "1", "--train-warmup", "1"),
            *("--data", str(tmp_path / "data"), "--out", str(out)),
        ]
    )
    r = json.loads(out.read_text())
    assert r["command"].startswith("python -m bench.loader --images 24")
    assert r["machine"]["cpu_count"] >= 1 and r["machine"]["torch"]
    assert r["data"]["images"] == 24 and r["data"]["jpeg_kb_mean"] > 0
    t = r["throughput"]
    for name in ("abtrain", "torchvision"):
        assert t[name]["images_per_s"] > 0 and len(t[name]["rounds"]) == 1
    assert t["abtrain_over_torchvision"] > 0 and t["workers"] == 2
    tr = r["train"]
    assert tr["timed_steps"] == 1 and len(tr["waits_s"]) == 2
    assert tr["step_s_mean"] > 0 and tr["compute_s_per_step"] > 0
    assert tr["decode_s_per_batch_one_core"] > 0 and 0 <= tr["wait_share"] < 1
    assert set(r["done"]) == {
        "abtrain_at_least_as_fast",
        "wait_share_at_most_5_percent",
        "compute_exceeds_decode",
    }
    assert not list(tmp_path.glob(".loader.json.tmp*"))
