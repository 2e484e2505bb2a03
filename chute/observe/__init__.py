"""Measurement: counters, the stall report, the hang watchdog, the autotuner."""

from chute.observe.autotune import Decision
from chute.observe.consumer import Observed, observe
from chute.observe.counters import Counters
from chute.observe.report import Report, StageReport

__all__ = ["Counters", "Decision", "Observed", "Report", "StageReport", "observe"]
