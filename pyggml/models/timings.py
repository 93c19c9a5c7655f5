"""One stage of a model's run timed: its seconds and the items it handled (tokens, windows, decoder steps), as
llama.cpp's perf counters (t_p_eval / n_p_eval, t_eval / n_eval) and whisper.cpp's whisper_timings count them.
The language model's and Whisper's timings are made of these stages."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stage:
    seconds: float = 0.0
    count: int = 0

    def add(self, seconds: float, count: int = 0) -> None:
        self.seconds += seconds
        self.count += count

    @property
    def per_second(self) -> float:
        """Items per second (0.0 before any time was spent)."""
        return self.count / self.seconds if self.seconds else 0.0
