"""Token datasets for language models (docs/tokens.md).

=============  ==============================================================
module         what
=============  ==============================================================
``writer``     :func:`write`, :class:`TokenWriter`: documents in, a token dataset out
``source``     token sources: per shard, its tokens and document offsets
``sequences``  :func:`sequences`: fixed-length samples (concat or document packing)
``files``      :func:`megatron`, :func:`flat`: existing token files read in place
``steps``      :func:`which`: the documents and token ranges that fed a step, per rank
``split``      :func:`split`: held-out parts by whole documents, deterministic and exact
``text``       :func:`convert`: a text corpus tokenized into a token dataset
=============  ==============================================================
"""

from chute.tokens.files import flat, megatron
from chute.tokens.sequences import Sequences, sequences
from chute.tokens.split import split
from chute.tokens.steps import Piece, which
from chute.tokens.text import convert
from chute.tokens.writer import TokenWriter, write

__all__ = ["write", "TokenWriter", "sequences", "Sequences", "megatron", "flat", "which", "Piece", "convert", "split"]
