from .perf_suite import main

main()
