"""chute on Ray Data: write a Ray Dataset as a chute dataset, read a chute dataset as a Ray Dataset.

=============  ==============================================================
module         what
=============  ==============================================================
``columns``    Ray blocks (Arrow, with Ray's tensor types) -> chute columns
``sink``       the Datasink: tasks write shards, the driver the manifest
``source``     the Datasource: one read task per group of shards
``convert``    ``convert_on_ray`` (``chute convert --ray``): a source read by Ray tasks
=============  ==============================================================

An optional extra (``pip install 'chute[ray]'``); ``import chute`` never imports
Ray. See docs/ray.md.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ray") is None:
    raise ImportError("chute.ray needs Ray Data: pip install 'chute[ray]'")

from chute.ray.convert import convert_on_ray  # noqa: E402
from chute.ray.sink import ChuteDatasink, write  # noqa: E402
from chute.ray.source import ChuteDatasource, read  # noqa: E402

__all__ = ["write", "read", "convert_on_ray", "ChuteDatasink", "ChuteDatasource"]
