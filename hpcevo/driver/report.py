"""Rank 0's voice: a progress bar on a terminal, plain lines in a batch job, nothing if quiet."""

from __future__ import annotations

import sys
from typing import Any, TextIO


class Reporter:
    """``on``: this process speaks (rank 0, not quiet); ``root``: it is rank 0 (warnings are
    printed even when quiet). ``progress``: "auto" (a bar on a terminal), "bar" or "lines"."""

    def __init__(self, on: bool, root: bool, progress: str, generations: int, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.root, self.on = root, on and root
        use_bar = progress == "bar" or (progress == "auto" and self.stream.isatty())
        self.bar = None
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
        if rec["nonfinite"]:
            text += f"  non-finite {rec['nonfinite']}"
        if rec.get("failed_evaluations"):
            text += f"  failed {rec['failed_evaluations']}"
        if self.bar is not None:
            self.bar.update(rec["generation"] - self.bar.n)
            self.bar.set_postfix_str(progress.split("  ")[0], refresh=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
