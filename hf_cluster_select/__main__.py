"""`python -m hf_cluster_select` runs the `hf-cluster-select` command (`hf_cluster_select.commands.main`)."""

import sys

from .commands import main

sys.exit(main())
