"""Integrations (layer L4): the Trainer adapter (`trainer.py`), the TRL adapter (`sft.py`, checks in
`trl_checks.py`), the callback (`callbacks.py`) and the tested version range with its hook signatures
(`compat.py`). The only modules that import transformers' Trainer API."""
