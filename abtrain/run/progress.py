"""What rank 0 tells the person watching: a progress bar on a terminal, otherwise about
twenty log lines a run with the time per step and the time left."""

from __future__ import annotations

import sys
import time


def duration(seconds: float) -> str:
    """A span of time as people read it: 4 s, 3m05s, 2h07m (every progress line and ETA)."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, rank: int, steps: int) -> None:
        self.rank, self.steps = rank, steps
        self.tty = rank == 0 and sys.stderr.isatty()
        self.status = ""
        self._bar = None
        self._mark = (0, time.time())  # where the log line's speed counts from

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[abtrain] {msg}", flush=True)

    def warn(self, msg: str) -> None:
        print(f"[abtrain] warning: {msg}", file=sys.stderr, flush=True)

    def start(self, step: int) -> None:
        from tqdm import tqdm

        self._mark = (step, time.time())
        self._bar = tqdm(total=self.steps, initial=step, disable=not self.tty, unit="step")

    def step_done(self, step: int, status: str) -> None:
        """After step `step` (0-based): the bar moves; every twentieth of the run, a log line.
        Lines count steps done, 1-based as tqdm's bar and the evaluation lines do: the last
        says `step 156 of 156`."""
        self.status = status
        self._bar.set_postfix_str(status, refresh=False)
        self._bar.update(1)
        every = max(1, self.steps // 20)
        if not self.tty and (step % every == 0 or step == self.steps - 1):
            width = len(str(self.steps))
            done = f"{step + 1:>{width}} of {self.steps}"
            self.log(f"step {done} {status} | {self._speed(step)}")

    def close(self) -> None:
        self._bar.close()

    def _speed(self, step: int) -> str:
        """Seconds per step since the last log line, and the time left at that pace."""
        (step0, t0), now = self._mark, time.time()
        done = step + 1 - step0
        self._mark = (step + 1, now)
        per_step = (now - t0) / max(done, 1)
        left = per_step * (self.steps - step - 1)
        eta = f"{int(left) // 3600}:{int(left) % 3600 // 60:02d}:{int(left) % 60:02d}"
        return f"{per_step:.3f} s/step, ETA {eta}"
