"""Slow, pure-Python references for token sequences: what chute.tokens must deliver, element by element."""

from __future__ import annotations

IGNORE = -100


def concat_window(stream: list[int], i: int, seq_len: int) -> tuple[list[int], list[int]]:
    """``pack="concat"``: window ``i`` as (input_ids, labels)."""
    window = stream[i * seq_len : i * seq_len + seq_len + 1]
    assert len(window) == seq_len + 1
    return window[:-1], window[1:]


def num_windows(total: int, seq_len: int) -> int:
    return max(0, (total - 1) // seq_len) if total > seq_len else 0


def pack_documents(docs: list[list[int]], seq_len: int) -> list[list[list[int]]]:
    """Next-fit packing of one shard's documents: a list of sequences, each a list of pieces (token lists)."""
    sequences: list[list[list[int]]] = []
    current: list[list[int]] = []
    fill = 0
    for doc in docs:
        if not doc:
            continue
        if len(doc) <= seq_len - fill:
            current.append(doc)
            fill += len(doc)
            continue
        if fill:
            sequences.append(current)
        while len(doc) > seq_len:
            sequences.append([doc[:seq_len]])
            doc = doc[seq_len:]
        current, fill = [doc], len(doc)
    if fill:
        sequences.append(current)
    return sequences


def packed_row(pieces: list[list[int]], seq_len: int, pad_id: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """One packed sequence: input_ids, labels, position_ids, and its segment ends (pieces, then padding)."""
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    ends: list[int] = []
    for piece in pieces:
        ids += piece
        labels += piece[1:] + [IGNORE]
        positions += list(range(len(piece)))
        ends.append(len(ids))
    if len(ids) < seq_len:
        pad = seq_len - len(ids)
        ids += [pad_id] * pad
        labels += [IGNORE] * pad
        positions += list(range(pad))
        ends.append(seq_len)
    return ids, labels, positions, ends


def packed_batch(rows: list[list[list[int]]], seq_len: int, pad_id: int) -> dict[str, list]:
    """A batch of packed sequences (each a list of pieces), flash-attention's cu_seqlens over the flattened batch."""
    out: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "cu_seqlens": [0]}
    for b, pieces in enumerate(rows):
        ids, labels, positions, ends = packed_row(pieces, seq_len, pad_id)
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["position_ids"].append(positions)
        out["cu_seqlens"] += [b * seq_len + e for e in ends]
    return out
