"""Model card section describing a selection (layer L2: imports only huggingface_hub and the standard library).

The section sits between two HTML comment markers so that a later write replaces it instead of adding a copy, and
so that a card written before ours (by `Trainer.create_model_card`, TRL or PEFT) keeps everything else it says.
Works offline: `ModelCard.from_template` renders locally; nothing here validates or pushes a card.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from ..atomic import atomic_open
from .settings_text import duplicate_settings, noise_settings, optimizer_reset

START_MARKER = "<!-- hf_cluster_select:start -->"
END_MARKER = "<!-- hf_cluster_select:end -->"
HEADING = "## Data selection (hf_cluster_select)"
NOT_MEASURED = "not measured"
MAX_CLUSTER_ROWS = 100
CITATION = (
    "Selection follows CluSTER (Kim, Nam, Han, Choi, Lee; EMNLP 2026; "
    "[arXiv:2609.12584](https://arxiv.org/abs/2609.12584)), extended with HDBSCAN clusters, an exact budget, "
    "per-example weights and token-balanced batches across ranks."
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_TEMPLATE = """---
{{ card_data }}
---

# {{ model_name }}

This model was fine-tuned {{ source }}{{ dataset }}, with hf_cluster_select choosing the training examples.

{{ selection_section }}
"""


def _values(report: Any) -> Mapping[str, Any]:
    return report if isinstance(report, Mapping) else report.to_dict()


def _count(value: Any) -> str:
    return NOT_MEASURED if value is None else f"{int(value):,}"


def _percent(value: Any) -> str:
    return NOT_MEASURED if value is None else f"{100.0 * float(value):.1f}%"


def _ratio(part: Any, whole: Any, fraction: Any) -> str:
    if part is None or whole is None:
        return NOT_MEASURED
    return f"{int(part):,} / {int(whole):,} ({_percent(fraction)})"


def _seconds(value: Any) -> str:
    """`1,234.5 s (20 min 34 s)`; `not measured` for None."""
    if value is None:
        return NOT_MEASURED
    value = float(value)
    text = f"{value:,.1f} s"
    whole = int(round(abs(value)))
    if whole >= 3600:
        text += f" ({whole // 3600} h {whole % 3600 // 60:02d} min)"
    elif whole >= 60:
        text += f" ({whole // 60} min {whole % 60:02d} s)"
    return text


def _steps(value: Any) -> str:
    return "" if value is None else f", {int(value):,} optimizer steps"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def looks_like_hub_id(name: str | None) -> bool:
    """True when `name` has the Hub's `owner/name` shape and is not a path (absolute, relative, `~`, or existing).

    Args:
        name (`str` or `None`): a model or dataset reference.
    """
    if not name or not isinstance(name, str) or name.startswith(("/", ".", "~")) or ".." in name:
        return False
    return bool(_HUB_ID.match(name)) and not os.path.exists(name)


def without_local_base_model(text: str) -> str:
    """A card's text without `base_model` metadata that is a filesystem path, nor PEFT's
    `base_model:adapter:<path>` tag (the Hub rejects both); Hub ids and everything else are kept."""
    from huggingface_hub import ModelCard

    card = ModelCard(text, ignore_metadata_errors=True)
    data, changed = card.data, False
    base = data.base_model
    if isinstance(base, str) and not looks_like_hub_id(base):
        data.base_model, changed = None, True
    elif isinstance(base, list) and any(not looks_like_hub_id(b) for b in base):
        kept = [b for b in base if looks_like_hub_id(b)]
        data.base_model, changed = (kept or None), True
    tags = data.tags or []
    kept_tags = [t for t in tags if not (isinstance(t, str) and t.startswith("base_model:")
                                         and not looks_like_hub_id(t.split(":")[-1]))]
    if len(kept_tags) != len(tags):
        data.tags, changed = kept_tags, True
    return str(card) if changed else text


def scrub_card(folder: str | os.PathLike) -> bool:
    """Remove local-path `base_model` metadata from `folder/README.md` (written by Trainer, TRL or PEFT); returns
    whether the file changed."""
    path = os.path.join(os.fspath(folder), "README.md")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    cleaned = without_local_base_model(text)
    if cleaned != text:
        _atomic_write(path, cleaned)
    return cleaned != text


def selection_card_section(report: Any, *, plot_filename: str | None = None, map_filename: str | None = None) -> str:
    """Markdown section of the card: what was kept, what every stage cost, what it saved, and the run's evaluation.

    Args:
        report (`SelectionReport` or its `to_dict()`): the measured record of the selection.
        plot_filename (`str`, *optional*): the cluster-size plot, relative to the card's folder.
        map_filename (`str`, *optional*): the 2-D feature map (`feature_map.plot_feature_map`), likewise.
    Returns:
        `str`: the section, from `START_MARKER` to `END_MARKER` inclusive. Numbers are formatted as
        `2,306 / 7,688 (30.0%)`, `12.3 s`; values never measured read `not measured`.
    """
    r = _values(report)
    lines = [START_MARKER, HEADING, "",
             "Training examples were chosen by clustering per-example learning-effect features and keeping a "
             "weighted subset of every cluster. Every figure below was measured on this run unless it says otherwise.",
             "", "| Quantity | Value | What it measured |", "|---|---|---|"]
    lines += [f"| {_cell(a)} | {_cell(b)} | {_cell(c)} |" for a, b, c in _summary_rows(r)]
    lines += _cluster_lines(r)
    if plot_filename:
        lines += ["", f"![Examples per cluster, full data and kept]({plot_filename.replace(os.sep, '/')})"]
    if map_filename:
        lines += ["", f"![Features in 2-D (PCA), coloured by cluster, kept examples outlined]"
                      f"({map_filename.replace(os.sep, '/')})"]
    lines += _evaluation_lines(r.get("eval_metrics"))
    lines += ["", "### Configuration", "", "```json", json.dumps(r.get("config") or {}, indent=2, sort_keys=True,
                                                                default=str), "```"]
    if r.get("clustering_params"):
        lines += ["", "Resolved clustering parameters:", "", "```json",
                  json.dumps(r["clustering_params"], indent=2, sort_keys=True, default=str), "```"]
    lines += ["", CITATION, END_MARKER]
    return "\n".join(lines)


def _geometry(r: Mapping[str, Any]) -> str:
    """`2 rank(s) × 4 examples per device × 1 accumulation step(s) = 8 examples per optimizer step`."""
    world, per_device, accum = (r.get(k) for k in ("world_size", "per_device_train_batch_size",
                                                    "gradient_accumulation_steps"))
    geometry = f"{world} rank(s) × {per_device} examples per device × {accum} accumulation step(s)"
    if None not in (world, per_device, accum):
        geometry += f" = {int(world) * int(per_device) * int(accum):,} examples per optimizer step"
    return geometry


def _summary_rows(r: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The rows (quantity, value, what it measured) of the section's main table."""
    token_kind = "loss-bearing tokens (label ≠ -100)" if r.get("token_kind", "loss") == "loss" else "input tokens"
    fallback = r.get("fallback")
    basis = r.get("full_data_seconds_basis") or NOT_MEASURED
    saved = r.get("seconds_saved")
    reset = optimizer_reset(r)
    saved_text = NOT_MEASURED if saved is None else (
        f"{_seconds(saved)}; {_percent(r.get('fraction_saved'))} of the full-data time"
    )
    return [
        ("Examples kept", _ratio(r.get("n_kept"), r.get("n_examples"), r.get("fraction_kept")),
         "kept training examples / all training examples"),
        *([("Dropped before selection", _count(r.get("n_dropped_by_preparation")),
             "examples data preparation removed because truncation to max_length left no loss-bearing token; "
             "not counted above")] if r.get("n_dropped_by_preparation") is not None else []),
        ("Tokens kept", _ratio(r.get("tokens_kept"), r.get("tokens_total"), r.get("fraction_tokens_kept")),
         f"{token_kind} in kept examples / in all examples"),
        *([("Input tokens kept (the budget)", _ratio(r.get("input_tokens_kept"), r.get("input_tokens_total"),
                                                    (r.get("input_tokens_kept") or 0) / (r.get("input_tokens_total") or 1)),
            f"budget_unit='tokens': data_fraction={(r.get('config') or {}).get('data_fraction')} of the input "
            "tokens; kept input tokens / all input tokens")]
          if (r.get("config") or {}).get("budget_unit") == "tokens" else []),
        *([("Feature", r["feature_used"], "the per-example learning-effect feature the clustering used "
             "(feature='auto' resolved for this model)")] if r.get("feature_used") else []),
        *([("Batch order", r["batch_order"], r.get("batch_order_fallback") or (
            "each cluster's kept examples by increasing feature-pass loss after the warm-up, every step still mixing "
            "the clusters (a curriculum)" if r["batch_order"] == "easy_to_hard" else "the kept examples in a seeded "
            "shuffle per epoch"))] if r.get("batch_order") else []),
        *_target_rows(r.get("target")),
        ("Clusters", _count(r.get("n_clusters")), "groups examples were assigned to after the noise policy"),
        ("Noise points", _count(r.get("n_noise")), "examples the clusterer labelled -1 before assignment"),
        ("Non-finite features", _count(r.get("n_nonfinite_features", 0)),
         "examples whose features held NaN/inf: kept out of clustering as a group of their own, never dropped"),
        ("No loss-bearing tokens", _count(r.get("n_no_loss_tokens", 0)),
         "examples whose labels are all -100: kept out of clustering, selected only if the budget needs them"),
        *([("Near-duplicate examples", f"{_count(r['n_near_duplicate_rows'])} in "
            f"{_seconds(r.get('near_duplicates_seconds'))}", "examples whose tokens are near copies of an earlier "
            f"example's ({duplicate_settings(r.get('clustering_params') or {})}): one candidate per group")]
          if r.get("n_near_duplicate_rows") is not None else []),
        *([("Suspected noise", _count(r["n_suspected_noise"]), f"deferred: the "
            f"{noise_settings(r.get('clustering_params') or {})} of each cluster whose target agreed least with "
            "its input neighbours': kept only if the budget needs them")]
          if r.get("n_suspected_noise") is not None else []),
        ("Clustering method", r.get("clustering_method") or NOT_MEASURED,
         f"fallback: {fallback}" if fallback else "no fallback: the clusterer's result was used as is"),
        ("Batch geometry", _geometry(r), "data-parallel ranks and per-step batch of the training run"),
        ("Warm-up training", _seconds(r.get("warmup_seconds")) + _steps(r.get("warmup_steps")),
         "wall-clock time training on the full data before selection"),
        *([("Optimizer state", "cleared after the warm-up", f"{reset}: Adam's moments restarted when training on the "
            "kept subset started; weights and LR schedule carried on")] if reset else []),
        ("Feature extraction", _seconds(r.get("features_seconds")),
         "wall-clock time loading per-example features from the feature cache (computed by an earlier run with the "
         "same data, weights, tokenizer and feature settings)" if r.get("features_from_cache")
         else "wall-clock time computing per-example features"),
        ("Clustering", _seconds(r.get("clustering_seconds")), "wall-clock time reducing and clustering features"),
        ("Selection, total", _seconds(r.get("selection_seconds")),
         "wall-clock time of features + clustering + choosing examples"),
        ("Training on the selection", _seconds(r.get("training_seconds")) + _steps(r.get("selected_steps")),
         "wall-clock time training after selection"),
        ("Total with selection", _seconds(r.get("total_seconds")), "warm-up + selection + training"),
        ("Full-data training time", _seconds(r.get("full_data_seconds")) + _steps(r.get("full_data_steps")),
         basis),
        ("Time saved", saved_text,
         "full-data training time − total with selection"
         + (" (negative: selection cost more than it saved)" if saved is not None and saved < 0 else "")),
    ]


def _target_rows(target: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """Rows on the target set, when the selection followed one: its size per task and how the budget went."""
    if not target:
        return []
    names, sizes = target.get("task_names") or [], target.get("n_target_per_task") or []
    kept = target.get("kept_per_task") or []
    per_task = "; ".join(f"{n}: {int(s):,} target, {int(k):,} kept" for n, s, k in zip(names, sizes, kept))
    return [
        ("Target set", f"{int(sum(sizes)):,} examples in {len(names)} task(s) from {target.get('source')}",
         "the examples selection was aimed at (rule "
         f"{target.get('target_rule')!r}, coverage floor {target.get('target_coverage')})"),
        ("Budget per target task", per_task or NOT_MEASURED,
         "the budget covers every distinct example: all kept, each counted for the task it is most relevant to"
         if target.get("all_distinct_kept") else
         f"kept examples each task picked in round-robin turns; {int(target.get('coverage_kept') or 0):,} more kept "
         "by the coverage floor (every cluster its share, its most relevant members)"),
        ("Relevance to the target", f"{target.get('mean_relevance_kept')} kept vs {target.get('mean_relevance_pool')}"
                                    " all", "mean over examples of the max cosine similarity between an example's "
                                            "feature and the target features of the task it is most relevant to"),
    ]


def _cluster_lines(r: Mapping[str, Any]) -> list[str]:
    """The examples-per-cluster table (full data → kept), its first `MAX_CLUSTER_ROWS` clusters; none without sizes."""
    lines: list[str] = []
    sizes, kept = list(r.get("cluster_sizes") or []), list(r.get("kept_per_cluster") or [])
    if sizes and len(kept) == len(sizes):
        lines += ["", "### Examples per cluster (full data → kept)", "",
                  "| Cluster | Full data | Kept | Kept share |", "|---:|---:|---:|---:|"]
        for cluster, (size, k) in enumerate(zip(sizes[:MAX_CLUSTER_ROWS], kept)):
            lines.append(f"| {cluster} | {int(size):,} | {int(k):,} | {_percent(k / size if size else 0.0)} |")
        if len(sizes) > MAX_CLUSTER_ROWS:
            lines.append(f"\n{len(sizes) - MAX_CLUSTER_ROWS:,} more clusters are listed in the selection report JSON.")
    return lines


def replace_section(content: str, section: str) -> str:
    """`content` with its marked section replaced by `section`, or with `section` appended when it has none.

    A start marker without an end marker is taken to run to the end of `content`.
    """
    start = content.find(START_MARKER)
    if start < 0:
        return content.rstrip("\n") + "\n\n" + section + "\n"
    end = content.find(END_MARKER, start)
    tail = "" if end < 0 else content[end + len(END_MARKER):]
    return content[:start] + section + (tail if tail else "\n")


def _atomic_write(path: str, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def _evaluation_lines(metrics: Mapping[str, Any] | None) -> list[str]:
    """The run's `eval_*` metrics as a table (none: a line saying no evaluation ran)."""
    scalars = {k: v for k, v in (metrics or {}).items() if k.startswith("eval_") and isinstance(v, (int, float))}
    if not scalars:
        return ["", "### Evaluation", "", "No evaluation ran in this training run (`Trainer.evaluate`, `eval_strategy`)."]
    step = (metrics or {}).get("step")
    where = f"at optimizer step {int(step):,}" if step is not None else "at the end of training"
    lines = ["", "### Evaluation", "", f"Measured by `Trainer.evaluate` on the evaluation dataset {where} (the model "
             "trained on the selection; no random-subset run is part of this training run).", "",
             "| Metric | Value |", "|---|---|"]
    return lines + [f"| {_cell(k)} | {v:.4g} |" for k, v in sorted(scalars.items())]


def selection_metadata(report: Any) -> dict[str, Any]:
    """YAML metadata of the card: `data_selection: hf_cluster_select` and the selection's measured headline figures
    (`data_fraction` asked, `fraction_kept`, `n_examples`, `n_kept`, `n_clusters`, `clustering_method`,
    `selection_seconds`, `fraction_saved` with its `fraction_saved_basis`: measured or estimated)."""
    r = _values(report)
    values = {"data_selection": "hf_cluster_select",
              "data_fraction": (r.get("config") or {}).get("data_fraction"),
              "fraction_kept": r.get("fraction_kept"), "n_examples": r.get("n_examples"), "n_kept": r.get("n_kept"),
              "n_clusters": r.get("n_clusters"), "clustering_method": r.get("clustering_method"),
              "selection_seconds": r.get("selection_seconds"), "fraction_saved": r.get("fraction_saved"),
              "fraction_saved_basis": ("measured" if r.get("full_data_seconds_basis") == "measured" else "estimated")
              if r.get("fraction_saved") is not None else None}
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in values.items() if v is not None}


def with_metadata(text: str, metadata: Mapping[str, Any]) -> str:
    """`text` (a card) with `metadata` set in its YAML header, as `key: value` lines (JSON scalars, valid YAML);
    every other line of the header (TRL's, PEFT's) is kept as written. A card without a header gets one."""
    ours = [f"{key}: {json.dumps(value)}" for key, value in metadata.items()]
    if text.startswith("---\n") and "\n---\n" in text[3:]:
        end = text.index("\n---\n", 3)
        header = [line for line in text[4:end].split("\n") if line.split(":", 1)[0] not in metadata]
        return "---\n" + "\n".join(header + ours) + text[end:]
    return "---\n" + "\n".join(ours) + "\n---\n\n" + text


def write_model_card(
    output_dir: str | os.PathLike,
    report: Any,
    *,
    base_model: str | None = None,
    dataset_name: str | None = None,
    plot_filename: str | None = None,
    map_filename: str | None = None,
) -> str:
    """Write or update `output_dir/README.md` with the selection section. Call it on the main process only.

    An existing README (from `Trainer.create_model_card`, TRL or PEFT) keeps all its content; our marked section is
    replaced if present, else appended. Otherwise a new card is rendered with `huggingface_hub.ModelCard.from_template`
    (`library_name: transformers`, tags `hf_cluster_select` and `data-selection`).

    Args:
        output_dir (`str` or `os.PathLike`): the folder the model was saved to; created if missing.
        report (`SelectionReport` or its `to_dict()`): the measured record of the selection.
        base_model (`str`, *optional*): the model fine-tuned from. Written as `base_model` metadata only when it
            looks like a Hub id (`owner/name`, not a local path); a local path is never written to the card.
        dataset_name (`str`, *optional*): name of the training data; a Hub id also goes into the `datasets` metadata.
        plot_filename (`str`, *optional*): the cluster-size PNG; a path inside `output_dir` is linked relative to it.
        map_filename (`str`, *optional*): the feature-map PNG, relative to `output_dir`.
    Returns:
        `str`: path of the README written.
    """
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "README.md")
    if plot_filename:
        plot_filename = os.fspath(plot_filename)
        if os.path.isabs(plot_filename):
            relative = os.path.relpath(plot_filename, os.path.abspath(output_dir))
            plot_filename = os.path.basename(plot_filename) if relative.startswith("..") else relative
    section = selection_card_section(report, plot_filename=plot_filename, map_filename=map_filename)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            text = without_local_base_model(replace_section(handle.read(), section))
    else:
        from huggingface_hub import ModelCard, ModelCardData

        hub_model = base_model if looks_like_hub_id(base_model) else None
        hub_dataset = dataset_name if looks_like_hub_id(dataset_name) else None
        data = ModelCardData(
            library_name="transformers", tags=["hf_cluster_select", "data-selection"], base_model=hub_model,
            datasets=[hub_dataset] if hub_dataset else None,
        )
        if hub_model:
            source = f"from [{hub_model}](https://huggingface.co/{hub_model})"
        else:
            source = "from a local model" if base_model else "from a base model"
        dataset = ""
        if hub_dataset:
            dataset = f" on [{hub_dataset}](https://huggingface.co/datasets/{hub_dataset})"
        elif dataset_name and not os.path.exists(dataset_name) and not dataset_name.startswith(("/", ".", "~")):
            dataset = f" on {dataset_name}"
        card = ModelCard.from_template(
            data, template_str=_TEMPLATE, model_name=os.path.basename(os.path.abspath(output_dir)),
            source=source, dataset=dataset, selection_section=section,
        )
        text = str(card).rstrip("\n") + "\n"
    _atomic_write(path, with_metadata(text, selection_metadata(report)))
    return path
