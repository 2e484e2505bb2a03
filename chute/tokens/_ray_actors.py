"""``chute convert --tokenizer ... --ray ADDRESS``: the chunks tokenized by Ray actors.

Each actor loads the tokenizer once and tokenizes the chunks it is handed; chunk
``i`` goes to actor ``i % actors`` and results are taken in chunk order, at most
two chunks per actor in flight, so the dataset is the same bytes as with worker
processes and the driver's memory stays flat. The driver reads the corpus and
writes the dataset (the text must be readable from the driver; the tokenizing,
the costly part, is what spreads over the cluster).
"""

from __future__ import annotations

import collections
from collections.abc import Generator, Iterable
from typing import Any

from chute.errors import ChuteError
from chute.tokens._corpus import Chunk
from chute.tokens._encoders import Encoder
from chute.tokens._workers import Tokenized, tokenize_chunk


class _Tokenizer:
    """A Ray actor's state: the tokenizer, loaded once."""

    def __init__(self, encoder: Encoder, keep_empty: bool) -> None:
        self.encoder, self.keep_empty = encoder, keep_empty

    def tokenize(self, chunk: Chunk) -> list[Tokenized]:
        return tokenize_chunk(self.encoder, self.keep_empty, chunk)


def tokenize_on_ray(
    chunks: Iterable[Chunk], encoder: Encoder, keep_empty: bool, address: str, actors: int | None = None
) -> Generator[Tokenized, None, None]:
    """The chunks' results, in order, tokenized by ``actors`` Ray actors (default: one per CPU of the cluster)."""
    try:
        import ray
    except ImportError:
        raise ChuteError("--ray needs Ray: pip install 'chute[ray]'") from None
    from chute.ray.convert import connect

    connect(address)
    count = actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
    actor_class: Any = ray.remote(num_cpus=1)(_Tokenizer)  # Ray's stubs cannot type an actor's method.remote
    pool = [actor_class.remote(encoder, keep_empty) for _ in range(count)]
    pending: collections.deque = collections.deque()
    try:
        for i, chunk in enumerate(chunks):
            pending.append(pool[i % count].tokenize.remote(chunk))
            if len(pending) >= 2 * count:
                yield from _get(ray, pending.popleft())
        while pending:
            yield from _get(ray, pending.popleft())
    finally:
        for actor in pool:  # also ends the chunks still queued on it
            ray.kill(actor)


def _get(ray, ref) -> list[Tokenized]:
    """``ray.get(ref)``, re-raising a chute error from the actor as itself (not wrapped in Ray's traceback)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ChuteError):
            raise exc.cause from None
        raise
