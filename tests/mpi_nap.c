/* The test suite's ranks wait for a collective by napping instead of spinning (tests only).
 *
 * Why: the suite runs 2, 3 and 4 ranks (and jobs of up to 8) on a 2-core machine. MPICH 4.0.2's
 * blocking collectives spin in ch4's progress loop while they wait, with no setting that makes a
 * waiting rank yield (MPIR_CVAR_ENABLE_HEAVY_YIELD came in 4.1), so a rank waiting for the one
 * that still computes takes the core that rank needs. Preloaded into the ranks (LD_PRELOAD, set by
 * CMakeLists.txt for the pytest passes, the jobs their tests start and the launcher's jobs), the
 * blocking calls below become their non-blocking twin and a wait that tests for 50 us, then naps
 * 10-200 us between tests.
 *
 * What it does not change: the data. The same MPI library moves the same bytes; the only
 * reductions hpcevo makes over MPI are MAX of integers (exact in any order); the fitness
 * exchange is an Allgather. Production runs (one rank per core or GPU) keep MPI's own waiting.
 *
 * It names no MPI library: the MPI entry points are looked up when first called, so a process
 * that never calls MPI (mpiexec itself, a shell, pip) carries it and is unaffected. mpi4py 4 calls
 * the large-count (_c) variants, mpi4jax the plain ones: both are here. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The MPI library's own entry point. Python loads libmpi through extension modules, possibly
 * with RTLD_LOCAL, where RTLD_NEXT does not look; ask the library by name then. */
static void *pmpi(const char *name) {
    void *f = dlsym(RTLD_DEFAULT, name);
    static const char *libs[] = {"libmpi.so.12", "libmpich.so.12", "libmpi.so.40", "libmpi.so", 0};
    for (int i = 0; !f && libs[i]; i++) {
        void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h) f = dlsym(h, name);
    }
    if (!f) {
        fprintf(stderr, "mpi_nap: the MPI library has no %s\n", name);
        abort();
    }
    return f;
}

typedef int (*test_fn)(MPI_Request *, int *, MPI_Status *);

static long since_ns(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - t0->tv_sec) * 1000000000L + (now.tv_nsec - t0->tv_nsec);
}

/* Complete one request: test for 50 us (a collective between ranks that all run finishes in
 * that), then nap between tests, 10 us doubling to 200 us (the latency a late rank adds). */
static int nap_wait(MPI_Request *req, MPI_Status *status) {
    static test_fn test = 0;
    if (!test) test = (test_fn)pmpi("PMPI_Test");
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long nap_ns = 10000;
    for (;;) {
        int done = 0;
        int rc = test(req, &done, status);
        if (rc != MPI_SUCCESS || done) return rc;
        if (since_ns(&t0) < 50000) continue;
        struct timespec nap = {0, nap_ns};
        nanosleep(&nap, 0);
        if (nap_ns < 200000) nap_ns *= 2;
    }
}

#define REAL(name) \
    static name##_t real = 0; \
    if (!real) real = (name##_t)pmpi("P" #name)
#define THEN_WAIT(call) \
    MPI_Request q; \
    int e = (call); \
    return e != MPI_SUCCESS ? e : nap_wait(&q, MPI_STATUS_IGNORE)

typedef int (*MPI_Iallgather_t)(const void *, int, MPI_Datatype, void *, int, MPI_Datatype, MPI_Comm,
                                MPI_Request *);
int MPI_Allgather(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt, MPI_Comm c) {
    REAL(MPI_Iallgather);
    THEN_WAIT(real(s, sc, st, r, rc, rt, c, &q));
}
typedef int (*MPI_Iallgather_c_t)(const void *, MPI_Count, MPI_Datatype, void *, MPI_Count, MPI_Datatype,
                                  MPI_Comm, MPI_Request *);
int MPI_Allgather_c(const void *s, MPI_Count sc, MPI_Datatype st, void *r, MPI_Count rc, MPI_Datatype rt,
                    MPI_Comm c) {
    REAL(MPI_Iallgather_c);
    THEN_WAIT(real(s, sc, st, r, rc, rt, c, &q));
}
typedef int (*MPI_Iallgatherv_t)(const void *, int, MPI_Datatype, void *, const int *, const int *,
                                 MPI_Datatype, MPI_Comm, MPI_Request *);
int MPI_Allgatherv(const void *s, int sc, MPI_Datatype st, void *r, const int *rc, const int *d,
                   MPI_Datatype rt, MPI_Comm c) {
    REAL(MPI_Iallgatherv);
    THEN_WAIT(real(s, sc, st, r, rc, d, rt, c, &q));
}
typedef int (*MPI_Iallgatherv_c_t)(const void *, MPI_Count, MPI_Datatype, void *, const MPI_Count *,
                                   const MPI_Aint *, MPI_Datatype, MPI_Comm, MPI_Request *);
int MPI_Allgatherv_c(const void *s, MPI_Count sc, MPI_Datatype st, void *r, const MPI_Count *rc,
                     const MPI_Aint *d, MPI_Datatype rt, MPI_Comm c) {
    REAL(MPI_Iallgatherv_c);
    THEN_WAIT(real(s, sc, st, r, rc, d, rt, c, &q));
}
typedef int (*MPI_Iallreduce_t)(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Request *);
int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
    REAL(MPI_Iallreduce);
    THEN_WAIT(real(s, r, n, t, o, c, &q));
}
typedef int (*MPI_Iallreduce_c_t)(const void *, void *, MPI_Count, MPI_Datatype, MPI_Op, MPI_Comm,
                                  MPI_Request *);
int MPI_Allreduce_c(const void *s, void *r, MPI_Count n, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
    REAL(MPI_Iallreduce_c);
    THEN_WAIT(real(s, r, n, t, o, c, &q));
}
typedef int (*MPI_Ibcast_t)(void *, int, MPI_Datatype, int, MPI_Comm, MPI_Request *);
int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c) {
    REAL(MPI_Ibcast);
    THEN_WAIT(real(b, n, t, root, c, &q));
}
typedef int (*MPI_Ibcast_c_t)(void *, MPI_Count, MPI_Datatype, int, MPI_Comm, MPI_Request *);
int MPI_Bcast_c(void *b, MPI_Count n, MPI_Datatype t, int root, MPI_Comm c) {
    REAL(MPI_Ibcast_c);
    THEN_WAIT(real(b, n, t, root, c, &q));
}
typedef int (*MPI_Ibarrier_t)(MPI_Comm, MPI_Request *);
int MPI_Barrier(MPI_Comm c) {
    REAL(MPI_Ibarrier);
    THEN_WAIT(real(c, &q));
}
int MPI_Wait(MPI_Request *q, MPI_Status *s) { return nap_wait(q, s); }
