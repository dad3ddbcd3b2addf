"""ClusterSFTTrainer: drop-in `trl.SFTTrainer` with cluster-based data selection (layer L4).

`ClusterSelectMixin` (trainer.py) placed before TRL's trainer in the bases; the TRL-specific checks live in
`trl_checks.py`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import numpy as np

from ..config import ClusterSelectConfig
from .trainer import ClusterSelectMixin
from .trl_checks import (
    DEFAULT_MAX_DROPPED_FRACTION,
    ExampleWeightedForward,
    check_dropped,
    check_sft_args,
    check_sft_dataset,
    loss_free_examples,
    tokenizer_adds_eos,
)

logger = logging.getLogger(__name__)


try:  # TRL is a core dependency, but keep `ClusterTrainer` importable without it
    from trl import SFTTrainer as _SFTTrainer
except ImportError:  # pragma: no cover
    _SFTTrainer = None

if _SFTTrainer is not None:

    class ClusterSFTTrainer(ClusterSelectMixin, _SFTTrainer):
        """`trl.SFTTrainer` with the same selection as `ClusterTrainer`: change the class name, add `cluster_config`.

            trainer = ClusterSFTTrainer(model=model, args=SFTConfig(..., bf16=False, use_cpu=True),
                                        train_dataset=train, processing_class=tokenizer, peft_config=lora,
                                        cluster_config=ClusterSelectConfig(data_fraction=0.3))

        Accepts what `SFTTrainer` accepts: `text` (language modelling), `prompt`/`completion` and `messages` (chat
        template) datasets, or tokenized `input_ids` (+ `labels`); `completion_only_loss` and `assistant_only_loss`;
        `peft_config` (features come from the adapted model; adapters are saved as usual). Selection works on the
        dataset as TRL prepared it (tokenized, labelled, truncated), so steps, budget and indices refer to
        `trainer.train_dataset`.

        Features count loss-bearing tokens only (labels ≠ -100: the completion, or the assistant turns): prompt tokens
        add no term to an example's feature. With the default `feature_context="full"` the prompt is still the
        context those tokens are predicted from, as in CluSTER; with `ClusterSelectConfig(strategy_kwargs=
        {"feature_context": "loss_tokens"})` features are computed from the loss-bearing tokens alone, so examples with the same
        loss-bearing tokens get the same features whatever their prompts.

        After selection the loss keeps TRL's fused path (and its `entropy` / `mean_token_accuracy` metrics) with each
        example's per-token log-probabilities multiplied by its selection weight.

        Args:
            *args, **kwargs: everything `trl.SFTTrainer` takes, unchanged.
            cluster_config (`ClusterSelectConfig`, *optional*): selection settings; defaults to `ClusterSelectConfig()`.
            target_dataset (`datasets.Dataset`, *optional*): a target set in `train_dataset`'s format (raw rows,
                prepared here the same way); see `ClusterTrainer`.
            max_dropped_fraction (`float`, *optional*, defaults to `0.25`): largest share of `train_dataset` that may be
                left without a loss-bearing token by preparation (TRL drops such examples after truncation to
                `max_length`; any left are dropped here too). Their count is `n_dropped_by_preparation` in the
                selection report.
        Raises:
            ValueError: before any model is loaded or any example tokenized: a `DatasetDict` or dict of splits
                (names the splits), a streaming or empty dataset, columns that match no format (names the columns),
                `packing=True`, `padding_free=True`, `loss_type != "nll"`, label smoothing, `compute_loss_func`;
                after TRL prepared the data (before any model work): more than `max_dropped_fraction` of the
                examples without a loss-bearing token; and everything `ClusterTrainer` raises from `train()`.
        """

        _tag_names = ["trl", "sft", "hf_cluster_select"]

        def __init__(
            self,
            *args: Any,
            cluster_config: ClusterSelectConfig | None = None,
            max_dropped_fraction: float = DEFAULT_MAX_DROPPED_FRACTION,
            target_dataset: Any = None,
            **kwargs: Any,
        ) -> None:
            if isinstance(max_dropped_fraction, bool) or not 0.0 <= float(max_dropped_fraction) <= 1.0:
                raise ValueError(f"`max_dropped_fraction` must be in [0, 1], got {max_dropped_fraction!r}.")
            try:
                given = inspect.signature(_SFTTrainer.__init__).bind(None, *args, **kwargs).arguments
            except TypeError:  # let SFTTrainer report its own signature errors
                given = {}
            args_given = given.get("args")
            n_given = None
            if given:
                self.sft_format = check_sft_dataset(
                    given.get("train_dataset"),
                    dataset_text_field=getattr(args_given, "dataset_text_field", "text"),
                    formatting_func=given.get("formatting_func"),
                )
                check_sft_args(args_given, compute_loss_func=given.get("compute_loss_func"))
                n_given = len(given["train_dataset"])
                first = given["train_dataset"][0]
                text_field = getattr(args_given, "dataset_text_field", "text")
                target = first.get("completion", first.get(text_field)) if hasattr(first, "get") else None
                if isinstance(target, str) and tokenizer_adds_eos(given.get("processing_class")):
                    logger.warning(
                        "The tokenizer appends EOS itself and TRL appends it to every text/completion too: each "
                        "example will end with a doubled EOS. Use a tokenizer without an EOS post-processor."
                    )
            self._cs_formatting_func = given.get("formatting_func")
            super().__init__(*args, cluster_config=cluster_config, target_dataset=target_dataset, **kwargs)
            parallelism = getattr(self.accelerator, "parallelism_config", None)
            if parallelism is not None and getattr(parallelism, "sp_enabled", False):
                raise ValueError("ClusterSFTTrainer does not support sequence parallelism (per-example loss weights).")
            if self.args.device.type == "cpu" and (self.args.bf16 or self.args.gradient_checkpointing):
                logger.warning(
                    "Training on CPU with bf16=%s and activation checkpointing=%s: on CPU both only cost time "
                    "(about 4x slower, same losses). Pass `SFTConfig(bf16=False, activation_checkpointing=False)`.",
                    self.args.bf16, self.args.gradient_checkpointing,
                )
            self.n_dropped_by_preparation = self._cs_drop_loss_free(n_given, float(max_dropped_fraction))

        def _cs_drop_loss_free(self, n_given: int | None, max_dropped_fraction: float) -> int:
            """Drop prepared examples without a loss-bearing token; return how many preparation dropped in all."""
            prepared = self.train_dataset
            empty = loss_free_examples(prepared)
            if empty.size:
                keep = np.setdiff1d(np.arange(len(prepared)), empty)
                select = getattr(prepared, "select", None)
                self.train_dataset = select(keep) if callable(select) else [prepared[i] for i in keep]
            if n_given is None:
                return int(empty.size)
            dropped = n_given - len(self.train_dataset)
            check_dropped(n_given, dropped, max_dropped_fraction, max_length=getattr(self.args, "max_length", None))
            if dropped:
                logger.warning(
                    "%d of %d training examples had no loss-bearing token after preparation (truncation to max_length="
                    "%s) and were dropped; selection uses the remaining %d (see `n_dropped_by_preparation` in the "
                    "selection report).", dropped, n_given, getattr(self.args, "max_length", None), n_given - dropped,
                )
            return int(dropped)

        def _cs_prepare_target(self, dataset: Any) -> Any:
            """`target_dataset` prepared as TRL prepared `train_dataset` (tokenized, completion mask), unless
            `dataset_kwargs={"skip_prepare_dataset": True}`.

            Raises:
                ValueError: if its format (text, prompt-completion, conversational, tokenized) is not
                    `train_dataset`'s.
            """
            fmt = check_sft_dataset(dataset, dataset_text_field=getattr(self.args, "dataset_text_field", "text"),
                                    formatting_func=self._cs_formatting_func, name="target_dataset")
            expected = getattr(self, "sft_format", None)
            if expected is not None and fmt != expected:
                raise ValueError(f"`target_dataset` is not in the training data's format: it is {fmt} data, "
                                 f"`train_dataset` is {expected} data. Give the target rows in the same format.")
            if (getattr(self.args, "dataset_kwargs", None) or {}).get("skip_prepare_dataset"):
                return dataset
            return self._prepare_dataset(dataset, self.processing_class, self.args, False, self._cs_formatting_func,
                                         "target")

        def _cs_dropped_by_preparation(self) -> int | None:
            """The examples TRL's preparation left without a loss-bearing token, dropped in `__init__`."""
            return self.n_dropped_by_preparation

        def _cs_weighted_loss(self, model, inputs, weights, return_outputs=False, num_items_in_batch=None):
            """TRL's own `compute_loss` (fused LM head, metrics) with per-example weighted log-probabilities."""
            return super(ClusterSelectMixin, self).compute_loss(  # SFTTrainer's, past the mixin's weight lookup
                ExampleWeightedForward(model, weights), inputs, return_outputs=return_outputs,
                num_items_in_batch=num_items_in_batch,
            )

else:  # pragma: no cover
    ClusterSFTTrainer = None
