"""Studies: many runs in one job (seeds x algorithms x problems x settings), resumable as a
whole, reported with statistics.

``spec`` reads and expands a study file (pure); ``runner`` runs it on groups of ranks
(collective); ``journal`` says where each run stands and ``report`` turns the run directories
into tables and figures (one process, no MPI). From Python: ``hpcevo.load_study`` and
``hpcevo.study``; from the shell: ``hpcevo study [plan|run|status|report] FILE``.
"""
