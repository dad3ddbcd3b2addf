"""`hf-cluster-select report DIR`: the summary and per-cluster table of a `select` output folder (layer L5)."""

from __future__ import annotations

import json
import os

from .reporting.settings_text import duplicate_settings, noise_settings

TEXT_PREVIEW = 120  # characters of each example shown by `report`


def format_report(folder: str, examples: int = 3) -> str:
    """The summary and per-cluster Markdown table of a `select` output folder (or of its `selection_report.json`).

    Raises:
        ValueError: if the folder does not exist or holds no `selection_report.json`.
    """
    from .reporting.outputs import REPORT_FILENAME

    if os.path.basename(os.path.normpath(folder)) == REPORT_FILENAME and os.path.isfile(folder):
        folder = os.path.dirname(os.path.abspath(folder))  # the report file itself: its folder
    path = os.path.join(folder, REPORT_FILENAME)
    if not os.path.exists(folder):
        raise ValueError(f"{folder!r} does not exist: give the `--output` folder of `hf-cluster-select select`.")
    if not os.path.isfile(path):
        raise ValueError(f"{folder!r} holds no {REPORT_FILENAME}: run `hf-cluster-select select` first.")
    with open(path, encoding="utf-8") as handle:
        report = json.load(handle)
    inspection_path = os.path.join(folder, "clusters.json")
    clusters = json.load(open(inspection_path, encoding="utf-8")) if os.path.isfile(inspection_path) else []
    lines = [f"kept {report['n_kept']} of {report['n_examples']} examples ({report['fraction_kept']:.1%}) in "
             f"{report['n_clusters']} clusters ({report['clustering_method']}; {report['n_noise']} noise points); "
             f"features {report.get('features_seconds') or 0:.1f} s, "
             f"clustering {report.get('clustering_seconds') or 0:.1f} s", *_stage_lines(report),
             *_near_duplicate_lines(report), *_noise_lines(report),
             *_token_lines(report),
             *_target_lines(report.get("target")), "",
             "| cluster | size | kept | weight | mean tokens | mean loss (nats) | examples |",
             "|---|---|---|---|---|---|---|"]
    for row in clusters:
        texts = " · ".join(t[:TEXT_PREVIEW].replace("|", "/").replace("\n", " ") for t in row["examples"][:examples])
        lines.append(f"| {row['cluster']} | {row['size']} | {row['kept']} | {row['weight']:.3g} | "
                     f"{row['mean_tokens']:.1f} | {'—' if row['mean_loss'] is None else format(row['mean_loss'], '.3f')} | {texts} |")
    return "\n".join(lines)


def _stage_lines(report: dict) -> list[str]:
    """The clustering seconds split by stage (`SelectionReport.stage_seconds`), in the order the stages ran."""
    stages = report.get("stage_seconds")
    if not stages:
        return []
    return ["stages: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in stages.items())]


def _near_duplicate_lines(report: dict) -> list[str]:
    """With the token near-duplicate check run: how many examples it put into an earlier example's group."""
    if report.get("n_near_duplicate_rows") is None:
        return []
    settings = duplicate_settings(report.get("clustering_params") or {})
    return [f"near duplicates: {report['n_near_duplicate_rows']} examples joined an earlier example's group "
            f"(token check, {settings}, {report.get('near_duplicates_seconds') or 0:.2f} s)"]


def _noise_lines(report: dict) -> list[str]:
    """With the noise filter run: how many examples it deferred, at which share."""
    if report.get("n_suspected_noise") is None:
        return []
    return [f"suspected noise: {report['n_suspected_noise']} examples deferred "
            f"({noise_settings(report.get('clustering_params') or {})} of each cluster, lowest k-NN agreement)"]


def _target_lines(target: dict | None) -> list[str]:
    """With a target set: the budget each target task took, and the relevance of the kept set against all."""
    if not target:
        return []
    tasks = ", ".join(f"{n} {k}" for n, k in zip(target["task_names"], target["kept_per_task"]))
    kept = ("every distinct example kept (the budget covers them), per nearest task " if target.get("all_distinct_kept")
            else "kept per task ")
    return [f"target {target['source']}: {kept}{tasks}, coverage floor {target['coverage_kept']}; "
            f"relevance (best task's max cosine) kept {target['mean_relevance_kept']} vs all "
            f"{target['mean_relevance_pool']}"]


def _token_lines(report: dict) -> list[str]:
    """The token shares of a selection report: loss-bearing (or input) tokens kept, and under
    `budget_unit="tokens"` the input tokens kept, which is what the budget counts."""
    kind = "loss-bearing" if report.get("token_kind", "loss") == "loss" else "input"
    lines = []
    if report.get("tokens_total"):
        lines.append(f"kept {report['tokens_kept']} of {report['tokens_total']} {kind} tokens "
                     f"({report['tokens_kept'] / report['tokens_total']:.1%})")
    if (report.get("config") or {}).get("budget_unit") == "tokens" and report.get("input_tokens_total"):
        lines.append(f"kept {report['input_tokens_kept']} of {report['input_tokens_total']} input tokens "
                     f"({report['input_tokens_kept'] / report['input_tokens_total']:.1%}): what "
                     f"budget_unit='tokens' counts")
    return lines
