"""The multi-backend scheduler (ggml_backend_sched)."""

from pyggml.sched.scheduler import Scheduler, Split

__all__ = ["Scheduler", "Split"]
