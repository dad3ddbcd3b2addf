"""Right-padding collator for tokenized examples (layer L2): the batches of the `select` command and the demo.

torch is imported inside the function, so importing this module (and the demo package that re-exports it) stays
cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

from .loss_tokens import IGNORE_INDEX


def pad_collate(features: Sequence[dict], pad_token_id: int) -> dict:
    """Right-pad a list of tokenized examples into a batch.

    Args:
        features (`list[dict]`): each with `input_ids` and optionally `attention_mask` and `labels` (lists or 1-D
            tensors of the same length as its `input_ids`); `labels` are used when the first example has them.
        pad_token_id (`int`): id written into padded `input_ids` positions (may equal EOS: labels never derive
            from it).
    Returns:
        `dict[str, torch.Tensor]`: `input_ids` (`pad_token_id` on padding), `attention_mask` (the example's mask, or
        1, on its tokens; 0 on padding) and, when given, `labels` (-100 on padding), each int64 of shape
        `[batch, longest]`.
    Raises:
        ValueError: if `features` is empty or an example has no `input_ids`.
    """
    import torch

    if len(features) == 0:
        raise ValueError("`features` is empty: a batch needs at least one tokenized example.")
    missing = [row for row, feature in enumerate(features) if "input_ids" not in feature]
    if missing:
        raise ValueError(f"every example needs `input_ids`; example(s) {missing} of the batch have none.")
    longest = max(len(feature["input_ids"]) for feature in features)
    has_labels = "labels" in features[0]
    input_ids = torch.full((len(features), longest), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(features), longest), dtype=torch.long)
    labels = torch.full((len(features), longest), IGNORE_INDEX, dtype=torch.long)
    for row, feature in enumerate(features):
        length = len(feature["input_ids"])
        input_ids[row, :length] = torch.as_tensor(feature["input_ids"], dtype=torch.long)
        mask = feature.get("attention_mask")
        attention_mask[row, :length] = 1 if mask is None else torch.as_tensor(mask, dtype=torch.long)
        if has_labels:
            labels[row, :length] = torch.as_tensor(feature["labels"], dtype=torch.long)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if has_labels:
        batch["labels"] = labels
    return batch
