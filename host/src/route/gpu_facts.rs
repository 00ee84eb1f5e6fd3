//! This PE's [`PeFacts`] from the GPUs themselves, and gathering them across PEs.
//!
//! For the PE's GPU and every other visible GPU the CUDA driver says whether peer access works
//! (`cuDeviceCanAccessPeer`) and how (`cuDeviceGetP2PAttribute`: performance rank, access and
//! native-atomic support). The driver has no NVLink flag, so NVML (loaded at run time from
//! `libnvidia-ml.so.1`, never linked) confirms it: a pair is NVLink-connected when one GPU has an
//! active link whose far end is the other GPU, or when both have active links to a non-GPU device
//! (an NVSwitch, as on HGX H100/H200). Without NVML the rule is "P2P with native atomics ⇒ NVLink",
//! because PCIe peer access does not offer native atomics; the fallback is logged.
//!
//! The driver queries sit behind [`GpuProbe`] so that the rules turning answers into facts are
//! tested without a GPU. [`discover`] uses the real driver; [`gather`] exchanges facts between the
//! PEs of one `halo launch`; [`local_rank_facts`] builds the facts of ranks sharing one process.

use super::{NvlinkDomain, PeFacts, Placement};
use cudarc::driver::{DriverError, result, sys};
use serde::{Deserialize, Serialize};
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::fmt;
use std::sync::OnceLock;

/// Why GPU discovery or the gathering of facts failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A CUDA driver call failed.
    #[error("CUDA driver: {what}: {source}")]
    Cuda {
        /// What was being asked.
        what: String,
        /// The driver's error.
        source: DriverError,
    },
    /// No GPU can be used here.
    #[error("no GPU: {0}")]
    NoGpu(String),
    /// The facts could not be exchanged between PEs.
    #[error("gathering GPU facts across PEs: {0}")]
    Gather(String),
}

fn cuda(what: impl Into<String>) -> impl FnOnce(DriverError) -> DiscoveryError {
    let what = what.into();
    move |source| DiscoveryError::Cuda { what, source }
}

/// What the driver says about peer access from one GPU to another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct P2pInfo {
    /// `cuDeviceCanAccessPeer`.
    pub can_access: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access_supported: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED` (NVLink offers it, PCIe does not).
    pub native_atomics: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (relative; lower is faster).
    pub performance_rank: i32,
}

/// How the NVLink answer for a pair was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlinkEvidence {
    /// NVML saw an active link to the peer or both GPUs on an NVSwitch.
    Nvml,
    /// NVML was not available: P2P with native atomics was taken to mean NVLink.
    NativeAtomics,
    /// No peer access, so no usable NVLink either.
    NoP2p,
}

impl fmt::Display for NvlinkEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NvlinkEvidence::Nvml => "NVML",
            NvlinkEvidence::NativeAtomics => "P2P native atomics (no NVML)",
            NvlinkEvidence::NoP2p => "no peer access",
        })
    }
}

/// This PE's GPU as seen from one other visible GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerLink {
    /// The other GPU's ordinal in this process.
    pub ordinal: usize,
    /// The other GPU's UUID.
    pub uuid: String,
    /// Driver answers for this GPU → the other.
    pub p2p: P2pInfo,
    /// Whether the two are NVLink-connected (and can use it: peer access works).
    pub nvlink: bool,
    /// How `nvlink` was decided.
    pub evidence: NvlinkEvidence,
}

impl fmt::Display for PeerLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU {} ({}): peer access {}, native atomics {}, performance rank {}, {} (by {})",
            self.ordinal,
            self.uuid,
            if self.p2p.can_access { "yes" } else { "no" },
            if self.p2p.native_atomics { "yes" } else { "no" },
            self.p2p.performance_rank,
            if self.nvlink {
                "NVLink"
            } else if self.p2p.can_access {
                "PCIe"
            } else {
                "no P2P"
            },
            self.evidence
        )
    }
}

/// Driver (and NVML) queries, behind a trait so that tests can fake a machine.
pub trait GpuProbe {
    /// Visible GPUs.
    fn device_count(&self) -> Result<usize, DiscoveryError>;
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML and `nvidia-smi -L` print it.
    fn uuid(&self, ordinal: usize) -> Result<String, DiscoveryError>;
    /// Peer access from `from` to `to`.
    fn p2p(&self, from: usize, to: usize) -> Result<P2pInfo, DiscoveryError>;
    /// NVML's answer for the pair, or `None` when NVML cannot say (not installed, query failed).
    fn nvml_nvlink(&self, from: usize, to: usize) -> Option<bool>;
    /// NVML's multi-node NVLink fabric info for the GPU, or `None` when NVML cannot say (not
    /// installed, a driver without the query, a GPU outside any fabric).
    fn fabric(&self, _ordinal: usize) -> Option<FabricInfo> {
        None
    }
}

/// What NVML says about a GPU's place in a multi-node NVLink fabric (GB200 NVL72 and the like):
/// `nvmlDeviceGetGpuFabricInfoV`, or `nvmlDeviceGetGpuFabricInfo` on older drivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricInfo {
    /// The fabric's cluster UUID (all zero when the GPU is in none).
    pub cluster_uuid: [u8; 16],
    /// The clique within the cluster.
    pub clique_id: u32,
    /// Registration state: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// NVML's status of the registration (0 = success); meaningful once completed.
    pub status: i32,
}

impl FabricInfo {
    /// `NVML_GPU_FABRIC_STATE_COMPLETED`.
    pub const STATE_COMPLETED: u8 = 3;

    /// The NVLink domain the GPU belongs to: only when its registration completed successfully
    /// and names a cluster (a GPU without multi-node NVLink reports "not supported" or a zero
    /// UUID).
    pub fn domain(&self) -> Option<NvlinkDomain> {
        (self.state == Self::STATE_COMPLETED && self.status == 0 && self.cluster_uuid != [0; 16])
            .then(|| NvlinkDomain { cluster_uuid: self.cluster_uuid.iter().map(|b| format!("{b:02x}")).collect(), clique_id: self.clique_id })
    }
}

impl fmt::Display for FabricInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.domain() {
            Some(d) => write!(f, "NVLink fabric cluster {} clique {}", d.cluster_uuid, d.clique_id),
            None => write!(f, "no NVLink fabric (state {}, status {})", self.state, self.status),
        }
    }
}

/// The links of GPU `ordinal` to every other GPU `probe` sees.
pub fn probe_links(probe: &dyn GpuProbe, ordinal: usize) -> Result<Vec<PeerLink>, DiscoveryError> {
    let n = probe.device_count()?;
    let mut out = Vec::with_capacity(n.saturating_sub(1));
    for other in (0..n).filter(|&o| o != ordinal) {
        let p2p = probe.p2p(ordinal, other)?;
        let (nvlink, evidence) = if !p2p.can_access {
            (false, NvlinkEvidence::NoP2p)
        } else {
            match probe.nvml_nvlink(ordinal, other) {
                Some(v) => (v, NvlinkEvidence::Nvml),
                None => (p2p.native_atomics, NvlinkEvidence::NativeAtomics),
            }
        };
        out.push(PeerLink { ordinal: other, uuid: probe.uuid(other)?, p2p, nvlink, evidence });
    }
    Ok(out)
}

/// The facts of a PE on GPU `ordinal` of `host`: NVLink peers and P2P peers from `links`.
pub fn facts_from_links(host: &str, uuid: &str, links: &[PeerLink], placement: Option<Placement>) -> PeFacts {
    PeFacts {
        host: host.to_owned(),
        gpu_uuid: uuid.to_owned(),
        nvlink_peers: links.iter().filter(|l| l.nvlink).map(|l| l.uuid.clone()).collect(),
        p2p_peers: links.iter().filter(|l| l.p2p.can_access).map(|l| l.uuid.clone()).collect(),
        placement,
        nvlink_domain: None,
    }
}

/// [`facts_from_links`] plus the GPU's multi-node NVLink domain, if NVML reports one.
fn probed_facts(probe: &dyn GpuProbe, ordinal: usize, host: &str, uuid: &str, links: &[PeerLink], placement: Option<Placement>) -> PeFacts {
    PeFacts { nvlink_domain: probe.fabric(ordinal).and_then(|f| f.domain()), ..facts_from_links(host, uuid, links, placement) }
}

/// What discovery found for one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDiscovery {
    /// The GPU's ordinal in this process.
    pub ordinal: usize,
    /// Its name (`NVIDIA H200`).
    pub name: String,
    /// The facts the topology is built from.
    pub facts: PeFacts,
    /// Every other visible GPU and how it is reached.
    pub links: Vec<PeerLink>,
    /// Whether NVML answered, or why not.
    pub nvml: Result<(), String>,
    /// NVML's multi-node NVLink fabric info, when it gave any.
    pub fabric: Option<FabricInfo>,
}

/// The real driver, with NVML when it loads.
pub struct DriverProbe {
    nvml: Result<&'static Nvml, String>,
}

impl DriverProbe {
    /// Initialises the driver and tries NVML (its absence is not an error: see the module docs).
    pub fn new() -> Result<Self, DiscoveryError> {
        if !crate::gpu::driver_library_present() {
            return Err(DiscoveryError::NoGpu("the CUDA driver library (libcuda.so) is not installed".into()));
        }
        result::init().map_err(cuda("cuInit"))?;
        Ok(Self { nvml: Nvml::get() })
    }

    /// Whether NVML is in use, or why not.
    pub fn nvml_status(&self) -> Result<(), String> {
        self.nvml.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    fn device(ordinal: usize) -> Result<sys::CUdevice, DiscoveryError> {
        result::device::get(ordinal as c_int).map_err(cuda(format!("cuDeviceGet({ordinal})")))
    }

    fn pci(ordinal: usize) -> Result<PciAddr, DiscoveryError> {
        let dev = Self::device(ordinal)?;
        let mut buf = [0 as c_char; 32];
        // SAFETY: `buf` is writable for its full length, which is what we pass; the driver writes a
        // NUL-terminated string no longer than that.
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) }.result().map_err(cuda("cuDeviceGetPCIBusId"))?;
        // SAFETY: the buffer is NUL-terminated (zero-initialised and the driver terminates it).
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        PciAddr::parse(&text).ok_or_else(|| DiscoveryError::NoGpu(format!("unexpected PCI bus id {text:?}")))
    }

    /// The device's name.
    pub fn name(&self, ordinal: usize) -> Result<String, DiscoveryError> {
        result::device::get_name(Self::device(ordinal)?).map_err(cuda("cuDeviceGetName"))
    }
}

impl GpuProbe for DriverProbe {
    fn device_count(&self) -> Result<usize, DiscoveryError> {
        result::device::get_count().map(|n| n.max(0) as usize).map_err(cuda("cuDeviceGetCount"))
    }

    fn uuid(&self, ordinal: usize) -> Result<String, DiscoveryError> {
        let u = result::device::get_uuid(Self::device(ordinal)?).map_err(cuda("cuDeviceGetUuid"))?;
        Ok(format_uuid(&u.bytes.map(|b| b as u8)))
    }

    fn p2p(&self, from: usize, to: usize) -> Result<P2pInfo, DiscoveryError> {
        let (a, b) = (Self::device(from)?, Self::device(to)?);
        let mut can = 0 as c_int;
        // SAFETY: `can` is a valid out-pointer; both devices came from cuDeviceGet.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) }.result().map_err(cuda("cuDeviceCanAccessPeer"))?;
        let attr = |which: sys::CUdevice_P2PAttribute| -> Result<i32, DiscoveryError> {
            let mut v = 0 as c_int;
            // SAFETY: `v` is a valid out-pointer; both devices came from cuDeviceGet and differ.
            unsafe { sys::cuDeviceGetP2PAttribute(&mut v, which, a, b) }.result().map_err(cuda(format!("cuDeviceGetP2PAttribute({which:?})")))?;
            Ok(v)
        };
        use sys::CUdevice_P2PAttribute as A;
        Ok(P2pInfo {
            can_access: can != 0,
            access_supported: attr(A::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            native_atomics: attr(A::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            performance_rank: attr(A::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
        })
    }

    fn nvml_nvlink(&self, from: usize, to: usize) -> Option<bool> {
        let nvml = *self.nvml.as_ref().ok()?;
        let query = |ordinal: usize| -> Option<Vec<NvLinkEnd>> {
            let uuid = self.uuid(ordinal).ok()?;
            let pci = Self::pci(ordinal).ok()?;
            nvml.active_links(&uuid, &pci)
        };
        let (a, b) = (query(from)?, query(to)?);
        let (pa, pb) = (Self::pci(from).ok()?, Self::pci(to).ok()?);
        let direct = a.iter().any(|e| e.remote == pb) || b.iter().any(|e| e.remote == pa);
        // Drivers without the remote-type query: an end that is none of the visible GPUs is taken
        // for a switch (GPUs hidden by CUDA_VISIBLE_DEVICES would be mistaken for one, which only
        // matters when the peer also links to such a device).
        let gpus: Vec<PciAddr> = (0..self.device_count().ok()?).filter_map(|o| Self::pci(o).ok()).collect();
        let is_switch = |e: &NvLinkEnd| e.switch.unwrap_or_else(|| !gpus.contains(&e.remote));
        // Both on NVSwitch: NVLink reaches the peer through the switch fabric (HGX boards).
        let switched = a.iter().any(is_switch) && b.iter().any(is_switch);
        Some(direct || switched)
    }

    fn fabric(&self, ordinal: usize) -> Option<FabricInfo> {
        let nvml = *self.nvml.as_ref().ok()?;
        nvml.fabric(&self.uuid(ordinal).ok()?, &Self::pci(ordinal).ok()?)
    }
}

/// `GPU-` and the 16 bytes in the 8-4-4-4-12 hex grouping.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", hex[0..4].concat(), hex[4..6].concat(), hex[6..8].concat(), hex[8..10].concat(), hex[10..16].concat())
}

/// PCI domain, bus and device (function ignored: GPUs are function 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PciAddr {
    domain: u32,
    bus: u32,
    device: u32,
}

impl PciAddr {
    /// `0000:18:00.0` or NVML's `00000000:18:00.0`.
    fn parse(s: &str) -> Option<Self> {
        let mut it = s.trim().splitn(3, ':');
        let domain = u32::from_str_radix(it.next()?, 16).ok()?;
        let bus = u32::from_str_radix(it.next()?, 16).ok()?;
        let device = u32::from_str_radix(it.next()?.split('.').next()?, 16).ok()?;
        Some(Self { domain, bus, device })
    }
}

/// One active NVLink of a GPU: where it ends.
#[derive(Clone, Copy, Debug)]
struct NvLinkEnd {
    remote: PciAddr,
    /// Whether the far end is a switch; `None` when the driver cannot say.
    switch: Option<bool>,
}

// NVML's C types, as declared in nvml.h (stable ABI since the _v2 entry points).
type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;
const NVML_SUCCESS: NvmlReturn = 0;
/// NVML_NVLINK_MAX_LINKS (18 on Hopper); a query past the last link fails and ends the scan.
const NVML_NVLINK_MAX_LINKS: c_uint = 18;
const NVML_NVLINK_DEVICE_TYPE_GPU: c_int = 0;

#[repr(C)]
struct NvmlPciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlGpuFabricInfo_t` (nvml.h): the unversioned struct of `nvmlDeviceGetGpuFabricInfo`.
#[repr(C)]
#[derive(Default)]
struct NvmlGpuFabricInfoV1 {
    cluster_uuid: [u8; 16],
    status: NvmlReturn,
    clique_id: c_uint,
    state: u8,
}

/// `nvmlGpuFabricInfo_v2_t` (nvml.h), for `nvmlDeviceGetGpuFabricInfoV` with version 2, the first
/// version of that entry point (v3 appends a health summary). A driver that refuses it gets the
/// unversioned query instead.
#[repr(C)]
#[derive(Default)]
struct NvmlGpuFabricInfoV2 {
    version: c_uint,
    cluster_uuid: [u8; 16],
    status: NvmlReturn,
    clique_id: c_uint,
    state: u8,
    health_mask: c_uint,
}

// The layouts nvml.h gives (4-byte alignment, padding after `state`).
const _: () = assert!(size_of::<NvmlGpuFabricInfoV1>() == 28 && size_of::<NvmlGpuFabricInfoV2>() == 36);

/// `nvmlGpuFabricInfo_v2`: NVML_STRUCT_VERSION(GpuFabricInfo, 2) = size | 2 << 24.
const NVML_GPU_FABRIC_INFO_V2: c_uint = size_of::<NvmlGpuFabricInfoV2>() as c_uint | 2 << 24;

/// The NVML entry points discovery uses, resolved once per process.
struct Nvml {
    // Kept so the function pointers below stay valid; never unloaded (the process may still use them).
    _lib: libloading::Library,
    by_uuid: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn,
    by_pci: Option<unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn>,
    link_state: unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_int) -> NvmlReturn,
    remote_pci: unsafe extern "C" fn(NvmlDevice, c_uint, *mut NvmlPciInfo) -> NvmlReturn,
    remote_type: Option<unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_int) -> NvmlReturn>,
    // Fabric info (multi-node NVLink); drivers before R525 have neither, before R550 not the V one.
    fabric_v: Option<unsafe extern "C" fn(NvmlDevice, *mut NvmlGpuFabricInfoV2) -> NvmlReturn>,
    fabric_v1: Option<unsafe extern "C" fn(NvmlDevice, *mut NvmlGpuFabricInfoV1) -> NvmlReturn>,
}

impl Nvml {
    /// The process-wide NVML, or why it is not available (logged once).
    fn get() -> Result<&'static Nvml, String> {
        static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
        NVML.get_or_init(|| {
            let r = Self::load();
            match &r {
                Ok(_) => tracing::info!("route: NVML loaded; NVLink is read from it"),
                Err(e) => tracing::warn!("route: NVML not available ({e}); NVLink is inferred from P2P with native atomics"),
            }
            r
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    fn load() -> Result<Nvml, String> {
        // SAFETY: libnvidia-ml's initialisers only set up its own state; loading it has no other
        // effect on this process.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.map_err(|e| e.to_string())?;
        // SAFETY: each symbol is looked up with the signature nvml.h declares for it; the pointers
        // are used only while `lib` (moved into the returned struct) stays loaded.
        unsafe {
            let init: libloading::Symbol<unsafe extern "C" fn() -> NvmlReturn> = lib.get(b"nvmlInit_v2\0").map_err(|e| e.to_string())?;
            let rc = init();
            if rc != NVML_SUCCESS {
                return Err(format!("nvmlInit_v2 returned {rc}"));
            }
            let by_uuid = *lib.get(b"nvmlDeviceGetHandleByUUID\0").map_err(|e| e.to_string())?;
            let by_pci = lib.get(b"nvmlDeviceGetHandleByPciBusId_v2\0").ok().map(|s| *s);
            let link_state = *lib.get(b"nvmlDeviceGetNvLinkState\0").map_err(|e| e.to_string())?;
            let remote_pci = *lib.get(b"nvmlDeviceGetNvLinkRemotePciInfo_v2\0").map_err(|e| e.to_string())?;
            let remote_type = lib.get(b"nvmlDeviceGetNvLinkRemoteDeviceType\0").ok().map(|s| *s);
            let fabric_v = lib.get(b"nvmlDeviceGetGpuFabricInfoV\0").ok().map(|s| *s);
            let fabric_v1 = lib.get(b"nvmlDeviceGetGpuFabricInfo\0").ok().map(|s| *s);
            Ok(Nvml { by_uuid, by_pci, link_state, remote_pci, remote_type, fabric_v, fabric_v1, _lib: lib })
        }
    }

    /// The NVML handle of the GPU with `uuid` (or at `pci`), `None` when NVML cannot find it.
    fn handle(&self, uuid: &str, pci: &PciAddr) -> Option<NvmlDevice> {
        let mut dev: NvmlDevice = std::ptr::null_mut();
        let uuid_c = CString::new(uuid).ok()?;
        // SAFETY: NUL-terminated input, valid out-pointer (nvml.h signature).
        let mut rc = unsafe { (self.by_uuid)(uuid_c.as_ptr(), &mut dev) };
        if rc != NVML_SUCCESS
            && let Some(by_pci) = self.by_pci
        {
            let bus = CString::new(format!("{:08x}:{:02x}:{:02x}.0", pci.domain, pci.bus, pci.device)).ok()?;
            // SAFETY: as above.
            rc = unsafe { by_pci(bus.as_ptr(), &mut dev) };
        }
        if rc != NVML_SUCCESS {
            tracing::debug!("route: NVML does not know GPU {uuid} (error {rc})");
            return None;
        }
        Some(dev)
    }

    /// The fabric info of the GPU with `uuid` (or at `pci`): the versioned query, else the old one.
    fn fabric(&self, uuid: &str, pci: &PciAddr) -> Option<FabricInfo> {
        let dev = self.handle(uuid, pci)?;
        if let Some(f) = self.fabric_v {
            let mut info = NvmlGpuFabricInfoV2 { version: NVML_GPU_FABRIC_INFO_V2, ..Default::default() };
            // SAFETY: valid handle; `info` has nvml.h's v2 layout and carries the v2 version tag,
            // which tells NVML how much it may write.
            if unsafe { f(dev, &mut info) } == NVML_SUCCESS {
                return Some(FabricInfo { cluster_uuid: info.cluster_uuid, clique_id: info.clique_id, state: info.state, status: info.status });
            }
        }
        let f = self.fabric_v1?;
        let mut info = NvmlGpuFabricInfoV1::default();
        // SAFETY: valid handle; `info` has nvml.h's layout of the unversioned struct.
        (unsafe { f(dev, &mut info) } == NVML_SUCCESS).then_some(FabricInfo {
            cluster_uuid: info.cluster_uuid,
            clique_id: info.clique_id,
            state: info.state,
            status: info.status,
        })
    }

    /// The active links of the GPU with `uuid` (or at `pci`), `None` when NVML cannot find it.
    /// A GPU without NVLink has no active links (NVML answers "not supported").
    fn active_links(&self, uuid: &str, pci: &PciAddr) -> Option<Vec<NvLinkEnd>> {
        let dev = self.handle(uuid, pci)?;
        let mut out = Vec::new();
        for link in 0..NVML_NVLINK_MAX_LINKS {
            let mut active: c_int = 0;
            // SAFETY: `dev` is a handle NVML returned; valid out-pointer. Links past the GPU's last
            // one return an error, which ends the scan.
            if unsafe { (self.link_state)(dev, link, &mut active) } != NVML_SUCCESS {
                break;
            }
            if active == 0 {
                continue;
            }
            // SAFETY: the struct is plain data NVML fills; all-zero is a valid value of it.
            let mut info: NvmlPciInfo = unsafe { std::mem::zeroed() };
            // SAFETY: valid handle and out-pointer to a struct with nvml.h's layout.
            if unsafe { (self.remote_pci)(dev, link, &mut info) } != NVML_SUCCESS {
                continue;
            }
            let remote = PciAddr { domain: info.domain, bus: info.bus, device: info.device };
            let switch = self.remote_type.and_then(|f| {
                let mut t: c_int = NVML_NVLINK_DEVICE_TYPE_GPU;
                // SAFETY: valid handle and out-pointer.
                (unsafe { f(dev, link, &mut t) } == NVML_SUCCESS).then_some(t != NVML_NVLINK_DEVICE_TYPE_GPU)
            });
            out.push(NvLinkEnd { remote, switch });
        }
        Some(out)
    }
}

/// This machine's host name (`gethostname`), or `localhost` when it cannot be read.
pub use crate::node::hostname;

/// Facts for a rank that has no GPU to probe (`halo route --gather` on CPU-only machines, the CI
/// test of gathering under a real launcher): this host, a synthetic GPU per local rank
/// (`GPU-synthetic-<host>-<local rank>`), no peer links, and Slurm's placement when set.
pub fn synthetic_rank_facts(local_rank: usize) -> PeFacts {
    let host = hostname();
    PeFacts {
        gpu_uuid: format!("GPU-synthetic-{host}-{local_rank}"),
        host,
        nvlink_peers: Vec::new(),
        p2p_peers: Vec::new(),
        placement: slurm_placement(),
        nvlink_domain: None,
    }
}

/// This process's Slurm placement, if Slurm set one (malformed values are logged and ignored).
fn slurm_placement() -> Option<Placement> {
    match Placement::from_slurm_env(&|k| std::env::var(k).ok()) {
        Ok(p) => p.map(|(_, p)| p),
        Err(e) => {
            tracing::warn!("route: {e}; placement unknown");
            None
        }
    }
}

/// Discovers GPU `ordinal` with the real driver: its facts, links and name.
pub fn discover(ordinal: usize) -> Result<GpuDiscovery, DiscoveryError> {
    let probe = DriverProbe::new()?;
    discover_with(&probe, ordinal, &hostname(), slurm_placement())
}

fn discover_with(probe: &DriverProbe, ordinal: usize, host: &str, placement: Option<Placement>) -> Result<GpuDiscovery, DiscoveryError> {
    let links = probe_links(probe, ordinal)?;
    let uuid = probe.uuid(ordinal)?;
    let fabric = probe.fabric(ordinal);
    if let Some(f) = &fabric {
        tracing::info!("route: GPU {ordinal} ({uuid}): {f}");
    }
    Ok(GpuDiscovery {
        ordinal,
        name: probe.name(ordinal)?,
        facts: probed_facts(probe, ordinal, host, &uuid, &links, placement),
        links,
        nvml: probe.nvml_status(),
        fabric,
    })
}

/// Facts for `n_ranks` ranks in this process, rank `r` on GPU `r % gpus` (as
/// `exchange::LocalRanks` places them), probed with `probe`.
pub fn local_rank_facts_with(probe: &dyn GpuProbe, host: &str, n_ranks: usize, gpus: usize) -> Result<Vec<PeFacts>, DiscoveryError> {
    if gpus == 0 {
        return Err(DiscoveryError::NoGpu("no GPU to place ranks on".into()));
    }
    let per_gpu: Vec<PeFacts> =
        (0..gpus).map(|g| Ok(probed_facts(probe, g, host, &probe.uuid(g)?, &probe_links(probe, g)?, None))).collect::<Result<_, DiscoveryError>>()?;
    Ok((0..n_ranks).map(|r| per_gpu[r % gpus].clone()).collect())
}

/// [`local_rank_facts_with`] on the real driver, with this host's name and Slurm placement.
/// Also returns every used GPU's discovery (for printing).
pub fn local_rank_facts(n_ranks: usize, gpus: usize) -> Result<(Vec<PeFacts>, Vec<GpuDiscovery>), DiscoveryError> {
    let probe = DriverProbe::new()?;
    let host = hostname();
    let placement = slurm_placement();
    let mut facts = local_rank_facts_with(&probe, &host, n_ranks, gpus)?;
    for f in &mut facts {
        f.placement = placement.clone();
    }
    let found = (0..gpus.min(n_ranks.max(1))).map(|g| discover_with(&probe, g, &host, placement.clone())).collect::<Result<_, _>>()?;
    Ok((facts, found))
}

/// The facts of GPUs `ordinals` of this process (one entry each, in order), with this host's
/// name and Slurm placement: what ranks of one process placed on those GPUs report.
pub fn gpu_facts_of(ordinals: &[usize]) -> Result<Vec<PeFacts>, DiscoveryError> {
    let probe = DriverProbe::new()?;
    let host = hostname();
    let placement = slurm_placement();
    ordinals.iter().map(|&g| Ok(probed_facts(&probe, g, &host, &probe.uuid(g)?, &probe_links(&probe, g)?, placement.clone()))).collect()
}

/// Every PE's facts, indexed by PE, exchanged over the launch's CPU channel under `tag`
/// ([`gather_json`]; each tag once per run). One PE alone gets its own facts back.
pub fn gather(tag: &str, mine: &PeFacts) -> Result<Vec<PeFacts>, DiscoveryError> {
    gather_json(tag, mine)
}

/// All-gathers any serialisable value across the ranks of a launch over a CPU-only channel
/// (JSON), indexed by rank: `halo launch`'s rendezvous directory, or PMI-1 (`PMI_FD`: MPICH's
/// Hydra `mpiexec`, [`crate::launch::pmi`]). Without a multi-rank launch it returns `[mine]`.
/// Runs that start NVSHMEM gather through it instead (`exchange::Routing`), which works under
/// every launcher; other launchers (Open MPI's `mpirun`, PMIx) have no CPU channel here.
pub fn gather_json<T: Serialize + for<'de> Deserialize<'de> + Clone>(tag: &str, mine: &T) -> Result<Vec<T>, DiscoveryError> {
    let env = crate::launch::RankEnv::try_from_env().map_err(|e| DiscoveryError::Gather(e.to_string()))?;
    let bytes = || serde_json::to_vec(mine).map_err(|e| DiscoveryError::Gather(e.to_string()));
    let all = match env {
        None => return Ok(vec![mine.clone()]),
        Some(e) if e.nranks <= 1 => return Ok(vec![mine.clone()]),
        Some(e) if e.source == "halo launch" => {
            crate::launch::rendezvous::all_gather(tag, &bytes()?).map_err(|e| DiscoveryError::Gather(e.to_string()))?
        }
        Some(e) => match crate::launch::pmi::client().map_err(|e| DiscoveryError::Gather(e.to_string()))? {
            Some(client) => {
                let mut c = client.lock().map_err(|_| DiscoveryError::Gather("the PMI client was poisoned".into()))?;
                c.all_gather(tag, &bytes()?).map_err(|e| DiscoveryError::Gather(e.to_string()))?
            }
            None => {
                return Err(DiscoveryError::Gather(format!(
                    "started by {} ({} ranks), which offers no CPU-only channel here (only `halo launch` and PMI-1 launchers such as \
                     MPICH's mpiexec do); the exchange commands gather through NVSHMEM under any launcher",
                    e.source, e.nranks
                )));
            }
        },
    };
    all.iter()
        .enumerate()
        .map(|(pe, b)| serde_json::from_slice(b).map_err(|e| DiscoveryError::Gather(format!("rank {pe} sent {tag} that does not parse: {e}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{DistanceLevel, topology_from_facts};

    /// A machine described by tables: UUIDs, P2P per ordered pair, NVML per pair (or none).
    struct FakeProbe {
        uuids: Vec<String>,
        p2p: Vec<Vec<P2pInfo>>,
        nvml: Option<Vec<Vec<bool>>>,
        fabric: Option<FabricInfo>,
    }

    impl GpuProbe for FakeProbe {
        fn device_count(&self) -> Result<usize, DiscoveryError> {
            Ok(self.uuids.len())
        }
        fn uuid(&self, o: usize) -> Result<String, DiscoveryError> {
            Ok(self.uuids[o].clone())
        }
        fn p2p(&self, a: usize, b: usize) -> Result<P2pInfo, DiscoveryError> {
            Ok(self.p2p[a][b])
        }
        fn nvml_nvlink(&self, a: usize, b: usize) -> Option<bool> {
            self.nvml.as_ref().map(|m| m[a][b])
        }
        fn fabric(&self, _: usize) -> Option<FabricInfo> {
            self.fabric
        }
    }

    fn two_gpus(p2p: bool, atomics: bool, nvml: Option<bool>) -> FakeProbe {
        let info = P2pInfo { can_access: p2p, access_supported: p2p, native_atomics: atomics, performance_rank: 0 };
        FakeProbe {
            uuids: vec!["GPU-a".into(), "GPU-b".into()],
            p2p: vec![vec![P2pInfo::default(), info], vec![info, P2pInfo::default()]],
            nvml: nvml.map(|v| vec![vec![false, v], vec![v, false]]),
            fabric: None,
        }
    }

    fn level(facts: &[PeFacts], a: usize, b: usize) -> Option<DistanceLevel> {
        topology_from_facts(facts, None).ok()?.distance(a, b).ok()
    }

    #[test]
    fn two_gpus_with_nvlink_by_nvml_and_by_atomics() {
        for probe in [two_gpus(true, true, Some(true)), two_gpus(true, true, None)] {
            let facts = local_rank_facts_with(&probe, "n0", 2, 2).expect("facts");
            assert_eq!(facts[0].nvlink_peers, vec!["GPU-b".to_owned()]);
            assert_eq!(facts[1].p2p_peers, vec!["GPU-a".to_owned()]);
            assert_eq!(level(&facts, 0, 1), Some(DistanceLevel::NvLink));
        }
        let links = probe_links(&two_gpus(true, true, None), 0).expect("links");
        assert_eq!(links[0].evidence, NvlinkEvidence::NativeAtomics);
        // NVML says no NVLink although atomics work: NVML wins, the pair is PCIe.
        let facts = local_rank_facts_with(&two_gpus(true, true, Some(false)), "n0", 2, 2).expect("facts");
        assert_eq!(level(&facts, 0, 1), Some(DistanceLevel::Pcie));
    }

    #[test]
    fn two_gpus_pcie_and_without_p2p() {
        let facts = local_rank_facts_with(&two_gpus(true, false, None), "n0", 2, 2).expect("facts");
        assert_eq!(level(&facts, 0, 1), Some(DistanceLevel::Pcie));
        // No peer access: NVML's link report does not matter, the pair cannot use it.
        let probe = two_gpus(false, false, Some(true));
        let links = probe_links(&probe, 1).expect("links");
        assert!(!links[0].nvlink);
        assert_eq!(links[0].evidence, NvlinkEvidence::NoP2p);
        let facts = local_rank_facts_with(&probe, "n0", 2, 2).expect("facts");
        assert!(facts[0].p2p_peers.is_empty() && facts[0].nvlink_peers.is_empty());
        assert_eq!(level(&facts, 0, 1), Some(DistanceLevel::SameNodeNoP2p));
    }

    #[test]
    fn ranks_sharing_a_gpu_and_two_hosts() {
        let probe = two_gpus(true, true, Some(true));
        // Three ranks on two GPUs: ranks 0 and 2 share GPU 0.
        let facts = local_rank_facts_with(&probe, "n0", 3, 2).expect("facts");
        assert_eq!(level(&facts, 0, 2), Some(DistanceLevel::SameGpu));
        assert_eq!(level(&facts, 1, 2), Some(DistanceLevel::NvLink));
        // Two hosts, one GPU each, both reporting the same (per-host) UUIDs of their own GPU.
        let on = |host: &str, uuid: &str| facts_from_links(host, uuid, &[], None);
        let facts = vec![on("n0", "GPU-n0"), on("n1", "GPU-n1")];
        // No fabric, no Slurm: both hosts sit in one unknown spine.
        assert_eq!(level(&facts, 0, 1), Some(DistanceLevel::Spine));
        let placed = |host: &str, rack: &str| {
            let mut f = on(host, &format!("GPU-{host}"));
            f.placement = Some(Placement { cluster: "c".into(), spine: Some("s".into()), leaf: Some("l".into()), rack: Some(rack.into()) });
            f
        };
        assert_eq!(level(&[placed("n0", "r0"), placed("n1", "r0")], 0, 1), Some(DistanceLevel::Rack));
        assert_eq!(level(&[placed("n0", "r0"), placed("n1", "r1")], 0, 1), Some(DistanceLevel::Leaf));
    }

    fn fabric(cluster: u8, clique: u32) -> FabricInfo {
        FabricInfo { cluster_uuid: [cluster; 16], clique_id: clique, state: FabricInfo::STATE_COMPLETED, status: 0 }
    }

    #[test]
    fn fabric_info_gives_a_domain_only_when_registered() {
        let d = fabric(0xab, 7).domain().expect("completed, success, named");
        assert_eq!((d.cluster_uuid.len(), &d.cluster_uuid[..4], d.clique_id), (32, "abab", 7));
        assert_eq!(FabricInfo { state: 2, ..fabric(1, 0) }.domain(), None, "in progress");
        assert_eq!(FabricInfo { state: 0, ..fabric(1, 0) }.domain(), None, "not supported");
        assert_eq!(FabricInfo { status: 3, ..fabric(1, 0) }.domain(), None, "registration failed");
        assert_eq!(fabric(0, 0).domain(), None, "zero cluster UUID: no fabric");
        assert!(fabric(0, 0).to_string().starts_with("no NVLink fabric"));
        // The probe's fabric info lands in the facts.
        let probe = FakeProbe { fabric: Some(fabric(9, 1)), ..two_gpus(true, true, Some(true)) };
        let facts = local_rank_facts_with(&probe, "n0", 2, 2).expect("facts");
        assert_eq!(facts[0].nvlink_domain.as_ref().map(|d| d.clique_id), Some(1));
    }

    /// Multi-node NVLink: GPUs of one fabric cluster and clique are NVLink apart on different
    /// hosts; another clique, or a PE that reports no domain, is not; on one host the node's own
    /// link discovery decides (no peer access stays no peer access).
    #[test]
    fn nvlink_domain_spans_hosts() {
        let on = |host: &str, g: usize, domain: Option<FabricInfo>, p2p: bool| {
            let probe = FakeProbe { fabric: domain, ..two_gpus(p2p, p2p, Some(p2p)) };
            let mut f = local_rank_facts_with(&probe, host, 2, 2).expect("facts").swap_remove(g);
            f.gpu_uuid = format!("{host}-{}", f.gpu_uuid);
            f.nvlink_peers = f.nvlink_peers.iter().map(|u| format!("{host}-{u}")).collect();
            f.p2p_peers = f.p2p_peers.iter().map(|u| format!("{host}-{u}")).collect();
            f
        };
        let d = Some(fabric(5, 1));
        let facts = vec![
            on("a", 0, d, true),
            on("a", 1, d, true),
            on("b", 0, d, true),
            on("c", 0, Some(fabric(5, 2)), true),
            on("d", 0, None, true),
            on("e", 0, d, false),
            on("e", 1, d, false),
        ];
        assert_eq!(level(&facts, 0, 1), Some(DistanceLevel::NvLink), "same host, NVLink by NVML");
        assert_eq!(level(&facts, 0, 2), Some(DistanceLevel::NvLink), "another host, one domain");
        assert_eq!(level(&facts, 1, 2), Some(DistanceLevel::NvLink));
        assert_eq!(level(&facts, 0, 3), Some(DistanceLevel::Spine), "another clique");
        assert_eq!(level(&facts, 0, 4), Some(DistanceLevel::Spine), "no domain reported");
        assert_eq!(level(&facts, 0, 5), Some(DistanceLevel::NvLink), "host e is in the domain");
        assert_eq!(level(&facts, 5, 6), Some(DistanceLevel::SameNodeNoP2p), "same host without peer access");
        let text = serde_json::to_string(&facts[2]).expect("serialise");
        assert!(text.contains("nvlink_domain"));
        assert_eq!(serde_json::from_str::<PeFacts>(&text).ok().as_ref(), Some(&facts[2]));
    }

    #[test]
    fn uuid_and_pci_formats() {
        let b: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(format_uuid(&b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(PciAddr::parse("0000:18:00.0"), Some(PciAddr { domain: 0, bus: 0x18, device: 0 }));
        assert_eq!(PciAddr::parse("00000001:9A:1f.0"), Some(PciAddr { domain: 1, bus: 0x9a, device: 0x1f }));
        assert_eq!(PciAddr::parse("junk"), None);
        assert!(!hostname().is_empty());
    }

    #[test]
    fn facts_round_trip_as_json() {
        let f = facts_from_links("n0", "GPU-a", &probe_links(&two_gpus(true, true, None), 0).expect("links"), None);
        let text = serde_json::to_string(&f).expect("serialise");
        assert_eq!(serde_json::from_str::<PeFacts>(&text).ok(), Some(f));
    }
}
