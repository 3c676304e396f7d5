#!/usr/bin/env python3
"""A stand-in for an external simulator, to try hpcevo's command protocol.

    simulator.py INPUT OUTPUT

Reads a candidate (one number per line) from INPUT, "simulates" for a while (the time grows
with the first coordinate's distance from the box centre, up to 10x), and writes the fitness
(the sphere function of the candidate, shifted) to OUTPUT. It fails now and then, as simulators
do: a candidate whose first coordinate is within 0.1 of the box edge "diverges" (exit status 1
with a message on stderr), which hpcevo penalises, counts and logs without stopping.
"""

import sys
import time

LB, UB = -5.0, 5.0

x = [float(line) for line in open(sys.argv[1]) if line.strip()]
edge = min(x[0] - LB, UB - x[0])
time.sleep(0.002 * (1 + 9 * abs(x[0]) / UB))
if edge < 0.1:
    print(f"solver diverged at x0 = {x[0]:.3f}", file=sys.stderr)
    sys.exit(1)
with open(sys.argv[2], "w") as out:
    out.write(f"{sum((v - 1.0) ** 2 for v in x)!r}\n")
