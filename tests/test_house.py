"""The house's rules, read from the code's own imports (module level and inside functions):
no module reaches itself through others (no circle); the folders depend one way, bench/
above pipeline/ above search/ above abtrain/ (tools/, beside them, is imported by none);
inside abtrain/ its rooms depend one way too (ROOMS); and abtrain's commands
(`python -m abtrain`, its launcher, abtrain/commands/) import the library, never the
reverse."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (
    "abtrain",
    "search",
    "pipeline",
    "bench",
    "tools",
)  # lowest first: each may import those before it
# abtrain's rooms, lowest first: each may import those before it. The foundations (the
# config and its errors, atomic files) first; then the distributed processes and the
# ledger, the method, the models, the data, MLflow, the predictions, a run, the commands.
ROOMS = (
    "errors",
    "lifetime",
    "modelspec",
    "files",
    "config",
    "distributed",
    "method",
    "models",
    "data",
    "tracking",
    "predict",
    "run",
    "commands",
    "__main__",
    "launch",
    "__init__",
)
COMMANDS = ("abtrain.__main__", "abtrain.launch", "abtrain.commands")


def room(module: str) -> str:
    """abtrain.method.sync -> method; abtrain -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_command(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in COMMANDS)


def modules() -> dict[str, Path]:
    out = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project's modules `path` imports, anywhere in it (a package's import of a name
    counts as its module's where that name is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, name, set(mods)) for name, path in mods.items()}


def test_no_module_reaches_itself_through_others():
    g = graph()
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own modules
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not circles, "circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_folders_depend_one_way():
    rank = {f: i for i, f in enumerate(FOLDERS)}
    against = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        for b in targets
        if rank[b.split(".")[0]] > rank[a.split(".")[0]]
    ]
    assert not against, (
        f"imports against the folders' direction ({' > '.join(FOLDERS[::-1])}): {against}"
    )


def test_the_library_imports_no_command():
    wrong = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a.startswith("abtrain") and not is_command(a)
        for b in targets
        if is_command(b)
    ]
    assert not wrong, f"library modules importing a command: {wrong}"


def test_abtrains_rooms_depend_one_way():
    order = {r: i for i, r in enumerate(ROOMS)}
    rooms = {room(m) for m in graph() if m.startswith("abtrain.")}
    assert rooms <= set(order), f"rooms missing from ROOMS: {sorted(rooms - set(order))}"
    against = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a.startswith("abtrain")
        for b in targets
        if b.startswith("abtrain.") and order[room(b)] > order[room(a)]
    ]
    assert not against, f"imports against abtrain's rooms ({' < '.join(ROOMS)}): {against}"


def test_every_room_says_what_it_holds():
    for package in sorted((ROOT / "abtrain").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(package.read_text()))
        assert doc and doc.splitlines()[0].endswith("."), f"{package}: a one-line summary first"


def test_the_rules_see_what_they_forbid(tmp_path, monkeypatch):
    """The reader finds a lazy import inside a function, and a relative one."""
    (tmp_path / "abtrain").mkdir()
    (tmp_path / "abtrain" / "__init__.py").write_text("")
    (tmp_path / "abtrain" / "a.py").write_text("def f():\n    from abtrain import b\n")
    (tmp_path / "abtrain" / "b.py").write_text("from . import a\n")
    known = {"abtrain", "abtrain.a", "abtrain.b"}
    assert imports(tmp_path / "abtrain" / "a.py", "abtrain.a", known) == {"abtrain.b"}
    assert imports(tmp_path / "abtrain" / "b.py", "abtrain.b", known) == {"abtrain.a"}


def test_the_report_and_the_studies_pages_import_no_torch():
    """The report (the verdict's time-model tie included) and the trade-off study's page read
    tables: importing torch would cost each a second of CPU, ten reports in a test run. A
    module that moves a torch import to its top fails here, naming what pulled it in."""
    code = (
        "import sys, traceback\n"
        "class Catch:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch':\n"
        "            at = [f for f in traceback.format_stack() if '<frozen' not in f]\n"
        "            raise ImportError('torch imported by ' + ''.join(at[:-1]))\n"
        "sys.meta_path.insert(0, Catch())\n"
        "import pipeline.report, bench.tradeoff.page\n"
        "from pipeline.report import verdict\n"
        "verdict.ties([])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
