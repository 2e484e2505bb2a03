"""Weighted mixtures of datasets: ``chute.mix`` (see docs/mix.md).

=============  ==============================================================
module         what
=============  ==============================================================
``order``      :class:`MixOrder`: which source rows each batch holds (pure)
``dataset``    :class:`Mixture`: the sources read as one dataset
=============  ==============================================================
"""

from chute.mixture.dataset import Mixture, mix
from chute.mixture.order import MixOrder

__all__ = ["mix", "Mixture", "MixOrder"]
