//! What this process can tell about the machine it runs on, for every layer: its host name, the
//! identity of its running kernel (two processes with the same boot id share host memory), and the
//! folder where node-local files shared between processes go.

use std::path::{Path, PathBuf};

/// This machine's host name (`gethostname`), or `localhost` when it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for the length passed; gethostname NUL-terminates within it when
    // the name fits (it may not terminate on truncation, handled by the bounded search below).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len() - 1);
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_owned();
    if name.is_empty() { "localhost".into() } else { name }
}

/// What identifies this machine's running kernel: two processes with the same boot id share host
/// memory. The host name where the kernel does not say.
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map_or_else(|_| hostname(), |s| s.trim().to_string())
}

/// Where files that the processes of one node share go (the PE mailboxes, the node gather's
/// segments): `/dev/shm` (memory) when it is there, the temporary folder otherwise.
pub(crate) fn shared_folder() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_node_facts_are_never_empty() {
        assert!(!super::hostname().is_empty());
        assert!(!super::boot_id().is_empty());
        assert!(super::shared_folder().is_dir());
    }
}
