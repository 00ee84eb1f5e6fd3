//! What `KernelModule::launch` paid on every successful launch before it built its error text
//! lazily: formatting `launching {name} {shape:?}` (eager `during`) against not formatting it
//! (`during_with`), on the success path. A kernel launch itself costs a few microseconds, the MD
//! step makes several per step.
//!
//! `cargo bench -p halo --bench launch_context`. No GPU needed.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use cudarc::driver::DriverError;
use halo::error::CudaContextExt;
use halo::gpu::LaunchShape;

fn bench(c: &mut Criterion) {
    let shape = LaunchShape { grid: (1632, 1), block: 128, shared_bytes: 4832 };
    let name = "nbnxm_forces_pf";
    let ok = || -> Result<(), DriverError> { black_box(Ok(())) };
    c.bench_function("launch result: eager description (format! on success too)", |b| {
        b.iter(|| ok().during(format!("launching {} {:?}", black_box(name), black_box(shape))))
    });
    c.bench_function("launch result: lazy description (during_with)", |b| {
        b.iter(|| ok().during_with(|| format!("launching {} {:?}", black_box(name), black_box(shape))))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
