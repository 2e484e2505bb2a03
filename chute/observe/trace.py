"""Chrome trace-event files of a loader's last batches (open in https://ui.perfetto.dev or chrome://tracing).

The counters keep a bounded ring of spans (``Counters.trace``): one per stage
per batch (``order``, ``read``, ``transform``, ``device``, ``fetch``) in the
thread that did the work, and the training loop's ``wait`` and ``compute``
in its own thread. :func:`write_trace` turns the ring into the JSON object
format of the trace-event spec: complete events (``"ph": "X"``) with
microsecond ``ts``/``dur``, one track per thread, named by metadata events.
"""

from __future__ import annotations

import json
import os
from typing import Any

from chute.observe.counters import Counters

#: Pseudo thread id of the spans worker processes report (workers="processes").
WORKER_PROCESSES_TID = 1


def trace_events(counters: Counters, batches: int | None = None) -> list[dict[str, Any]]:
    """The trace events of the spans in the ring (of the last ``batches`` steps if given)."""
    spans = counters.trace_events()
    if batches is not None:
        steps = sorted({s[4] for s in spans if s[4] is not None})
        keep = set(steps[-batches:]) if batches > 0 else set()
        spans = [s for s in spans if s[4] is None or s[4] in keep]
    pid = os.getpid()
    origin = counters.created_ns
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"chute loader (pid {pid})"}}
    ]
    names = dict(counters.thread_names)
    names.setdefault(WORKER_PROCESSES_TID, "worker processes")
    seen: set[int] = set()
    for name, tid, start_ns, dur_ns, step, items in spans:
        if tid not in seen:
            seen.add(tid)
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": names.get(tid, f"thread {tid}")}})
        args: dict[str, Any] = {}
        if step is not None:
            args["step"] = step
        if items:
            args["items"] = items
        events.append({
            "name": name, "cat": "chute", "ph": "X", "pid": pid, "tid": tid,
            "ts": (start_ns - origin) / 1000.0, "dur": max(dur_ns, 0) / 1000.0, "args": args,
        })
    return events


def write_trace(counters: Counters, path: str | os.PathLike, batches: int | None = None) -> str:
    """Write the trace of the last ``batches`` steps (all in the ring by default) to ``path``; return it.

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    path = os.fspath(path)
    doc = {"traceEvents": trace_events(counters, batches), "displayTimeUnit": "ms"}
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    return path
