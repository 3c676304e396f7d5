"""Rank 0's voice: a progress bar on a terminal, plain lines in a batch job, nothing if quiet."""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO


class Signals:
    """Plain notes on what the numbers of a single-objective run mean: the population has
    collapsed (every candidate of a generation has the same fitness: spread 0), or the best has
    not moved for a long stretch. Each is said once per episode, at the boundary it is seen."""

    def __init__(self, generations: int):
        self.generations = generations
        self.best: float | None = None
        self.since = 0  # the generation the best last improved
        self.collapsed = self.stalled = False

    def notes(self, rec: dict[str, Any]) -> list[str]:
        if "gen_std" not in rec:
            return []
        gen, best, out = rec["generation"], rec["best"], []
        if self.best is None or best < self.best:
            self.best, self.since, self.stalled = best, gen, False
        spread0 = rec["gen_std"] == 0 and math.isfinite(rec["gen_best"])
        if spread0 and not self.collapsed:
            out.append(f"note: the population has collapsed at generation {gen}: every candidate has the same "
                       f"fitness ({rec['gen_best']:.6e}, spread 0); the search has stopped exploring "
                       "(try a larger pop_size, another seed, or an algorithm that keeps diversity)")
        self.collapsed = spread0
        stretch = gen - self.since
        if not self.stalled and stretch >= max(50, self.generations // 5):
            self.stalled = True
            out.append(f"note: the best ({best:.6e}) has not improved for {stretch} generations "
                       f"(since generation {self.since})")
        return out


class Reporter:
    """``on``: this process speaks (rank 0, not quiet); ``root``: it is rank 0 (warnings are
    printed even when quiet). ``progress``: "auto" (a bar on a terminal), "bar" or "lines"."""

    def __init__(self, on: bool, root: bool, progress: str, generations: int, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.root, self.on = root, on and root
        use_bar = progress == "bar" or (progress == "auto" and self.stream.isatty())
        self.bar = None
        self.signals = Signals(generations)
        if self.on and use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=generations, unit="gen", file=self.stream, dynamic_ncols=True)

    def line(self, text: str, *, err: bool = False, progress: bool = False) -> None:
        """A message from rank 0. ``err``: a warning, to stderr even with --quiet. ``progress``:
        routine news, shown as plain lines in batch logs but not under a progress bar."""
        if err:
            if self.root:
                print(text, file=sys.stderr, flush=True)
            return
        if not self.on or (progress and self.bar is not None):
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def boundary(self, rec: dict[str, Any], progress: str) -> None:
        """``progress``: the recorder's account of the run so far ("best ... mean ...")."""
        if not self.on:
            return
        text = f"gen {rec['generation']:>7}  {progress}  evals/s {rec['evals_per_s']:.3e}"
        # Running totals since the start of the run, labelled so: not this interval's count.
        if rec["nonfinite"]:
            text += f"  non-finite so far {rec['nonfinite']}"
        if rec.get("failed_evaluations"):
            text += f"  failed so far {rec['failed_evaluations']}"
        if self.bar is not None:
            self.bar.update(rec["generation"] - self.bar.n)
            self.bar.set_postfix_str(progress.split("  ")[0], refresh=False)
        else:
            print(text, file=self.stream, flush=True)
        for note in self.signals.notes(rec):
            self.line(note)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
