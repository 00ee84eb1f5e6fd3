//! What machine a result came from: every result file (`halo bench --json`, `verify --json`,
//! `bench-kernels --json`, the calibration's sidecar) carries a [`MachineInfo`], and every log
//! prints [`MachineInfo::text`] first. GPU names and the CUDA driver version come from the driver,
//! the NVIDIA driver version from `/proc/driver/nvidia/version` (or `nvidia-smi`), the topology
//! from `nvidia-smi topo -m` when that command is there, NCCL's and NVSHMEM's versions from the
//! libraries themselves. What cannot be found says `absent: <why>`: nothing is left blank.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One GPU as the CUDA driver sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// CUDA ordinal (within `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// `cuDeviceGetName`.
    pub name: String,
    /// PCI bus id (`0000:19:00.0`).
    pub pci_bus_id: String,
    /// Device memory (GiB).
    pub memory_gib: f64,
    /// Whether this process's contexts on it are shared through CUDA MPS
    /// (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`); `None` where the driver did not say (and in files
    /// written before it was recorded).
    #[serde(default)]
    pub mps: Option<bool>,
}

/// The machine and software a result was measured with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// When (UTC, RFC 3339).
    pub date_utc: String,
    /// The command line of this process.
    pub command: String,
    /// Host name.
    pub hostname: String,
    /// The GPUs CUDA sees.
    pub gpus: Vec<GpuInfo>,
    /// NVIDIA driver version (`580.159.04`).
    pub nvidia_driver: String,
    /// The CUDA version the driver supports (`cuDriverGetVersion`, e.g. `13.0`).
    pub cuda_driver: String,
    /// `nvidia-smi topo -m`, or why it is absent.
    pub topology: String,
    /// NCCL's version (`ncclGetVersion`) and library, or why it is absent.
    pub nccl: String,
    /// NVSHMEM's host library version and path, or why it is absent.
    pub nvshmem: String,
    /// The NVSHMEM device library linked into the kernels.
    pub nvshmem_kernels: String,
    /// This program's version.
    pub halo: String,
    /// The hardware queues CUDA feeds this process's streams through:
    /// `CUDA_DEVICE_MAX_CONNECTIONS` as set, or that it was unset (the driver's default, 8). Kernels
    /// of streams that share a queue start in launch order, so the number matters where a process
    /// drives several ranks. Empty in files written before it was recorded.
    #[serde(default)]
    pub hardware_queues: String,
}

/// The environment variable that sets how many hardware queues CUDA gives a process.
pub const HARDWARE_QUEUES_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// [`MachineInfo::hardware_queues`] from the variable's value.
pub fn hardware_queues_text(value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{HARDWARE_QUEUES_VAR}={v}"),
        None => format!("{HARDWARE_QUEUES_VAR} unset (the driver's default, 8)"),
    }
}

/// `cuDriverGetVersion`'s number as `major.minor` (13000 -> `13.0`, 12080 -> `12.8`).
pub fn cuda_version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// `ncclGetVersion`'s code as `major.minor.patch` (22809 -> `2.28.9`; codes before 2.9 were
/// `major*1000 + minor*100 + patch`).
pub fn nccl_version_text(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// The driver version in `/proc/driver/nvidia/version`'s first line
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Sun ...`).
pub fn driver_from_proc(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains("Kernel Module"))?;
    let after = line.split("Kernel Module").nth(1)?;
    let is_version = |v: &&str| v.contains('.') && v.chars().all(|c| c.is_ascii_digit() || c == '.');
    after.split_whitespace().find(is_version).map(str::to_string)
}

/// Runs `program args` for at most `timeout` (nvidia-smi can hang on a wedged driver); its
/// standard output, or why not.
pub fn run_bounded(program: &str, args: &[&str], timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("`{program}` could not be started: {e}"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                if let Some(mut o) = child.stdout.take() {
                    use std::io::Read;
                    let _ = o.read_to_string(&mut out);
                }
                return if status.success() { Ok(out) } else { Err(format!("`{program} {}` failed ({status})", args.join(" "))) };
            }
            Ok(None) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`{program} {}` did not finish within {:.0} s", args.join(" "), timeout.as_secs_f64()));
            }
            Err(e) => return Err(format!("waiting for `{program}`: {e}")),
        }
    }
}

fn absent(why: impl std::fmt::Display) -> String {
    format!("absent: {why}")
}

fn gpus() -> Result<Vec<GpuInfo>, String> {
    use cudarc::driver::{result, sys};
    if let Some(why) = halo::gpu::gpu_unavailable_reason() {
        return Err(why);
    }
    let n = result::device::get_count().map_err(|e| e.to_string())?;
    (0..n)
        .map(|i| {
            let dev = result::device::get(i).map_err(|e| e.to_string())?;
            let name = result::device::get_name(dev).map_err(|e| e.to_string())?;
            // SAFETY: a valid device handle.
            let bytes = unsafe { result::device::total_mem(dev) }.unwrap_or(0);
            let mut bus = [0 as std::ffi::c_char; 32];
            // SAFETY: writes at most 32 bytes, NUL-terminated.
            let pci = unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) }.result().map_or_else(
                absent,
                // SAFETY: NUL-terminated by the driver.
                |_| unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned(),
            );
            // SAFETY: a valid device handle; the attribute is an int.
            let mps = unsafe { result::device::get_attribute(dev, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED) }.ok().map(|v| v != 0);
            Ok(GpuInfo { ordinal: i as usize, name, pci_bus_id: pci, memory_gib: bytes as f64 / (1u64 << 30) as f64, mps })
        })
        .collect()
}

fn nvidia_driver() -> String {
    if let Some(v) = std::fs::read_to_string("/proc/driver/nvidia/version").ok().as_deref().and_then(driver_from_proc) {
        return v;
    }
    match run_bounded("nvidia-smi", &["--query-gpu=driver_version", "--format=csv,noheader"], Duration::from_secs(10)) {
        Ok(out) => out.lines().next().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).unwrap_or_else(|| absent("nvidia-smi printed nothing")),
        Err(why) => absent(format!("no /proc/driver/nvidia/version and {why}")),
    }
}

fn cuda_driver() -> String {
    if let Some(why) = halo::gpu::gpu_unavailable_reason() {
        return absent(why);
    }
    let mut v = 0;
    // SAFETY: writes one int; the driver is loaded (checked above).
    match unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result() {
        Ok(()) => cuda_version_text(v),
        Err(e) => absent(e),
    }
}

fn nccl() -> String {
    match crate::bench::nccl::Nccl::load().and_then(|n| Ok((n.version()?, n.path().to_string()))) {
        Ok((code, path)) => format!("{} ({path})", nccl_version_text(code)),
        Err(e) => absent(e),
    }
}

fn nvshmem(pe: Option<&halo::nvshmem::Nvshmem>) -> String {
    if let Some(nv) = pe {
        let (a, b, c) = nv.version();
        return format!("{a}.{b}.{c} ({}, initialised, {} PEs)", nv.library_path().display(), nv.n_pes());
    }
    match halo::nvshmem::load_library(None) {
        Ok(lib) => {
            let (a, b, c) = lib.version();
            format!("{a}.{b}.{c} ({}, not initialised: one process)", lib.path().display())
        }
        Err(e) => absent(e),
    }
}

fn nvshmem_kernels() -> String {
    match halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH) {
        Ok(a) => format!("NVSHMEM {} linked into {} ({})", a.manifest.nvshmem_version, a.manifest.arch, a.describe()),
        Err(e) => absent(e),
    }
}

/// The matrix of `nvidia-smi topo -m`'s output: its terminal escapes (the header is underlined)
/// and the fixed legend after it (`X = Self`, `NV# = ...`) left out, which every log repeated.
pub fn topology_matrix(raw: &str) -> String {
    let mut out = String::new();
    for line in raw.lines() {
        if line.trim() == "Legend:" {
            break;
        }
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' && chars.peek() == Some(&'[') {
                // CSI: parameters up to the final byte (`@` to `~`).
                chars.next();
                while chars.next().is_some_and(|b| !('@'..='~').contains(&b)) {}
            } else {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out.trim_end().to_string()
}

impl MachineInfo {
    /// Looks everything up (a second or so: it runs `nvidia-smi`). `pe`: this process's NVSHMEM
    /// PE when it is one.
    pub fn collect(pe: Option<&halo::nvshmem::Nvshmem>) -> Self {
        let topology = match run_bounded("nvidia-smi", &["topo", "-m"], Duration::from_secs(20)) {
            Ok(out) => topology_matrix(&out),
            Err(why) => absent(why),
        };
        Self {
            date_utc: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            hostname: halo::route::gpu_facts::hostname(),
            gpus: gpus().unwrap_or_default(),
            nvidia_driver: nvidia_driver(),
            cuda_driver: cuda_driver(),
            topology,
            nccl: nccl(),
            nvshmem: nvshmem(pe),
            nvshmem_kernels: nvshmem_kernels(),
            halo: format!("halo {}", env!("CARGO_PKG_VERSION")),
            hardware_queues: hardware_queues_text(std::env::var(HARDWARE_QUEUES_VAR).ok().as_deref()),
        }
    }

    /// The block every log starts with.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "machine: {} at {} UTC", self.hostname, self.date_utc);
        let _ = writeln!(s, "  command: {}", self.command);
        if self.gpus.is_empty() {
            let _ = writeln!(s, "  GPUs: none");
        }
        for g in &self.gpus {
            let mps = match g.mps {
                Some(true) => ", shared through MPS",
                Some(false) => ", no MPS",
                None => "",
            };
            let _ = writeln!(s, "  GPU {}: {} ({}, {:.0} GiB{mps})", g.ordinal, g.name, g.pci_bus_id, g.memory_gib);
        }
        let _ = writeln!(s, "  NVIDIA driver {}, CUDA driver {}", self.nvidia_driver, self.cuda_driver);
        let _ = writeln!(s, "  NCCL {}", self.nccl);
        let _ = writeln!(s, "  NVSHMEM {}; kernels: {}", self.nvshmem, self.nvshmem_kernels);
        let _ = writeln!(s, "  {}", self.halo);
        if !self.hardware_queues.is_empty() {
            let _ = writeln!(s, "  {}", self.hardware_queues);
        }
        let _ = writeln!(s, "  nvidia-smi topo -m:");
        for line in self.topology.lines() {
            let _ = writeln!(s, "    {line}");
        }
        s
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn the_topology_keeps_the_matrix_without_escapes_or_legend() {
        let raw = "\t\u{1b}[4mGPU0\tGPU1\tCPU Affinity\u{1b}[0m\nGPU0\t X \tNV18\t0-15\nGPU1\tNV18\t X \t0-15\n\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n";
        assert_eq!(topology_matrix(raw), "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-15\nGPU1\tNV18\t X \t0-15");
        assert_eq!(topology_matrix("no legend here\n"), "no legend here");
    }

    pub(crate) fn sample() -> MachineInfo {
        MachineInfo {
            date_utc: "2026-12-01T10:00:00Z".into(),
            command: "halo bench".into(),
            hostname: "h200-1".into(),
            gpus: vec![GpuInfo { ordinal: 0, name: "NVIDIA H200".into(), pci_bus_id: "0000:19:00.0".into(), memory_gib: 139.8, mps: Some(true) }],
            nvidia_driver: "580.159.04".into(),
            cuda_driver: "13.0".into(),
            topology: "\tGPU0\tGPU1\nGPU0\t X \tNV18".into(),
            nccl: "2.28.9 (libnccl.so.2)".into(),
            nvshmem: "3.4.5 (libnvshmem_host.so.3, initialised, 2 PEs)".into(),
            nvshmem_kernels: "NVSHMEM 3.4.5 linked into sm_90".into(),
            halo: "halo 0.1.0".into(),
            hardware_queues: hardware_queues_text(Some("32")),
        }
    }

    #[test]
    fn versions_are_spelled_as_their_projects_do() {
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(12080), "12.8");
        assert_eq!(nccl_version_text(22809), "2.28.9");
        assert_eq!(nccl_version_text(2708), "2.7.8");
        let proc = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)  Thu\nGCC version: gcc 12";
        assert_eq!(driver_from_proc(proc).as_deref(), Some("580.159.04"));
        let proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023";
        assert_eq!(driver_from_proc(proc).as_deref(), Some("535.104.05"));
        assert_eq!(driver_from_proc("something else"), None);
    }

    #[test]
    fn a_missing_or_hanging_command_is_reported_not_fatal() {
        assert!(run_bounded("halo-no-such-program", &[], Duration::from_secs(1)).unwrap_err().contains("could not be started"));
        assert!(run_bounded("sleep", &["5"], Duration::from_millis(100)).unwrap_err().contains("did not finish"));
        assert_eq!(run_bounded("echo", &["topo"], Duration::from_secs(5)).unwrap().trim(), "topo");
        assert!(run_bounded("false", &[], Duration::from_secs(5)).unwrap_err().contains("failed"));
    }

    #[test]
    fn the_text_names_everything_and_json_round_trips() {
        let m = sample();
        let t = m.text();
        for want in [
            "h200-1",
            "2026-12-01T10:00:00Z",
            "NVIDIA H200 (0000:19:00.0, 140 GiB, shared through MPS)",
            "CUDA_DEVICE_MAX_CONNECTIONS=32",
            "NVIDIA driver 580.159.04, CUDA driver 13.0",
            "NCCL 2.28.9",
            "NVSHMEM 3.4.5",
            "topo -m:",
            "    GPU0\t X \tNV18",
            "command: halo bench",
        ] {
            assert!(t.contains(want), "{want} missing in\n{t}");
        }
        let back: MachineInfo = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    /// The queue count says whether it was set; files written before the MPS flag and the queue
    /// count were recorded still read, with neither.
    #[test]
    fn the_hardware_queues_are_named_and_older_files_still_read() {
        assert_eq!(hardware_queues_text(Some("32")), "CUDA_DEVICE_MAX_CONNECTIONS=32");
        assert_eq!(hardware_queues_text(None), "CUDA_DEVICE_MAX_CONNECTIONS unset (the driver's default, 8)");
        let mut v = serde_json::to_value(sample()).unwrap();
        v.as_object_mut().unwrap().remove("hardware_queues");
        v["gpus"][0].as_object_mut().unwrap().remove("mps");
        let old: MachineInfo = serde_json::from_value(v).unwrap();
        assert_eq!((old.hardware_queues.as_str(), old.gpus[0].mps), ("", None));
        let t = old.text();
        assert!(t.contains("(0000:19:00.0, 140 GiB)\n") && !t.contains("CUDA_DEVICE_MAX_CONNECTIONS"), "{t}");
    }

    #[test]
    fn collecting_here_never_fails_and_says_what_is_absent() {
        // No GPU on the build machines: every GPU field says why instead of being empty.
        let m = MachineInfo::collect(None);
        assert!(!m.date_utc.is_empty() && m.date_utc.ends_with('Z'), "{}", m.date_utc);
        for field in [&m.nvidia_driver, &m.cuda_driver, &m.topology, &m.nccl, &m.nvshmem, &m.nvshmem_kernels, &m.hardware_queues] {
            assert!(!field.is_empty());
        }
        if m.gpus.is_empty() {
            assert!(m.cuda_driver.starts_with("absent: "), "{}", m.cuda_driver);
        }
    }
}
