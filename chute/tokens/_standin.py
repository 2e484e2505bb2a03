"""TEMPORARY stand-in for chute.tokens.write (branch tokens); removed when that branch is merged."""

from __future__ import annotations

import numpy as np

import chute


def write(docs, path, *, vocab_size=None, eos_id=None, shard_size="128MB", metadata=None, overwrite=False, **_):
    dtype = "uint16" if vocab_size is not None and vocab_size <= 65536 else "uint32"

    def rows():
        for doc in docs:
            doc = np.asarray(doc)
            if eos_id is not None:
                doc = np.append(doc, eos_id)
            yield {"tokens": doc.astype(dtype)}

    return chute.write(rows(), path, schema={"tokens": chute.Ragged(dtype, 1)}, shard_size=shard_size,
                       metadata=metadata, overwrite=overwrite)
