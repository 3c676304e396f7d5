"""Groups of ranks from Python: two algorithms side by side in one job, their leaders swapping
what they found point to point.

    python examples/api_groups.py                  # one group (no one to swap with)
    mpiexec -n 2 python examples/api_groups.py     # CSO on rank 0, DE on rank 1
    mpiexec -n 4 python examples/api_groups.py     # each on a group of 2 ranks

``hpcevo.parallel.split`` gives every rank its group's context (``groups.ctx``: what ``Loop``,
``hpcevo.run`` and ``Archipelago`` take), so each group's run is the run alone on that many
ranks. Leaders (``groups.is_leader``) talk to other groups with ``send`` and ``recv``;
``bcast`` shares what the leader received with the rest of its group.
"""

from __future__ import annotations

import argparse

import hpcevo
from hpcevo.algorithms import CSO, DE
from hpcevo.problems import make_problem


def main(argv=None) -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=100)
    args.add_argument("--out", help="(unused: these loops write nothing)")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    groups = hpcevo.parallel.split(ctx, ranks_per_group=max(1, ctx.size // 2))
    line = digest = None
    if groups.ctx is not None:  # (a rank left over, at an odd rank count, takes part in nothing)
        problem = make_problem("rastrigin", 10)
        cls = CSO if groups.index % 2 == 0 else DE
        algorithm = cls(pop_size=64, dim=10, lb=problem.lb, ub=problem.ub)
        loop = hpcevo.Loop(algorithm, problem, groups.ctx).init(seed=groups.index).advance(args.generations - 1)
        mine = (cls.__name__, loop.best_fitness)
        theirs = None
        if groups.count >= 2 and groups.is_leader and groups.index < 2:
            other = 1 - groups.index  # groups 0 and 1 swap; the order keeps both from waiting to receive
            if groups.index == 0:
                groups.send(mine, to=other)
                theirs = groups.recv(source=other)
            else:
                theirs = groups.recv(source=other)
                groups.send(mine, to=other)
        theirs = groups.bcast(theirs)  # every rank of the group holds the other group's result
        if groups.is_leader:
            line = f"group {groups.index} ({groups.ctx.size} rank(s)): {mine[0]} best {mine[1]:.6e}"
            if theirs is not None:
                line += f"; group {1 - groups.index} sent: {theirs[0]} best {theirs[1]:.6e}"
        digest = loop.digest()
    lines = hpcevo.parallel.gather_to_root(ctx, line)  # (collective over the whole job)
    if ctx.is_root:
        print("\n".join(x for x in lines if x), flush=True)
        # group 0 is CSO from seed 0 on its own ranks, at any rank count: the same digest alone and in groups
        print(f"digest {digest}", flush=True)


if __name__ == "__main__":
    main()
