/* The C API's call order in plain C (docs/library.md shows it; `cargo xtask test` compiles and
 * links it with gcc -std=c11 -pedantic against the installed package). Two ranks in one process
 * each send atoms 0 and 3 to the other, received after their four home atoms. */
#include <halo.h>

#include <stdio.h>

/* Prints the failed call, its code and halo's message; returns 1. */
static int report(const char *call, halo_status status) {
    char message[1024];
    halo_last_error(message, sizeof message);
    fprintf(stderr, "%s failed with %s: %s\n", call, halo_status_name(status), message);
    return 1;
}

#define TRY(call)                                   \
    do {                                            \
        halo_status status_ = (call);               \
        if (status_ != HALO_OK) return report(#call, status_); \
    } while (0)

/* Rank r's plan: 4 home atoms, 6 in all; one pulse to and from the other rank. */
static int make_plan(int r, halo_plan **plan) {
    static const int32_t sent[2] = {0, 3};
    halo_pulse_desc pulse = {0};
    pulse.send_rank = 1 - r;
    pulse.recv_rank = 1 - r;
    pulse.index_map = sent;
    pulse.send_count = 2;
    pulse.recv_count = 2;
    pulse.atom_offset = 4;
    pulse.peer_atom_offset = 4;
    pulse.accumulate_forces = 1;
    TRY(halo_plan_create(4, 6, plan));
    TRY(halo_plan_add_pulse(*plan, &pulse));
    return 0;
}

/* The per-step calls: coordinates, the program's force kernels, forces; then one bounded wait. */
static int run_steps(halo_exchange *ex, CUstream streams[2], int steps) {
    for (int s = 0; s < steps; ++s) {
        TRY(halo_exchange_coordinates(ex, streams, 2)); /* enqueued on the streams, no host wait */
        /* ... the program's force kernels on the same streams ... */
        TRY(halo_exchange_forces(ex, streams, 2));
    }
    TRY(halo_exchange_finish(ex)); /* bounded wait: a lost peer is HALO_TIMEOUT, not a hang */
    return 0;
}

/* Runs `steps` halo steps on the caller's device buffers (x[r], f[r]: 6 atoms of 3 floats each,
 * from cudaMalloc on GPU 0) and streams (one per rank); the exchange is destroyed on every path. */
int halo_steps(const halo_plan *const plans[2], float *x[2], float *f[2], CUstream streams[2], int steps) {
    const size_t lens[2] = {6, 6};
    halo_exchange *ex = NULL;
    TRY(halo_local_create(0, plans, 2, x, f, lens, &ex));
    int failed = run_steps(ex, streams, steps);
    halo_status status = halo_exchange_destroy(ex);
    return failed || (status != HALO_OK && report("halo_exchange_destroy", status));
}

int main(void) {
    halo_plan *plans[2] = {NULL, NULL};
    int failed = make_plan(0, &plans[0]) || make_plan(1, &plans[1]);
    if (!failed) {
        const halo_plan *const checked[2] = {plans[0], plans[1]};
        halo_status status = halo_plan_validate(checked, 2);
        failed = status != HALO_OK ? report("halo_plan_validate", status) : 0;
    }
    if (!failed) {
        halo_status status = halo_check_device(0); /* HALO_NO_GPU on a machine without one */
        failed = status != HALO_OK ? report("halo_check_device", status) : 0;
    }
    halo_plan_destroy(plans[0]);
    halo_plan_destroy(plans[1]);
    return failed;
}
