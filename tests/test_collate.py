"""The right-padding collator (`hf_cluster_select.collate`): exact padded tensors and its errors."""

from __future__ import annotations

import pytest
import torch

from hf_cluster_select.collate import pad_collate


def test_pads_right_with_pad_id_label_minus_100_and_zero_mask():
    features = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
        {"input_ids": torch.tensor([8]), "attention_mask": torch.tensor([1]), "labels": torch.tensor([8])},
        {"input_ids": [9, 10], "attention_mask": [1, 0], "labels": [-100, -100]},
    ]
    batch = pad_collate(features, pad_token_id=0)
    assert list(batch) == ["input_ids", "attention_mask", "labels"]
    assert all(t.dtype == torch.int64 for t in batch.values())
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0]]))
    assert torch.equal(batch["labels"], torch.tensor([[-100, 6, 7], [8, -100, -100], [-100, -100, -100]]))


def test_without_labels_only_ids_and_mask():
    batch = pad_collate([{"input_ids": [3]}, {"input_ids": [4, 5]}], pad_token_id=2)
    assert list(batch) == ["input_ids", "attention_mask"]
    assert torch.equal(batch["input_ids"], torch.tensor([[3, 2], [4, 5]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 0], [1, 1]]))


def test_pad_id_may_equal_a_labelled_token():
    """pad == EOS (SmolLM2): the EOS label survives, the padding's label is -100."""
    batch = pad_collate([{"input_ids": [1, 7], "labels": [-100, 7]}, {"input_ids": [1, 4, 7], "labels": [-100, 4, 7]}],
                        pad_token_id=7)
    assert torch.equal(batch["input_ids"], torch.tensor([[1, 7, 7], [1, 4, 7]]))
    assert torch.equal(batch["labels"], torch.tensor([[-100, 7, -100], [-100, 4, 7]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 0], [1, 1, 1]]))


def test_empty_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="`features` is empty"):
        pad_collate([], pad_token_id=0)


def test_row_without_input_ids_is_a_clear_error():
    with pytest.raises(ValueError, match=r"example\(s\) \[1\] of the batch have none"):
        pad_collate([{"input_ids": [1]}, {"labels": [1]}], pad_token_id=0)


def test_the_demo_reexports_the_library_collator():
    from hf_cluster_select.demo import mathqa

    assert mathqa.pad_collate is pad_collate
