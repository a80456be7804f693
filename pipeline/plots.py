"""The validation curves of every run as DVC plots, and the same charts rendered offline.

`dvc plots show` draws the top-level `plots:` of dvc.yaml: `reports/curves.json` (one row
per evaluation of every run, written by the report) through `pipeline/curves_template.json`
(a Vega-Lite template: one panel per scale, one line per run, coloured by method, each line
labelled with its run's name). DVC's default page loads Vega from a CDN when opened; this
module writes the page template that carries it inline instead (`--template`, named by
`.dvc/config`), and for figures without a network it fills the same template with DVC's own renderer
(dvc_render) from the same definitions in dvc.yaml, and renders it with vl-convert (Vega and
Vega-Lite compiled into the wheel; pinned in requirements.lock): SVG and PNG in
`reports/figures/`, a self-contained HTML page per chart in `reports/plots/`.

The report stage calls `render()` too: the two commands write these files from the same
inputs through the same code, so they write the same bytes (vl-convert's SVG and PNG carry
no date or version), and a file whose bytes would not change is not rewritten. Each
method's colour and point shape are the template's scales, pipeline.style's palette.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from abtrain.files import read_record
from pipeline.stage import parser
from pipeline.style import write_bytes

DVC_YAML = Path("dvc.yaml")
TEMPLATE = "pipeline/curves_template.json"
# the same with a log x axis (traffic spans two orders of magnitude between the methods),
# written from TEMPLATE by `log_x_template`: DVC reads a template from a file of its own
LOG_X_TEMPLATE = "pipeline/curves_template_logx.json"
TEMPLATES = (TEMPLATE, LOG_X_TEMPLATE)
FIGURES = Path("reports/figures")
PAGES = Path("reports/plots")
VEGA_LITE = "5.21"  # one of vl_convert.get_vegalite_versions(); fixed so figures don't drift
PNG_SCALE = 2  # pixels per Vega unit


def definitions(dvc_yaml: Path = DVC_YAML) -> dict[str, dict[str, Any]]:
    """dvc.yaml's plots drawn with our template: {id: {source, x, y, title, x_label, y_label}}."""
    out = {}
    for item in yaml.safe_load(dvc_yaml.read_text()).get("plots", []):
        if not isinstance(item, dict):
            continue
        ((name, props),) = item.items()
        if (
            not props
            or props.get("template") not in TEMPLATES
            or not isinstance(props.get("y"), dict)
        ):
            continue
        ((source, y),) = props["y"].items()
        out[name] = dict(props, source=source, y=y)
    return out


def spec(props: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The Vega-Lite spec `dvc plots show` makes of these rows (its renderer, its template)."""
    from dvc_render.vega import VegaRenderer

    # DVC tags each row with its revision (the template draws one line per run and revision)
    data = [{**r, "rev": r.get("rev", "workspace")} for r in rows]
    keep = ("x", "y", "title", "x_label", "y_label")
    renderer = VegaRenderer(
        data,
        props.get("title", ""),
        template=props["template"],
        **{k: props[k] for k in keep if k in props},
    )
    return only_present(renderer.get_filled_template(), {r.get("method") for r in data})


def only_present(node: Any, methods: set[str]) -> Any:
    """The spec with each `method` scale's domain (and its range) cut to the methods that
    have rows: the legend lists no method without a run. (`dvc plots show` keeps the
    template's whole palette: DVC fills the template, not this.)"""
    if isinstance(node, list):
        return [only_present(x, methods) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: only_present(v, methods) for k, v in node.items()}
    scale = out.get("scale")
    if out.get("field") == "method" and isinstance(scale, dict) and "domain" in scale:
        keep = [i for i, m in enumerate(scale["domain"]) if m in methods]
        out["scale"] = {
            **scale,
            **{k: [scale[k][i] for i in keep] for k in ("domain", "range") if k in scale},
        }
    return out


def render(dvc_yaml: Path = DVC_YAML) -> list[Path]:
    """SVG, PNG and an offline HTML page of each chart; nothing when no run has a curve."""
    import vl_convert as vlc

    offline_template()  # the same charts under `dvc plots show`, also offline
    made = []
    for name, props in definitions(dvc_yaml).items():
        source = Path(props["source"])
        rows = read_record(source, shape=list) if source.exists() else []
        rows = [r for r in rows if r.get(props["x"]) is not None and r.get(props["y"]) is not None]
        if not rows:
            continue
        s = spec(props, rows)
        FIGURES.mkdir(parents=True, exist_ok=True)
        PAGES.mkdir(parents=True, exist_ok=True)
        svg = FIGURES / f"{name}.svg"
        write_bytes(svg, vlc.vegalite_to_svg(s, vl_version=VEGA_LITE).encode())
        png = FIGURES / f"{name}.png"
        write_bytes(png, vlc.vegalite_to_png(s, vl_version=VEGA_LITE, scale=PNG_SCALE))
        page = vlc.vegalite_to_html(s, vl_version=VEGA_LITE, bundle=True)
        write_bytes(PAGES / f"{name}.html", page.encode())
        made += [svg, png]
    return made


# `dvc plots show`'s page, offline: .dvc/config's plots.html_template names this file (a
# path under .dvc/), which inlines Vega, Vega-Lite and Vega-Embed from vl-convert's own
# bundle; DVC's default page loads them from a CDN and stays blank without a network
OFFLINE_TEMPLATE = Path(".dvc/tmp/plots_offline.html")
PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<title>DVC plots (abtrain)</title>
<script>
{bundle}
</script>
</head>
<body>
{{plot_divs}}
</body>
</html>
"""


def offline_template(path: Path = OFFLINE_TEMPLATE) -> Path:
    """Write the page template `dvc plots show` uses (once; vl-convert's bundle is fixed),
    in a DVC repository (its .dvc/ folder); elsewhere nothing."""
    import vl_convert as vlc

    if path.parent.parent.is_dir() and not path.exists():
        bundle = vlc.javascript_bundle().replace("</script", "<\\/script")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, PAGE.format(bundle=bundle).encode())
    return path


def log_x_template(source: Path = Path(TEMPLATE), path: Path = Path(LOG_X_TEMPLATE)) -> Path:
    """LOG_X_TEMPLATE from TEMPLATE, only the x axis's scale changed: one template to edit."""
    template = json.loads(source.read_text())
    template["spec"]["encoding"]["x"]["scale"] = {"type": "log"}
    write_bytes(path, (json.dumps(template, indent=2) + "\n").encode())
    return path


def main(template_only: bool = False) -> int:
    print(f"[pipeline] plots: {log_x_template()} (the log-x template, from {TEMPLATE})")
    print(f"[pipeline] plots: {offline_template()} (dvc plots show's offline page)")
    if template_only:
        return 0
    for path in render():
        print(f"[pipeline] plots: {path}")
    return 0


if __name__ == "__main__":
    ap = parser("pipeline.plots", __doc__)
    ap.add_argument(
        "--template", action="store_true", help="only the templates (log-x, dvc plots show's page)"
    )
    sys.exit(main(ap.parse_args().template))
