import sys

if sys.argv[1:2] == ["gpu"]:  # python -m benchmarks gpu [...]: every GPU check, one command
    from .gpu import main as gpu_main

    sys.exit(gpu_main(sys.argv[2:]))
if sys.argv[1:2] == ["peers"]:  # python -m benchmarks peers [...]: hpcevo vs evosax, EvoX, pycma
    from .vs_peers import main as peers_main

    sys.exit(peers_main(sys.argv[2:]))

from .perf_suite import main

main()
