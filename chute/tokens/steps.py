"""Steps as first-class: which documents and token ranges fed a given step, on every rank.

The global order (:class:`chute.order.Order`, or a mixture's
:class:`chute.mixture.order.MixOrder`) says which sequences each rank reads at
each step; a sequence view says which tokens each sequence holds. So "what did
step N see?" is a pure function of the dataset, the loader settings and N,
answered here without reading a single token: only the document offsets of the
shards involved are read, and, for a converted corpus, the rows of the
documents named (their origin and kept fields).

The settings come from the run itself: a :class:`chute.Loader` (its dataset,
batch size, world size, shuffle, seed, window, epoch, position and, for a
mixture, its weight history) or a ``loader.state_dict()`` with the data it was
read from. Given the data alone, the settings are arguments whose defaults are
the Loader's (``shuffle=False``, ``seed=0``, one rank).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.order import DEFAULT_WINDOW, Order
from chute.tokens._args import integer
from chute.tokens._corpus import origin

__all__ = ["Piece", "which"]

_NOT_FIELDS = ("tokens",)


@dataclasses.dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of document ``document`` (its number in its dataset, from 0), read by ``sequence``
    (the view's row) at position ``row`` of ``rank``'s batch.

    ``dataset`` is the mixture's name of the dataset the piece comes from (None outside a mixture); ``fields`` the
    document's recorded columns besides its tokens: for a converted corpus ``source_file`` and ``source_line``
    (where the document is in the corpus) and the fields kept with ``keep=``; empty for other token data.
    ``origin`` is where the document is, as chute's messages name it (``corpus.jsonl line 41``), if recorded.
    """

    rank: int
    row: int
    sequence: int
    shard: int
    document: int
    start: int
    stop: int
    dataset: str | None = None
    fields: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    origin: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("dataset", "origin"):
            if out[key] is None:
                del out[key]
        return out


@dataclasses.dataclass(frozen=True)
class _Run:
    """What ``which`` needs of a run: the data, its order, the batch geometry and where the epoch stood."""

    data: Any  # a Sequences view, or a Mixture of them
    order: Any
    batch_size: int
    world_size: int
    epoch: int
    position: int  # rows of the epoch consumed at the settings' position (0: the epoch's start)


def which(
    run: Any, step: int, batch_size: int | None = None, *, data: Any = None, seq_len: int | None = None,
    pack: str = "concat", world_size: int | None = None, epoch: int | None = None, shuffle: bool | None = None,
    seed: int | None = None, window: int | None = None, drop_last: bool | None = None,
) -> list[list[Piece]]:
    """Per rank, the document pieces that fed global step ``step`` (counted from the start of the epoch).

    ``run`` is one of:

    - a :class:`chute.Loader` (of a token view or a mixture of them): every setting is the loader's, and the
      epoch is the one it is reading (between epochs: the next one); ``epoch=`` picks another;
    - a ``loader.state_dict()``, with ``data=`` the view (or mixture) the loader read: the settings are the
      state's (batch size, world size, seed, shuffle, window, epoch, a mixture's weights); with ``stages=`` that
      keep state, the Loader's state is found where they nested it (under ``"source"``, or the one inside);
    - the data itself: a :class:`chute.tokens.Sequences` view, a mixture of views, or anything
      :func:`chute.tokens.sequences` takes with ``seq_len`` and ``pack``; the settings are the arguments, which
      default to the Loader's (``shuffle=False``, ``seed=0``, ``world_size=1``, ``epoch=0``).

    Steps count global batches of ``batch_size * world_size`` sequences from the epoch's start. A run resumed
    inside the epoch numbers its batches on from the step its position falls in; steps before the position are
    those of the same settings from the epoch's start. A window of ``pack="concat"`` lists every document it
    touches, its last token being the next window's first (the label of its last position).
    """
    step = integer(step, "step", 0, 2**63 - 1)
    settings = {"batch_size": batch_size, "world_size": world_size, "shuffle": shuffle, "seed": seed,
                "window": window, "drop_last": drop_last, "seq_len": seq_len, "data": data}
    if _is_loader(run):
        given = [k for k, v in settings.items() if v is not None]
        if given:
            raise ValueError(f"which(loader, step) takes {', '.join(given)} from the loader; pass only step (and epoch=)")
        resolved = _from_loader(run, epoch)
    elif isinstance(run, Mapping):
        if data is None:
            raise ValueError("which(state_dict, step) needs data=: the view (or mixture) the loader read")
        given = [k for k, v in settings.items() if v is not None and k not in ("data", "seq_len", "drop_last")]
        if given or epoch is not None:
            raise ValueError(f"which(state_dict, step) takes {', '.join(given + ['epoch'] * (epoch is not None))} "
                             "from the state; pass only step, data= (and seq_len=, pack= for a dataset)")
        resolved = _from_state(run, _view(data, seq_len, pack), bool(drop_last))
    else:
        if data is not None:
            raise ValueError("data= goes with a state_dict; which(data, step, batch_size, ...) takes the data first")
        if batch_size is None:
            raise ValueError("which(data, step, batch_size, ...) needs the loader's batch_size (per rank)")
        view = _view(run, seq_len, pack)
        b = integer(batch_size, "batch_size", 1, 2**62)
        w = integer(1 if world_size is None else world_size, "world_size", 1, 2**20)
        s = _seed(0 if seed is None else seed)
        win = integer(DEFAULT_WINDOW if window is None else window, "window", 1, 2**62)
        order = _order(view, b, bool(shuffle), s, win, bool(drop_last))
        resolved = _Run(view, order, b, w, integer(0 if epoch is None else epoch, "epoch", 0, 2**62), 0)
    return _pieces_of_step(resolved, step)


def _is_loader(run: Any) -> bool:
    return all(hasattr(run, name) for name in ("state_dict", "dataset", "order", "batch_size", "world_size"))


def _view(data: Any, seq_len: Any, pack: str) -> Any:
    """A Sequences view or a mixture of them, as given, or ``sequences(data, seq_len, pack)``."""
    from chute.tokens.sequences import Sequences, sequences

    if isinstance(data, Sequences):
        return data
    if _is_mixture(data):
        _check_views(data)
        return data
    if seq_len is None:
        raise ValueError("which needs seq_len= unless it is given a chute.tokens.sequences view (or a mixture of them)")
    return sequences(data, seq_len, pack=pack)


def _is_mixture(data: Any) -> bool:
    from chute.mixture.dataset import Mixture

    return isinstance(data, Mixture)


def _check_views(mixture: Any) -> None:
    from chute.tokens.sequences import Sequences

    others = [name for name, ds in mixture.sources.items() if not isinstance(ds, Sequences)]
    if others:
        raise ChuteError(f"which names the documents of token views; the mixture's {others} are not "
                         "chute.tokens.sequences(...) views")


def _seed(seed: Any) -> int:
    return integer(seed, "seed", 0, 2**63 - 1)


def _order(view: Any, batch_size: int, shuffle: bool, seed: int, window: int, drop_last: bool) -> Any:
    if _is_mixture(view):
        return view.order(batch_size, shuffle, seed, window, drop_last)
    return Order(tuple(s.rows for s in view.shards), batch_size, shuffle, seed, window, drop_last)


def _from_loader(loader: Any, epoch: int | None) -> _Run:
    from chute.tokens.sequences import Sequences

    view = loader.dataset
    if _is_mixture(view):
        _check_views(view)
    elif not isinstance(view, Sequences):
        raise ChuteError(f"which(loader, step) needs a loader of chute.tokens.sequences(...) (or a mixture of them), "
                         f"not of {getattr(view, 'root', type(view).__name__)}")
    state = _loader_state(loader.state_dict(), "which(loader, step)")
    here = int(state["epoch"])
    chosen = here if epoch is None else integer(epoch, "epoch", 0, 2**62)
    position = int(state["consumed"]) if chosen == here else 0
    return _Run(view, loader.order, int(loader.batch_size), int(loader.world_size), chosen, position)


def _from_state(state: Mapping[str, Any], view: Any, drop_last: bool) -> _Run:
    state = _loader_state(state, "which(state_dict, step)")
    batch_size = integer(state["batch_size"], "the state's batch_size", 1, 2**62)
    order = _order(view, batch_size, bool(state["shuffle"]), _seed(state["seed"]),
                   integer(state["window"], "the state's window", 1, 2**62), drop_last)
    try:
        epoch, consumed = order.check_state(dict(state))  # a mixture adopts its weight history here
    except ValueError as exc:
        raise ChuteError(f"which(state_dict, step): the state does not belong to {view.root}: {exc}") from None
    return _Run(view, order, batch_size, integer(state["world_size"], "the state's world_size", 1, 2**20), epoch, consumed)


#: The keys of a Loader's own state (``loader.state_dict()`` without stages of one's own that keep state).
_POSITION = ("epoch", "consumed", "seed", "shuffle", "window", "batch_size", "world_size")
_DEPTH = 64  # how deep stages may nest the Loader's state (a bound: a state is data from outside)


def _loader_state(state: Mapping[str, Any], caller: str) -> Mapping[str, Any]:
    """The Loader's own state in ``state``: ``state`` itself, or where stages of one's own nested it.

    A stage that keeps state nests its source's in its own (``chute.Stage.state``), by convention under
    ``"source"``, so ``loader.state_dict()`` of a Loader with such stages is the last stage's state. That chain of
    ``"source"`` keys is followed first; otherwise the one Loader state anywhere inside (mappings and lists) is
    taken. None, or several that differ, is a :class:`~chute.errors.ChuteError` saying what was found.
    """
    node: Any = state
    for _ in range(_DEPTH):
        if not isinstance(node, Mapping):
            break
        if _is_position(node):
            return node
        node = node.get("source")
    found: list[tuple[str, Mapping[str, Any]]] = []
    closest: tuple[int, str, Mapping[str, Any]] | None = None
    todo: collections.deque[tuple[Any, str, int]] = collections.deque([(state, "", 0)])
    while todo:  # breadth first: the shallowest first
        node, path, depth = todo.popleft()
        if isinstance(node, Mapping):
            if _is_position(node):
                found.append((path, node))
                continue
            have = sum(k in node for k in _POSITION)
            if have and (closest is None or have > closest[0]):
                closest = (have, path, node)
            items: Any = node.items()
        elif isinstance(node, (list, tuple)):
            items = enumerate(node)
        else:
            continue
        if depth < _DEPTH:
            todo.extend((v, f"{path}[{k!r}]", depth + 1) for k, v in items)
    distinct = [(p, s) for i, (p, s) in enumerate(found) if all(s != t for _, t in found[:i])]
    if len(distinct) == 1:
        return distinct[0][1]
    if distinct:
        raise ChuteError(
            f"{caller}: the state holds {len(distinct)} different Loader states, at "
            f"{', '.join('state' + p for p, _ in distinct)}; a stage that keeps state nests its source's under "
            "'source': pass the Loader's own state (loader.state_dict() of a Loader without such stages, or the one "
            "your stage saved as its source's)"
        )
    if closest is not None:
        where = f" (at state{closest[1]})" if closest[1] else ""
        missing = [k for k in _POSITION if k not in closest[2]]
        raise ChuteError(f"{caller}: the state has no {', '.join(missing)}{where}; pass what loader.state_dict() returned")
    keys = list(state)[:10] if isinstance(state, Mapping) else []
    raise ChuteError(
        f"{caller}: found no Loader state in the state (a mapping with {', '.join(_POSITION)}, itself or nested by "
        f"stages under 'source'); its keys are {keys}; pass what loader.state_dict() returned"
    )


def _is_position(node: Mapping[str, Any]) -> bool:
    return all(k in node for k in _POSITION)


def _pieces_of_step(run: _Run, step: int) -> list[list[Piece]]:
    view, order, world = run.data, run.order, run.world_size
    size = run.batch_size * world
    first = -(-run.position // size)  # the step the position falls in: steps from there are the run's own
    if step >= first:
        start, local = run.position, step - first
    else:
        start, local = 0, step
    steps = order.num_batches(world, start)
    if not 0 <= local < steps:
        total = first + steps if start else steps
        raise ChuteError(
            f"step {step} is outside the {total} steps (0 to {total - 1}) of epoch {run.epoch} of {view.root} at batch "
            f"size {run.batch_size} on {world} rank(s)"
        )
    readers: dict[int, _Reader] = {}
    out = []
    for rank in range(world):
        pieces: list[Piece] = []
        for position, row in enumerate(order.batch(run.epoch, local, rank, world, start).tolist()):
            k, within, name = _source_of(view, int(row))
            reader = readers.get(k)
            if reader is None:
                reader = readers[k] = _Reader(view.sources[name] if name is not None else view, name)
            pieces += reader.pieces(rank, position, within)
        out.append(pieces)
    for reader in readers.values():
        reader.add_fields(out)
    return out


def _source_of(view: Any, row: int) -> tuple[int, int, str | None]:
    if not _is_mixture(view):
        return 0, row, None
    k, within = view.source_of(row)
    return k, within, view.names[k]


class _Reader:
    """One sequence view's pieces: its document numbering, its shards' offsets (each checked once), and the rows
    of the documents named (their recorded fields)."""

    def __init__(self, view: Any, name: str | None) -> None:
        self.view, self.name = view, name
        self.doc_base = view.source.first_documents(_documents(view))
        self.shards: dict[int, tuple[int, np.ndarray]] = {}

    def offsets(self, shard: int) -> tuple[int, np.ndarray]:
        """``(base, doc_offsets)`` of a source shard, checked never to decrease (once per shard and call)."""
        got = self.shards.get(shard)
        if got is None:
            from chute.tokens.sequences import check_documents

            _, base, offsets = self.view.source.map(shard)
            if self.view.pack == "concat":  # pack="documents" checked them in the shard's plan (view._map)
                check_documents(self.view.source, shard, offsets)
            got = self.shards[shard] = (int(base), offsets)
        return got

    def pieces(self, rank: int, position: int, row: int) -> list[Piece]:
        """The document pieces of sequence ``row``: stream (concat) or plan (documents) range, cut at documents."""
        view = self.view
        if view.pack == "concat":
            first = row * view.seq_len
            spans = []  # (shard, start, stop) of the window's L + 1 tokens in each shard
            pos, stop = first, first + view.seq_len + 1
            while pos < stop:
                shard = int(np.searchsorted(view.starts, pos, side="right")) - 1
                end = min(stop, int(view.starts[shard + 1]))
                spans.append((shard, pos - int(view.starts[shard]), end - int(view.starts[shard])))
                pos = end
        else:
            shard, local = view.locate(row)
            plan = view.plan(shard)
            base = self.offsets(shard)[0]
            spans = [(shard, int(plan[local]) - base, int(plan[local + 1]) - base)]
        pieces = []
        for shard, lo, hi in spans:
            base, offsets = self.offsets(shard)  # searched in place: the mapped offsets are never copied
            d = int(np.searchsorted(offsets, base + lo, side="right")) - 1
            while lo < hi:
                while int(offsets[d + 1]) - base <= lo:  # empty documents
                    d += 1
                begin, end = int(offsets[d]) - base, min(hi, int(offsets[d + 1]) - base)
                pieces.append(Piece(rank, position, row, shard, int(self.doc_base[shard]) + d, lo - begin, end - begin,
                                    self.name))
                lo = end
        return pieces

    def add_fields(self, ranks: list[list[Piece]]) -> None:
        """Fill in the recorded fields of this view's documents (one read of their rows), in place."""
        dataset = getattr(self.view.source, "dataset", None)
        if dataset is None or not [n for n in dataset.schema.names if n not in _NOT_FIELDS]:
            return
        mine = [(r, i) for r, pieces in enumerate(ranks) for i, p in enumerate(pieces) if p.dataset == self.name]
        documents = sorted({ranks[r][i].document for r, i in mine})
        batch = dataset.get_batch(np.asarray(documents, dtype=np.int64))
        names = [n for n in dataset.schema.names if n not in _NOT_FIELDS]
        rows = {doc: {n: _plain(batch[n][j]) for n in names} for j, doc in enumerate(documents)}
        source = dataset.metadata.get("source")
        kind = source.get("kind") if isinstance(source, dict) else None
        for r, i in mine:
            fields = rows[ranks[r][i].document]
            where = None
            if kind is not None and "source_file" in fields and "source_line" in fields:
                where = origin(str(fields["source_file"]), int(fields["source_line"]), kind)
            ranks[r][i] = dataclasses.replace(ranks[r][i], fields=fields, origin=where)


def _plain(value: Any) -> Any:
    """A field as a plain Python value (a 0-d tensor of an int64 column as an int)."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def _documents(view: Any) -> np.ndarray:
    counts = np.asarray(view.source.shard_docs, dtype=np.int64)
    if (counts >= 0).all():
        return counts
    return np.asarray([len(view.source.map(i)[2]) - 1 for i in range(len(view.shards))], dtype=np.int64)
