//! A stream held on purpose (a slow rank): [`Gate`], shared by the GPU test binaries that hold a
//! rank back past its peers' wait deadlines (`gpu_exchange`, `gpu_pes`).

use halo::gpu::DeviceMemory;

/// Holds a stream at a one-thread kernel spinning on a flag until the host opens it, so the
/// launches queued behind it start late (a slow rank, on purpose).
///
/// The flag lives in page-locked host memory that the GPU reads directly, and the host opens the
/// gate with a plain store: no copy that the GPU would have to run. A copy (on the legacy default
/// stream, as `copy_from_host` does) is work in one of the driver's hardware queues, which streams
/// share once a process has more streams than queues, and there it could wait behind a launch of
/// the exchange that itself waits, through its peers, for the gated rank: the gate would then open
/// only when a device deadline broke that cycle, and the test would fail for its own harness.
pub struct Gate {
    flag: *mut u64,
    _answer: halo::gpu::DeviceBuffer<u64>,
    status: halo::gpu::DeviceBuffer<halo::abi::WaitStatus>,
}

impl Gate {
    pub fn close(module: &halo::gpu::KernelModule, stream: &halo::gpu::CudaStream) -> Self {
        use cudarc::driver::sys;
        use halo::gpu::DeviceBuffer;
        let ctx = module.context();
        let (answer, status) = (DeviceBuffer::<u64>::zeroed(ctx, 1).unwrap(), DeviceBuffer::zeroed(ctx, 1).unwrap());
        ctx.bind_to_thread().unwrap();
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut own = 0u64;
        // SAFETY: allocates 8 bytes of page-locked host memory (mapped for the device: cuMemAllocHost
        // memory is), zeroes it before the kernel is launched, and asks for its device address.
        unsafe {
            sys::cuMemAllocHost_v2(&mut host, size_of::<u64>()).result().unwrap();
            std::ptr::write_volatile(host.cast::<u64>(), 0);
            sys::cuMemHostGetDevicePointer_v2(&mut own, host, 0).result().unwrap();
        }
        let (mut peer, mut rounds, mut initiator) = (answer.device_ptr(), 1u32, 0u32);
        let (mut timeout, mut st) = (20_000_000_000u64, status.device_ptr());
        let mut args = halo::kernel_args![own, peer, rounds, initiator, timeout, st];
        let shape = halo::gpu::LaunchShape { grid: (1, 1), block: 1, shared_bytes: 0 };
        // SAFETY: arguments match `signal_ping_pong`; the flag and the two buffers outlive the
        // kernel (the flag is freed by `check`, after the test waited for every stream; a test
        // that fails before leaves it allocated).
        unsafe { module.launch(halo::abi::SIGNAL_PING_PONG, shape, stream, &mut args) }.unwrap();
        Self { flag: host.cast(), _answer: answer, status }
    }

    pub fn open(&self) {
        // SAFETY: the flag is live page-locked memory (freed only by `check`); the kernel reads
        // it with system-scope loads, which see this store.
        unsafe { std::ptr::write_volatile(self.flag, 1) };
    }

    /// After the test waited for every stream: the gate kernel did not time out; frees the flag.
    pub fn check(self) {
        assert_eq!(self.status.to_host().unwrap()[0].timed_out, 0, "the gate kernel timed out");
        // SAFETY: allocated by cuMemAllocHost in `close`; the kernel that read it has ended.
        unsafe { cudarc::driver::sys::cuMemFreeHost(self.flag.cast()) }.result().unwrap();
    }
}
