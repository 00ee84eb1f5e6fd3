//! The C API on a GPU, called as a C program calls it (the extern functions), on buffers and
//! streams the test owns: the exchange of `examples/capi-cpp` against the CPU reference, its
//! per-step cost beside the same exchange through the Rust API on the same buffers and streams, and
//! the errors only a GPU can show (host memory passed as `x`, buffers too short). Without a GPU
//! each test says it skipped.

use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{CallerBuffers, LocalRanks, RankHalo, Transport, reference};
use halo::gpu::{CudaStream, DeviceBuffer, DeviceMemory};
use halo::testing::gpu_or_skip;
use halo_capi::exchange::{CUstream, halo_exchange, halo_exchange_coordinates, halo_exchange_destroy, halo_exchange_finish, halo_exchange_forces};
use halo_capi::exchange::{halo_check_device, halo_exchange_set_transport, halo_local_create};
use halo_capi::plan::{halo_plan, halo_plan_destroy};
use halo_capi::status::halo_status;
use kernels_gpu::abi::Float3;
use std::io::Write;
use std::ptr::null_mut;
use std::sync::Arc;

mod ab;
mod common;
mod example;
use common::{last_error, ok};

/// Each rank's plan through the C API.
fn plans_of(halos: &[RankHalo]) -> Vec<*mut halo_plan> {
    halos.iter().map(example::c_plan).collect()
}

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|f| [f.x.to_bits(), f.y.to_bits(), f.z.to_bits()]).collect()
}

/// The C++ example's halo at the C API's cost target: 45,000 atoms, 2 ranks in one process.
const ATOMS: usize = 45_000;

/// The port builds the halo the example built on an H200: the received counts it printed there
/// (`capi-cpp: PASS: ... 400 home atoms (86 + 74 received)`, and 9154 + 9012 at 45,000), and a
/// plan the library accepts.
#[test]
fn the_port_has_the_examples_halo() {
    for (atoms, want) in [(400, [86, 74]), (ATOMS, [9154, 9012])] {
        let (halos, home) = example::halos(atoms);
        let got: Vec<usize> = halos.iter().map(|h| h.pulses.iter().map(|p| p.recv_size).sum()).collect();
        assert_eq!(got, want, "received atoms per rank at {atoms} atoms");
        assert_eq!(home.iter().map(Vec::len).sum::<usize>(), atoms);
        halo::exchange::spec::validate(&halos).unwrap();
    }
}

#[test]
fn the_c_api_matches_the_reference_and_costs_what_the_rust_api_costs() {
    let test = "the_c_api_matches_the_reference_and_costs_what_the_rust_api_costs";
    let Some(g) = gpu_or_skip(test) else { return };
    let (halos, home) = example::halos(ATOMS);
    let forces = synthetic::random_values(&halos, 6, false);
    let padded = |h: &RankHalo, v: &[Float3]| {
        let mut all = v.to_vec();
        all.resize(h.total_atoms, Float3::new(f32::NAN, f32::NAN, f32::NAN));
        all
    };
    let x: Vec<DeviceBuffer<Float3>> = halos.iter().zip(&home).map(|(h, v)| DeviceBuffer::from_host(&g.ctx, &padded(h, v)).unwrap()).collect();
    let f: Vec<DeviceBuffer<Float3>> = forces.iter().map(|v| DeviceBuffer::from_host(&g.ctx, v).unwrap()).collect();
    let streams: Vec<Arc<CudaStream>> = (0..2).map(|_| g.ctx.new_stream().unwrap()).collect();
    let raw: Vec<CUstream> = streams.iter().map(|s| s.cu_stream()).collect();

    // The C API: create, one checked step on the test's streams.
    let plans = plans_of(&halos);
    let plan_ptrs: Vec<*const halo_plan> = plans.iter().map(|&p| p as *const halo_plan).collect();
    let xs: Vec<*mut f32> = x.iter().map(|b| b.device_ptr() as *mut f32).collect();
    let fs: Vec<*mut f32> = f.iter().map(|b| b.device_ptr() as *mut f32).collect();
    let lens: Vec<usize> = halos.iter().map(|h| h.total_atoms).collect();
    let mut ex: *mut halo_exchange = null_mut();
    ok(halo_check_device(0), "halo_check_device");
    // SAFETY: two of everything; device buffers of GPU 0 that outlive the exchange; live streams.
    unsafe {
        ok(halo_local_create(0, plan_ptrs.as_ptr(), 2, xs.as_ptr(), fs.as_ptr(), lens.as_ptr(), &mut ex), "halo_local_create");
        for p in plans {
            halo_plan_destroy(p);
        }
        ok(halo_exchange_set_transport(ex, c"fused".as_ptr()), "halo_exchange_set_transport");
        ab::c_step(ex, &raw);
    }
    let want_x = reference::coordinates(&halos, &home);
    let want_f = reference::forces(&halos, &forces);
    for r in 0..2 {
        assert_eq!(bits(&x[r].to_host().unwrap()), bits(&want_x[r]), "rank {r}'s coordinates through the C API");
        for (i, (a, b)) in f[r].to_host().unwrap().iter().zip(&want_f[r]).enumerate() {
            for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
                assert!((u - v).abs() <= 1e-5 * v.abs().max(1.0), "rank {r} force {i} through the C API: {u} vs {v}");
            }
        }
    }

    // The same steps timed through both APIs on the same buffers and streams, in alternating
    // blocks (which API goes first alternates too), so that drift of the machine over the run
    // (clocks, other tenants) falls on both alike.
    let buffers = (0..2)
        // SAFETY: the test's device buffers, alive until the end of the test.
        .map(|r| unsafe { CallerBuffers::from_raw(&g.ctx, x[r].device_ptr(), f[r].device_ptr(), x[r].len()).unwrap() })
        .collect();
    let mut rust = LocalRanks::<Float3>::with_buffers(halos.clone(), std::slice::from_ref(&g.module), buffers).unwrap();
    rust.use_streams(&streams).unwrap();
    // SAFETY: as above.
    let mut c_step = || unsafe { ab::c_step(ex, &raw) };
    let mut rust_step = || {
        rust.exchange_forward(Transport::Fused).unwrap();
        rust.exchange_reverse_accumulate(Transport::Fused).unwrap();
        rust.finish().unwrap();
    };
    let (c_times, rust_times) = ab::alternating_blocks(&mut c_step, &mut rust_step);
    let steps = ab::BLOCKS * ab::PER_BLOCK;
    drop(rust);
    // SAFETY: made above, not destroyed before.
    ok(unsafe { halo_exchange_destroy(ex) }, "halo_exchange_destroy");
    let (c, r) = (ab::median(c_times), ab::median(rust_times));
    // Straight to the stderr handle: the harness hides the output of passing tests, and this line
    // is the measurement the suites' logs must keep.
    let _ = writeln!(
        std::io::stderr().lock(),
        "{test}: the halo of examples/capi-cpp, {ATOMS} atoms, 2 ranks in one process, fused, {steps} steps: per step (coordinates + forces + finish) C API median {c:.2} us, \
         Rust API median {r:.2} us, C/Rust {:.3}",
        c / r
    );
    // The target is C/Rust <= 1.05 (the printed ratio is the measurement); the test fails only
    // beyond 1.25, which a per-step cost the Rust API does not pay (a new event, a stream switch)
    // would break, so that a noisy machine does not fail it.
    assert!(c <= 1.25 * r, "{test}: the C API's step ({c:.2} us) costs more than 1.25x the Rust API's ({r:.2} us)");
}

#[test]
fn gpu_only_argument_errors_name_the_problem() {
    let test = "gpu_only_argument_errors_name_the_problem";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 300, send_fraction: 0.3, box_len: 5.0 }, 3);
    let plans = plans_of(&halos);
    let plan_ptrs: Vec<*const halo_plan> = plans.iter().map(|&p| p as *const halo_plan).collect();
    let x: Vec<DeviceBuffer<Float3>> = halos.iter().map(|h| DeviceBuffer::zeroed(&g.ctx, h.total_atoms).unwrap()).collect();
    let f: Vec<DeviceBuffer<Float3>> = halos.iter().map(|h| DeviceBuffer::zeroed(&g.ctx, h.total_atoms).unwrap()).collect();
    let mut xs: Vec<*mut f32> = x.iter().map(|b| b.device_ptr() as *mut f32).collect();
    let fs: Vec<*mut f32> = f.iter().map(|b| b.device_ptr() as *mut f32).collect();
    let lens: Vec<usize> = halos.iter().map(|h| h.total_atoms).collect();
    let mut ex: *mut halo_exchange = null_mut();
    // SAFETY: two of everything; the pointers are what each case says.
    unsafe {
        // Host memory where a device pointer belongs.
        let mut host = vec![0f32; 3 * halos[1].total_atoms];
        xs[1] = host.as_mut_ptr();
        assert_eq!(halo_local_create(0, plan_ptrs.as_ptr(), 2, xs.as_ptr(), fs.as_ptr(), lens.as_ptr(), &mut ex), halo_status::HALO_INVALID_ARGUMENT);
        assert!(ex.is_null());
        let msg = last_error();
        assert!(
            msg.starts_with("halo_local_create: rank 1's x: ")
                && (msg.contains("not memory the CUDA driver knows") || msg.contains("not device memory")),
            "{msg}"
        );
        xs[1] = x[1].device_ptr() as *mut f32;
        // Buffers shorter than the plan.
        let short = [lens[0], lens[1] - 1];
        assert_ne!(halo_local_create(0, plan_ptrs.as_ptr(), 2, xs.as_ptr(), fs.as_ptr(), short.as_ptr(), &mut ex), halo_status::HALO_OK);
        assert!(last_error().contains("rank 1"), "{}", last_error());
        // A good exchange refuses an unknown transport and a wrong number of streams.
        ok(halo_local_create(0, plan_ptrs.as_ptr(), 2, xs.as_ptr(), fs.as_ptr(), lens.as_ptr(), &mut ex), "halo_local_create");
        assert_eq!(halo_exchange_set_transport(ex, c"carrier-pigeon".as_ptr()), halo_status::HALO_INVALID_ARGUMENT);
        assert!(last_error().contains("unknown transport `carrier-pigeon`"), "{}", last_error());
        let stream = g.ctx.new_stream().unwrap();
        let one = [stream.cu_stream()];
        assert_eq!(halo_exchange_coordinates(ex, one.as_ptr(), 1), halo_status::HALO_INVALID_ARGUMENT);
        assert!(last_error().contains("drives 2 rank(s)"), "{}", last_error());
        let with_null = [stream.cu_stream(), std::ptr::null_mut()];
        assert_eq!(halo_exchange_forces(ex, with_null.as_ptr(), 2), halo_status::HALO_INVALID_ARGUMENT);
        assert!(last_error().contains("streams[1] is null"), "{}", last_error());
        // The exchange's own streams still work after the refusals.
        ok(halo_exchange_coordinates(ex, std::ptr::null(), 0), "halo_exchange_coordinates");
        ok(halo_exchange_finish(ex), "halo_exchange_finish");
        ok(halo_exchange_destroy(ex), "halo_exchange_destroy");
        for p in plans {
            halo_plan_destroy(p);
        }
    }
}
