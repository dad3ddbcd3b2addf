"""The layer map of docs/architecture.md, checked against the imports: a module imports only from its own
or lower layers, and nothing below the integrations imports transformers or TRL."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_cluster_select"
LAYERS = {  # module (dotted, relative to the package) or sub-package prefix → layer
    "config": 0, "settings": 0, "_types": 0, "_imports": 0, "_checks": 0, "registry": 0, "loss_tokens": 0, "clock": 0, "atomic": 0,
    "distributed": 1,
    "features": 2, "selection": 2, "batching": 2, "reporting": 2, "schedule": 2, "persistence": 2,
    "validation": 2, "data": 2, "weighting": 2, "feature_cache": 2, "collate": 2, "saved_selection": 2,
    "pipeline": 3, "run": 3,
    "integrations": 4,
    "__init__": 5, "__main__": 5, "cli": 5, "commands": 5, "commands_select": 5, "commands_report": 5, "select_inputs": 5, "demo": 5,
}


def layer_of(module: str) -> int:
    head = module.split(".")[0]
    if head not in LAYERS:
        raise AssertionError(f"module {module!r} is missing from the layer map")
    return LAYERS[head]


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        yield ".".join(parts), path


def imports(module: str, path: Path):
    """(target module relative to the package, or an external top-level name, is_internal) of every import."""
    package_parts = module.split(".")[:-1] if not module.endswith("__init__") else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [".".join(base + [a.name]) for a in node.names]
                for name in names:
                    yield name or "__init__", True
            elif node.module and node.module.startswith("hf_cluster_select"):
                yield node.module[len("hf_cluster_select."):] or "__init__", True
            elif node.module:
                yield node.module.split(".")[0], False
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hf_cluster_select."):
                    yield alias.name[len("hf_cluster_select."):], True
                else:
                    yield alias.name.split(".")[0], False


@pytest.mark.parametrize("module, path", list(modules()), ids=lambda x: str(x) if isinstance(x, str) else "")
def test_imports_go_down_the_layers(module, path):
    own = layer_of(module)
    for target, internal in imports(module, path):
        if internal:
            assert layer_of(target) <= own, f"{module} (L{own}) imports {target} (L{layer_of(target)})"
        elif own < 4:
            assert target not in ("transformers", "trl", "peft"), f"{module} (L{own}) imports {target}"


def test_no_module_over_the_size_limit():
    too_long = {module: n for module, path in modules() if (n := len(path.read_text().splitlines())) > 400}
    assert too_long == {}


@pytest.mark.parametrize("module, path", list(modules()), ids=lambda x: str(x) if isinstance(x, str) else "")
def test_docstring_layer_matches_the_map(module, path):
    """A module's docstring that names its layer ("(layer L2 ...") names the one of the map."""
    import re

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = re.search(r"\(layer L(\d)", doc)
    if found:
        assert int(found.group(1)) == layer_of(module), f"{module}: docstring says L{found.group(1)}"
