/*
 * halo.h: the C API of halo, GPU-initiated halo exchange (libhalo.so / libhalo.a).
 * Generated from host/capi by `cargo xtask capi-header`; do not edit.
 *
 * Call order: halo_plan_create + halo_plan_add_pulse per rank, halo_check_device,
 * halo_local_create (ranks in one process) or halo_pe_start + halo_pe_alloc + halo_pe_create
 * (one PE per process), then per step halo_exchange_coordinates and halo_exchange_forces on
 * your streams, halo_exchange_finish where the host reads results, halo_exchange_destroy.
 * Every call returns a halo_status; on failure halo_last_error gives the message.
 */

#ifndef HALO_H
#define HALO_H

#include <stddef.h>
#include <stdint.h>
/** A CUDA stream: the driver API's CUstream, the same type as the runtime's cudaStream_t. */
typedef struct CUstream_st *CUstream;

/**
 * What a halo call returns. `HALO_OK` (0) is success; on any other value
 * `halo_last_error` gives the message of the failure (what went wrong and how to fix it).
 */
typedef enum {
  /**
   * Success.
   */
  HALO_OK = 0,
  /**
   * An argument is invalid: a null pointer, a size that does not fit, a halo plan whose ranks
   * do not fit together, an unknown transport name.
   */
  HALO_INVALID_ARGUMENT = 1,
  /**
   * No usable GPU or CUDA driver on this machine.
   */
  HALO_NO_GPU = 2,
  /**
   * A CUDA driver call failed (the message names the call and the driver's error).
   */
  HALO_CUDA = 3,
  /**
   * NVSHMEM could not be loaded, started or used.
   */
  HALO_NVSHMEM = 4,
  /**
   * A device wait of the exchange expired: a peer never signalled (the message names the rank,
   * pulse and step).
   */
  HALO_TIMEOUT = 5,
  /**
   * A host wait on an exchange stream saw no progress for its whole budget: a kernel is stuck
   * where no device deadline reaches.
   */
  HALO_STUCK = 6,
  /**
   * halo's GPU kernels are missing, stale or built for another GPU architecture.
   */
  HALO_KERNELS = 7,
  /**
   * The router could not choose paths between the ranks.
   */
  HALO_ROUTE = 8,
  /**
   * A check of results against their reference failed.
   */
  HALO_VERIFICATION = 9,
  /**
   * Reading or writing a file failed.
   */
  HALO_IO = 10,
  /**
   * A bug in halo (a panic inside the library, caught at the boundary): please report the message.
   */
  HALO_INTERNAL = 11,
  /**
   * The operating system refused halo a resource it needs (a thread for a bounded call).
   */
  HALO_SYSTEM = 12,
} halo_status;

/**
 * An exchange between ranks: made by `halo_local_create` or `halo_pe_create`, freed by
 * `halo_exchange_destroy`. It reads and writes the caller's `x` and `f` and never frees them.
 */
typedef struct halo_exchange halo_exchange;

/**
 * This process as one NVSHMEM PE (one rank of a multi-process run): its GPU, NVSHMEM and the
 * kernels. Made by `halo_pe_start` (halo starts NVSHMEM) or `halo_pe_attach` (the application
 * did), freed by `halo_pe_destroy` after every exchange and allocation of it.
 */
typedef struct halo_pe halo_pe;

/**
 * One rank's halo plan: its home atoms, all its atoms, and its pulses in execution order. Made by
 * `halo_plan_create`, filled by `halo_plan_add_pulse`, freed by `halo_plan_destroy`; an exchange
 * copies what it needs, so a plan may be destroyed once the exchange is created.
 */
typedef struct halo_plan halo_plan;

/**
 * One pulse of one rank, as GROMACS's `GpuHaloExchange` holds it. Coordinates go to `send_rank`
 * and come from `recv_rank`; forces travel the other way.
 */
typedef struct {
  /**
   * The rank this pulse's coordinates are sent to (0 <= send_rank < number of ranks).
   */
  int32_t send_rank;
  /**
   * The rank this pulse's coordinates come from.
   */
  int32_t recv_rank;
  /**
   * Local indices of the atoms sent, `send_count` of them, each a home atom or an atom received
   * in an earlier pulse. May be null when `send_count` is 0. Copied by `halo_plan_add_pulse`.
   */
  const int32_t *index_map;
  /**
   * How many atoms this pulse sends (entries of `index_map`).
   */
  size_t send_count;
  /**
   * How many atoms this pulse receives.
   */
  size_t recv_count;
  /**
   * Where the received atoms start in this rank's arrays (at or after the home atoms).
   */
  size_t atom_offset;
  /**
   * Where the sent atoms start in `send_rank`'s arrays (that rank's `atom_offset` of this pulse).
   */
  size_t peer_atom_offset;
  /**
   * Nonzero when the sent coordinates are shifted by `shift` (the pulse crosses a periodic boundary).
   */
  int32_t has_shift;
  /**
   * The periodic shift (x, y, z) added to every sent coordinate when `has_shift` is nonzero.
   */
  float shift[3];
  /**
   * Nonzero: received forces are added to the mapped atoms' forces. Must be nonzero (a stored
   * force would race with the other pulses' additions).
   */
  int32_t accumulate_forces;
} halo_pulse_desc;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Copies the message of the last failed call on this thread into `buf` (at most `len` bytes,
 * always NUL-terminated; a longer message is cut at a character boundary). The message names the
 * call, what went wrong and how to fix it; it is empty when no call on this thread has failed. A
 * successful call does not clear it. Returns `HALO_INVALID_ARGUMENT` (leaving the message as it
 * is) when `buf` is null or `len` is 0, else `HALO_OK`. `halo_last_error_length() + 1` bytes hold
 * the whole message.
 *
 * # Safety
 * `buf` must be null or point to `len` writable bytes.
 */
halo_status halo_last_error(char *buf, size_t len);

/**
 * The length in bytes of the last failed call's message on this thread, without the terminating
 * NUL (0 when no call on this thread has failed). Never fails.
 */
size_t halo_last_error_length(void);

/**
 * Checks that GPU `device` can run halo: a CUDA driver, the GPU itself, and halo's kernels for
 * its architecture. Call it before allocating anything to learn early (`HALO_NO_GPU`,
 * `HALO_KERNELS`, `HALO_INVALID_ARGUMENT` for a GPU that does not exist). halo runs on the GPU's
 * primary context, the one the CUDA runtime uses.
 */
halo_status halo_check_device(int32_t device);

/**
 * Creates the exchange of `nranks` ranks that all run in this process on GPU `device`:
 * `plans[r]` is rank r's plan, `x[r]` and `f[r]` its coordinates and forces (device pointers
 * from `cudaMalloc`, 3 floats per atom, home atoms first, then each pulse's received atoms where
 * its plan says), `lens[r]` how many atoms `x[r]` and `f[r]` each hold (at least the plan's
 * `total_atoms`). halo never frees `x`/`f`; they must outlive the exchange. The plans are checked
 * to fit together (as `halo_plan_validate`) before the GPU is touched. The transport is `fused`.
 *
 * # Safety
 * `plans`, `x`, `f`, `lens` must be null or point to `nranks` elements; the plans live; the
 * buffers device memory of GPU `device` of the given lengths; `out` null or writable.
 */
halo_status halo_local_create(int32_t device, const halo_plan *const *plans, int32_t nranks, float *const *x, float *const *f, const size_t *lens, halo_exchange **out);

/**
 * Starts this process as one NVSHMEM PE of a multi-process run started by `halo launch -n N --exe PROGRAM`
 * (or mpirun/srun, whose environment says the rank): opens its GPU, initialises NVSHMEM and
 * loads the kernels. Collective: every PE calls it. Stores the PE in `*out`.
 *
 * # Safety
 * `out` must be null or writable.
 */
halo_status halo_pe_start(halo_pe **out);

/**
 * Attaches to the NVSHMEM that this process started itself (as GROMACS and other codes do) on
 * GPU `device`, the GPU that NVSHMEM runs on here: loads halo's kernels and registers them with
 * that NVSHMEM, without a second init. The PE's rank and the number of PEs are NVSHMEM's
 * (`halo_pe_info`). `halo_pe_destroy` then frees halo's allocations but never finalises NVSHMEM:
 * the application does, after destroying every halo object. `nvshmem_lib` names the NVSHMEM host
 * library the application loaded (a path), or null for NVSHMEM's soname. `HALO_INVALID_ARGUMENT`
 * when NVSHMEM is not initialised in this process. Stores the PE in `*out`.
 *
 * # Safety
 * `nvshmem_lib` null or a NUL-terminated string; `out` null or writable.
 */
halo_status halo_pe_attach(int32_t device, const char *nvshmem_lib, halo_pe **out);

/**
 * This PE's rank, the number of PEs, and its GPU ordinal (each output may be null).
 *
 * # Safety
 * `pe` null or live; the outputs null or writable.
 */
halo_status halo_pe_info(const halo_pe *pe, int32_t *rank, int32_t *nranks, int32_t *device);

/**
 * Allocates `atoms` atoms (3 floats each) on NVSHMEM's symmetric heap and stores the device
 * pointer in `*out`: what `halo_pe_create` needs for `x` and `f`. Collective: every PE makes the
 * same allocations in the same order (a null `out` is `HALO_INVALID_ARGUMENT` after the
 * allocation, which stays with the PE, so that the other PEs are not left waiting). Freed by
 * `halo_pe_free` or with the PE.
 *
 * # Safety
 * `pe` null or live; `out` null or writable.
 */
halo_status halo_pe_alloc(halo_pe *pe, size_t atoms, float **out);

/**
 * Frees an allocation of `halo_pe_alloc` (collective, in the same order on every PE). Null is allowed.
 *
 * # Safety
 * `pe` null or live; no exchange may still use `ptr`.
 */
halo_status halo_pe_free(halo_pe *pe, float *ptr);

/**
 * Creates this PE's exchange: `plan` is this PE's own plan (every PE's plans are gathered over
 * NVSHMEM and checked to fit together), `x` and `f` its coordinates and forces on the symmetric
 * heap (`halo_pe_alloc`, same order on every PE), `len` atoms each. Collective: every PE calls it,
 * and a refusal on any PE (buffers that do not qualify, a null `plan` or `out`) is returned by
 * every PE, naming the PE.
 *
 * # Safety
 * `pe` and `plan` null or live; `x`/`f` symmetric device memory of `len` atoms; `out` null or writable.
 */
halo_status halo_pe_create(const halo_pe *pe, const halo_plan *plan, float *x, float *f, size_t len, halo_exchange **out);

/**
 * Ends this PE: frees its remaining allocations and, for a PE of `halo_pe_start`, finalises
 * NVSHMEM (a PE of `halo_pe_attach` leaves the application's NVSHMEM running). Destroy its
 * exchanges first. Collective. Null is allowed.
 *
 * # Safety
 * `pe` null or a PE of `halo_pe_start` or `halo_pe_attach` not destroyed before.
 */
halo_status halo_pe_destroy(halo_pe *pe);

/**
 * Chooses how halos move from the next step on, by name: `fused` (the default), `fused-tma`,
 * `per-pulse`, `per-pulse-direct`, `staged`, `direct-copy`. `HALO_INVALID_ARGUMENT` for an
 * unknown name or one these ranks cannot run (the message says why).
 *
 * # Safety
 * `ex` null or live; `name` null or a NUL-terminated string.
 */
halo_status halo_exchange_set_transport(halo_exchange *ex, const char *name);

/**
 * Enqueues one step's coordinate halo on `streams` (`streams[i]` for local rank i: every rank
 * for `halo_local_create`, the one PE for `halo_pe_create`; n = that count): each rank's sent
 * atoms are packed (shifted where the pulse says) into its peers' received ranges. Returns once
 * enqueued: work after it on the same stream sees the halo; the host does not wait (see
 * `halo_exchange_finish`). Null `streams` with n = 0 keeps the streams in use (first the
 * exchange's own). The caller orders its own writes of `x` before this on the same stream.
 *
 * The streams must belong to the exchange's GPU (its primary context, the CUDA runtime's) and
 * should be non-blocking (`cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)`): work on the
 * legacy default stream, from any thread, waits for a blocking stream's halo kernels, which wait
 * for their peers. halo keeps using the streams after this call returns: `halo_exchange_finish`
 * and `halo_exchange_destroy` wait on them, so they must stay valid until the exchange is
 * destroyed or a later call passes others. `halo_exchange_finish` waits for everything on them,
 * the caller's own work after the halo included.
 *
 * # Safety
 * `ex` null or live; `streams` null or `n` streams of the exchange's GPU that stay valid until
 * `halo_exchange_destroy(ex)` or until a later call passes others.
 */
halo_status halo_exchange_coordinates(halo_exchange *ex, const CUstream *streams, int32_t n);

/**
 * Enqueues one step's force halo on `streams` (as `halo_exchange_coordinates`): the forces on
 * each rank's received atoms are added into their owners' atoms, last pulse first. The received
 * atoms' forces stay as they were; zero them before the next step's force computation.
 *
 * # Safety
 * As `halo_exchange_coordinates`.
 */
halo_status halo_exchange_forces(halo_exchange *ex, const CUstream *streams, int32_t n);

/**
 * Waits (bounded) until the enqueued halo work of every local rank has finished and reports how
 * it ended: `HALO_TIMEOUT` when a peer never signalled (the message names the rank, pulse and
 * step), `HALO_STUCK` when a stream made no progress, `HALO_CUDA` for a failed launch. Call it
 * where the host reads the results; a step needs no host wait otherwise.
 *
 * # Safety
 * `ex` null or live.
 */
halo_status halo_exchange_finish(halo_exchange *ex);

/**
 * Frees an exchange (its own protocol memory; never the caller's `x`/`f` or streams). Call it
 * after `halo_exchange_finish`. Null is allowed.
 *
 * # Safety
 * `ex` null or an exchange not destroyed before.
 */
halo_status halo_exchange_destroy(halo_exchange *ex);

/**
 * Creates an empty plan for a rank with `home_atoms` home atoms and `total_atoms` atoms in all
 * (home atoms plus every received atom), and stores it in `*out`.
 * Fails with `HALO_INVALID_ARGUMENT` when `out` is null or `home_atoms > total_atoms`.
 *
 * # Safety
 * `out` must be null or point to writable storage for a pointer.
 */
halo_status halo_plan_create(size_t home_atoms, size_t total_atoms, halo_plan **out);

/**
 * Appends a pulse (copied, index map included) to `plan`. Checks what one rank can check: ranks
 * not negative, `index_map` present when `send_count` > 0, every map entry within the plan's
 * atoms, the received range inside them and after the home atoms, forces accumulated. Whether the
 * ranks' plans fit together is checked by `halo_plan_validate` and when an exchange is created.
 *
 * # Safety
 * `plan` must be null or a live plan; `pulse` null or a valid `halo_pulse_desc` whose
 * `index_map` points to `send_count` readable `int32_t`s.
 */
halo_status halo_plan_add_pulse(halo_plan *plan, const halo_pulse_desc *pulse);

/**
 * Frees a plan made by `halo_plan_create`. Null is allowed (nothing happens).
 *
 * # Safety
 * `plan` must be null or a plan from `halo_plan_create` not freed before.
 */
halo_status halo_plan_destroy(halo_plan *plan);

/**
 * Checks that the plans of all `nranks` ranks (`plans[r]` is rank r's) fit together: equal pulse
 * counts, each pulse's sizes and offsets matching at both ends, received ranges disjoint, every
 * map entry a home atom or an atom received in an earlier pulse. Needs no GPU; the exchange
 * constructors run the same check. `HALO_INVALID_ARGUMENT` with the first mismatch named.
 *
 * # Safety
 * `plans` must be null or point to `nranks` pointers, each null or a live plan.
 */
halo_status halo_plan_validate(const halo_plan *const *plans, int32_t nranks);

/**
 * The name of a status code (`"HALO_NO_GPU"`), a static NUL-terminated string; `"HALO_UNKNOWN"`
 * for a value that is no `halo_status`. Never fails; does not touch the last error.
 */
const char *halo_status_name(int32_t status);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* HALO_H */
