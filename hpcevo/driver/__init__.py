"""The collective driver: everything that runs a config on the ranks of a job.

    build.py        config (and objects held in Python) -> problem, algorithm, recorder
    arguments.py    the collective API's arguments: checked on every rank, agreed on
    engine.py       what runs generations: DeviceEngine (jitted chunks), the Engine protocol
    host_engine.py  HostEngine: NumPy functions and external commands, evaluated on the host
    islands.py      IslandsEngine: this rank's islands in one jitted call, migration inside it
    recording.py    what a run keeps besides the algorithm's state (best so far, or the front)
    loop.py         Loop: one population on the ranks (the step-level API that ``execute`` drives)
    batch.py        Batch: many Loops of one program advanced together, each bitwise alone
    archipelago.py  Archipelago: islands on the ranks, with Loop's interface
    execute.py      execute(): the run loop, and the named pieces it calls (RunOptions, Held)
    policy.py       the schedule of boundaries, when a checkpoint is due
    stopping.py     signals and deadlines, agreed by every rank
    resume.py       which checkpoint a run continues from, and what may change (FREE)
    resources.py    what fits in memory
    rundir.py       the run directory's files, written and read (never through a link)
    report.py       rank 0's progress lines
    result.py       Result (what hpcevo.run returns), RunRecord (hpcevo.open_run)
    startup.py      where start-up time goes
"""
