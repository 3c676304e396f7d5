"""Batch job scripts for Slurm and PBS Pro: render from a run config, check, submit (``render.py``;
the bash templates in ``templates/``). No MPI: this runs on login nodes."""

from .render import JobRequest, Plan, parse_time, plan, render, submit

__all__ = ["JobRequest", "Plan", "parse_time", "plan", "render", "submit"]
