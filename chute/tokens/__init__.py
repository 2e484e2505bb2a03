"""Token datasets for language models (docs/tokens.md).

=============  ==============================================================
module         what
=============  ==============================================================
``writer``     :func:`write`, :class:`TokenWriter`: documents in, a token dataset out
=============  ==============================================================
"""

from chute.tokens.writer import TokenWriter, write

__all__ = ["write", "TokenWriter"]
