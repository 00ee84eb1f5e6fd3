//! The `halo` command. See `halo --help` and docs/running.md.

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    halo_cli::crash::install();
    halo_cli::cli::main()
}

/// glibc returns large freed blocks to the kernel (`munmap`, heap trimming), so every MD search
/// step, which rebuilds arrays of the same sizes, paid fresh page faults for them (a third of the
/// halo plan's time at 45,000 atoms). Keep freed memory in the process instead: allocations above
/// 256 MiB still get their own mapping, and the heap is trimmed only above 1 GiB free.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: plain allocator tuning at start-up, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}
