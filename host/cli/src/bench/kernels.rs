//! `halo bench-kernels`: the gather and scatter kernels alone, at 1M `float3`
//! atoms through maps of 1M distinct indices into 4M atoms, sorted and random.
//!
//! Effective bandwidth counts the bytes each kernel must move at least:
//! pack `out[i] = x[map[i]]`: 4 (index) + 12 (read) + 12 (write) = 28 B per atom;
//! unpack-accumulate `dst[map[i]] += buf[i]`: 4 + 12 (read buf) + 12 (read dst) + 12 (write dst)
//! = 40 B per atom. Printed beside the device copy bandwidth (read + write), the ceiling.
//!
//! The kernels run on random coordinates, and before and after each kernel's timed launches one
//! launch on fresh random data is compared with the CPU reference ([`halo::reference`]): pack
//! bit for bit, unpack-accumulate bit for bit (the indices are distinct, so each entry is one
//! addition). A kernel that fails its check gives no times: the run ends with the mismatch.

use super::floor;
use super::stats::Summary;
use crate::error::{HaloError, Result};
use crate::gpu::{self, CudaStream, DeviceBuffer, DeviceMemory, KernelModule};
use crate::kernels::{IndexMap, pack_coords, unpack};
use halo::reference;
use kernels_gpu::abi::Float3;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::sync::Arc;

/// Bytes moved per atom by pack.
pub const PACK_BYTES_PER_ATOM: f64 = 28.0;
/// Bytes moved per atom by unpack-accumulate.
pub const UNPACK_BYTES_PER_ATOM: f64 = 40.0;

/// What to run.
#[derive(Clone, Debug)]
pub struct KernelBenchConfig {
    /// Entries in each map (atoms packed).
    pub map_len: usize,
    /// Atoms in the array the map indexes.
    pub array_len: usize,
    /// Timed launches (each timed alone).
    pub repeats: usize,
    /// GPU ordinal.
    pub device: usize,
    /// Seed of the random map.
    pub seed: u64,
}

/// One kernel and map order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelResult {
    /// `pack` or `unpack-accumulate`.
    pub kernel: String,
    /// `sorted` or `random`.
    pub map: String,
    /// Time per launch (µs).
    pub time_us: Summary,
    /// Effective bandwidth at the median (GB/s).
    pub effective_gbs: f64,
    /// The kernel's target for this map (µs).
    pub target_us: f64,
    /// The kernel matched the CPU reference on random data before and after its timed launches
    /// (a result is only made when it did: always true in a written report).
    pub checked: bool,
}

/// The version of the `halo bench-kernels --json` document: 2 since results carry `checked`.
pub const SCHEMA_VERSION: u32 = 2;

/// The whole kernel benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelReport {
    /// The document's version ([`SCHEMA_VERSION`]).
    #[serde(default)]
    pub schema_version: u32,
    /// The machine and software.
    pub machine: crate::machine::MachineInfo,
    /// The GPU.
    pub gpu: String,
    /// Map entries.
    pub map_len: usize,
    /// Array atoms.
    pub array_len: usize,
    /// Device copy bandwidth, read + write (GB/s).
    pub device_bw_gbs: Summary,
    /// Every kernel and map order.
    pub results: Vec<KernelResult>,
}

/// The gather and scatter kernels' targets (µs) at 1M atoms: (kernel, map) -> time.
pub fn target_us(kernel: &str, sorted: bool) -> f64 {
    match (kernel, sorted) {
        ("pack", true) => 22.0,
        ("pack", false) => 28.0,
        (_, true) => 48.0,
        (_, false) => 60.0,
    }
}

/// `len` distinct indices below `range`, in random order, and the same sorted.
pub fn maps(len: usize, range: usize, seed: u64) -> Result<(Vec<u32>, Vec<u32>)> {
    if len > range || range > u32::MAX as usize {
        return Err(HaloError::InvalidInput(format!("cannot draw {len} distinct indices below {range}")));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let random: Vec<u32> = rand::seq::index::sample(&mut rng, range, len).into_iter().map(|i| i as u32).collect();
    let mut sorted = random.clone();
    sorted.sort_unstable();
    Ok((sorted, random))
}

fn time_one(stream: &CudaStream, f: impl Fn() -> Result<()>, repeats: usize) -> Result<Summary> {
    for _ in 0..3 {
        f()?; // warm-up: caches, clocks, first-launch costs
    }
    let mut v = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        v.push(floor::time_on_stream(stream, &f)?);
    }
    Summary::of(&v).map(|s| s.scaled(1e6)).ok_or_else(|| HaloError::InvalidInput("no kernel timing".into()))
}

/// Random coordinates in [-5, 5), as the exchange tests use.
fn random_coords(len: usize, seed: u64) -> Vec<Float3> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| Float3::new(rng.random_range(-5.0..5.0), rng.random_range(-5.0..5.0), rng.random_range(-5.0..5.0))).collect()
}

/// The first entry where `got` and `want` differ in any bit, as a message naming `what`.
pub fn first_difference(what: &str, got: &[Float3], want: &[Float3]) -> std::result::Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values read back, the CPU reference has {}", got.len(), want.len()));
    }
    let bits = |v: &Float3| [v.x.to_bits(), v.y.to_bits(), v.z.to_bits()];
    match got.iter().zip(want).position(|(a, b)| bits(a) != bits(b)) {
        Some(i) => Err(format!("{what}: entry {i} is {:?}, the CPU reference says {:?}", got[i], want[i])),
        None => Ok(()),
    }
}

/// One launch of `kernel` (`pack` or `unpack-accumulate`) on fresh random data from `seed`,
/// compared with the CPU reference; `x` and `buf` hold that data afterwards.
fn check_kernel(
    module: &KernelModule,
    stream: &CudaStream,
    kernel: &str,
    map: &IndexMap,
    host_map: &[u32],
    (x, buf): (&DeviceBuffer<Float3>, &DeviceBuffer<Float3>),
    seed: u64,
) -> Result<std::result::Result<(), String>> {
    let xs = random_coords(x.len(), seed);
    x.copy_from_host(&xs)?;
    let wait = |what: &str| stream.synchronize().map_err(|source| HaloError::Cuda { what: what.into(), source });
    if kernel == "pack" {
        buf.fill_bytes(0xFF)?;
        pack_coords(module, stream, x, map, buf, None)?;
        wait("the checked pack")?;
        return Ok(first_difference("pack", &buf.to_host()?, &reference::pack(&xs, host_map, None)));
    }
    let bs = random_coords(buf.len(), seed.wrapping_add(1));
    buf.copy_from_host(&bs)?;
    unpack(module, stream, buf, map, x, true)?;
    wait("the checked unpack-accumulate")?;
    let mut want = xs;
    reference::unpack_accumulate(&bs, host_map, &mut want);
    Ok(first_difference("unpack-accumulate", &x.to_host()?, &want))
}

/// Runs the kernel benchmark on one GPU.
pub fn run(cfg: &KernelBenchConfig) -> Result<KernelReport> {
    let ctx = gpu::open_device(cfg.device)?;
    let artifacts = crate::artifacts::KernelArtifacts::locate(crate::artifacts::DEFAULT_ARCH)?;
    let module = Arc::new(KernelModule::load(&ctx, &artifacts)?);
    let stream = ctx.new_stream().map_err(|source| HaloError::Cuda { what: "creating a stream".into(), source })?;
    let mut bw = Vec::new();
    for _ in 0..cfg.repeats.clamp(3, 10) {
        bw.push(floor::measure_device_bw(&ctx, &stream, 256 << 20)?);
    }
    let device_bw_gbs = Summary::of(&bw).map(|s| s.scaled(1e-9)).ok_or_else(|| HaloError::InvalidInput("no bandwidth".into()))?;
    let (sorted, random) = maps(cfg.map_len, cfg.array_len, cfg.seed)?;
    let x = DeviceBuffer::<Float3>::zeroed(&ctx, cfg.array_len)?;
    let buf = DeviceBuffer::<Float3>::zeroed(&ctx, cfg.map_len)?;
    let mut results = Vec::new();
    for (name, host_map) in [("sorted", &sorted), ("random", &random)] {
        let map = IndexMap::new(&ctx, host_map)?;
        let is_sorted = name == "sorted";
        for (kernel, bytes) in [("pack", PACK_BYTES_PER_ATOM), ("unpack-accumulate", UNPACK_BYTES_PER_ATOM)] {
            let seed = cfg.seed.wrapping_mul(31).wrapping_add(results.len() as u64 * 2);
            let check = |seed: u64, when: &str| -> Result<()> {
                check_kernel(&module, &stream, kernel, &map, host_map, (&x, &buf), seed)?.map_err(|why| {
                    HaloError::InvalidInput(format!(
                        "{kernel} with the {name} map {when} its timed launches differs from the CPU reference, so it has no times: {why}"
                    ))
                })
            };
            // The timed launches run on the random data the check leaves.
            check(seed, "before")?;
            let t = match kernel {
                "pack" => time_one(&stream, || pack_coords(&module, &stream, &x, &map, &buf, None), cfg.repeats)?,
                _ => time_one(&stream, || unpack(&module, &stream, &buf, &map, &x, true), cfg.repeats)?,
            };
            check(seed.wrapping_add(1), "after")?;
            results.push(KernelResult {
                kernel: kernel.into(),
                map: name.into(),
                effective_gbs: bytes * cfg.map_len as f64 / (t.median * 1e-6) * 1e-9,
                time_us: t,
                target_us: target_us(kernel, is_sorted),
                checked: true,
            });
        }
    }
    stream.synchronize().map_err(|source| HaloError::Cuda { what: "finishing the kernels".into(), source })?;
    Ok(KernelReport {
        schema_version: SCHEMA_VERSION,
        machine: crate::machine::MachineInfo::collect(None),
        gpu: ctx.name().unwrap_or_else(|_| "GPU".into()),
        map_len: cfg.map_len,
        array_len: cfg.array_len,
        device_bw_gbs,
        results,
    })
}

/// The kernel report as a table.
pub fn table(r: &KernelReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "halo bench-kernels on {}: {} map entries (distinct) into {} float3 atoms; every kernel matched the CPU reference before and after its timed launches",
        r.gpu, r.map_len, r.array_len
    );
    let _ = writeln!(s, "device copy bandwidth {} GB/s (read + write)", r.device_bw_gbs.cell(0));
    let _ = writeln!(s, "{:<18} {:<7} {:>24} {:>10} {:>9} {:>8}", "kernel", "map", "us median [min-max]", "GB/s eff", "% of copy", "target");
    for k in &r.results {
        let verdict = if k.time_us.median <= k.target_us { "met" } else { "MISSED" };
        let _ = writeln!(
            s,
            "{:<18} {:<7} {:>24} {:>10.0} {:>8.0}% {:>6.0}us  {}",
            k.kernel,
            k.map,
            k.time_us.cell(1),
            k.effective_gbs,
            100.0 * k.effective_gbs / r.device_bw_gbs.median,
            k.target_us,
            verdict
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_distinct_in_range_and_the_same_set() {
        let (sorted, random) = maps(1000, 4000, 3).unwrap();
        assert_eq!(sorted.len(), 1000);
        assert!(sorted.windows(2).all(|w| w[0] < w[1]));
        assert!(sorted.iter().all(|&i| i < 4000));
        let mut r = random.clone();
        assert_ne!(r, sorted, "the random map should not come out sorted");
        r.sort_unstable();
        assert_eq!(r, sorted);
        assert!(maps(10, 5, 0).is_err());
    }

    #[test]
    fn a_difference_is_named_by_entry_and_bits() {
        let a = random_coords(100, 1);
        let mut want = a.clone();
        // With the CPU reference: a pack of a permutation, and an accumulation that changes values.
        let map: Vec<u32> = (0..100).rev().collect();
        first_difference("pack", &reference::pack(&a, &map, None), &map.iter().map(|&i| a[i as usize]).collect::<Vec<_>>()).unwrap();
        reference::unpack_accumulate(&a, &map, &mut want);
        assert!(first_difference("unpack-accumulate", &a, &want).unwrap_err().starts_with("unpack-accumulate: entry 0 is"));
        let mut b = a.clone();
        b[57].z = f32::from_bits(b[57].z.to_bits() ^ 1); // one bit
        let e = first_difference("pack", &b, &a).unwrap_err();
        assert!(e.starts_with("pack: entry 57 is"), "{e}");
        assert!(first_difference("pack", &a[..3], &a).unwrap_err().contains("3 values read back, the CPU reference has 100"));
    }

    #[test]
    fn table_marks_targets() {
        let s = |m| Summary { median: m, min: m, max: m, n: 5 };
        let r = KernelReport {
            schema_version: SCHEMA_VERSION,
            machine: crate::machine::tests::sample(),
            gpu: "H200".into(),
            map_len: 1 << 20,
            array_len: 4 << 20,
            device_bw_gbs: s(4000.0),
            results: vec![
                KernelResult { kernel: "pack".into(), map: "sorted".into(), time_us: s(20.0), effective_gbs: 1468.0, target_us: 22.0, checked: true },
                KernelResult { kernel: "pack".into(), map: "random".into(), time_us: s(30.0), effective_gbs: 979.0, target_us: 28.0, checked: true },
            ],
        };
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[3].ends_with("met") && lines[4].ends_with("MISSED"), "{t}");
        assert!(lines[3].contains("37%"), "{t}");
        assert_eq!(target_us("unpack-accumulate", false), 60.0);
    }
}
