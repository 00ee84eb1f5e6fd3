//! What a benchmark ran on: GPUs, driver, how the GPUs connect, versions, the command line. Every
//! field is best effort: a query that fails leaves its field empty instead of failing the run.

use serde::{Deserialize, Serialize};

/// The machine and software of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// Host name.
    pub host: String,
    /// Logical CPUs this process may use.
    pub cpus: usize,
    /// Visible GPUs, by ordinal: name.
    pub gpus: Vec<String>,
    /// CUDA driver API version (`cuDriverGetVersion`), e.g. `13.0`.
    pub cuda_driver_api: Option<String>,
    /// The driver's version as `nvidia-smi` prints it, e.g. `580.159.04`.
    pub driver: Option<String>,
    /// How each GPU reaches the others (peer access, NVLink), from the driver.
    pub links: Vec<String>,
    /// `nvidia-smi topo -m`, when `nvidia-smi` is installed.
    pub topology: Option<String>,
    /// halo's version.
    pub halo_version: String,
    /// NVSHMEM host library version, when this run started NVSHMEM.
    pub nvshmem: Option<String>,
    /// `one process` or `N PEs (NVSHMEM)`.
    pub mode: String,
    /// The command line.
    pub command: String,
}

/// The output of `nvidia-smi ARGS`, trimmed, if it runs and succeeds.
fn nvidia_smi(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

impl MachineInfo {
    /// Collects what this process can see; `mode` and `nvshmem` come from the caller.
    pub fn collect(mode: &str, nvshmem: Option<(i32, i32, i32)>) -> Self {
        let mut info = Self {
            host: halo::route::gpu_facts::hostname(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            halo_version: env!("CARGO_PKG_VERSION").to_string(),
            nvshmem: nvshmem.map(|(a, b, c)| format!("{a}.{b}.{c}")),
            mode: mode.to_string(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            ..Self::default()
        };
        if halo::gpu::gpu_unavailable_reason().is_none() {
            let mut v = 0;
            // SAFETY: a plain query writing one int.
            if unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result().is_ok() {
                info.cuda_driver_api = Some(format!("{}.{}", v / 1000, (v % 1000) / 10));
            }
            let n = halo::gpu::device_count();
            for i in 0..n {
                let name = cudarc::driver::result::device::get(i as i32).and_then(cudarc::driver::result::device::get_name);
                info.gpus.push(name.unwrap_or_else(|e| format!("unknown ({e})")));
            }
            let probe = (n > 1).then(halo::route::gpu_facts::DriverProbe::new).and_then(|p| p.ok());
            for (i, probe) in probe.iter().flat_map(|p| (0..n).map(move |i| (i, p))) {
                if let Ok(links) = halo::route::gpu_facts::probe_links(probe, i) {
                    info.links.extend(links.iter().map(|l| format!("GPU {i} -> {l}")));
                }
            }
        }
        info.driver = nvidia_smi(&["--query-gpu=driver_version", "--format=csv,noheader"]).and_then(|s| s.lines().next().map(str::to_string));
        info.topology = nvidia_smi(&["topo", "-m"]);
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_without_a_gpu_and_round_trips() {
        let m = MachineInfo::collect("one process", Some((3, 4, 5)));
        assert_eq!(m.nvshmem.as_deref(), Some("3.4.5"));
        assert!(m.cpus >= 1 && !m.host.is_empty() && !m.command.is_empty());
        let back: MachineInfo = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}
