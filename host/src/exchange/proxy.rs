//! NVSHMEM's proxy thread and the thread that launches the halo kernels (docs/protocol.md,
//! "Launch overhead between PEs").
//!
//! Every NVSHMEM PE runs a proxy thread that busy-polls for requests of the remote transport. On one
//! node with no remote transport it has nothing to do, and `halo launch` turns it off
//! (`NVSHMEM_DISABLE_LOCAL_ONLY_PROXY=1`, see [`disable_idle_proxy_by_default`]). Where it must run, it
//! should not share a CPU (or its SMT sibling) with the thread that submits the kernels, whose
//! submission rate bounds the exchange's step time: [`keep_launcher_off_proxy`] moves that thread
//! off the CPUs NVSHMEM pinned its own threads to.

use std::collections::BTreeSet;

/// Set it to `0` to leave the launching thread's CPU affinity alone.
pub const ENV_PIN_LAUNCHER: &str = "HALO_PIN_LAUNCHER";

/// NVSHMEM's switch for its proxy thread when only NVLink peers exist.
pub const ENV_DISABLE_LOCAL_ONLY_PROXY: &str = "NVSHMEM_DISABLE_LOCAL_ONLY_PROXY";

/// Whether NVSHMEM's proxy may be turned off: its remote transport is `none` (the value
/// `NVSHMEM_REMOTE_TRANSPORT` has when this is called) and the user did not decide either way.
pub fn proxy_can_be_disabled(remote_transport: Option<&str>, user_choice: Option<&str>) -> bool {
    user_choice.is_none() && remote_transport.is_some_and(|t| t.trim().eq_ignore_ascii_case("none"))
}

/// Sets `NVSHMEM_DISABLE_LOCAL_ONLY_PROXY=1` when [`proxy_can_be_disabled`]: with no remote
/// transport, NVSHMEM then starts no proxy thread (losing only device-side `wait_until` timeouts and
/// device global exit, which halo does not use: its waits have their own bounds). Returns whether
/// it set it.
///
/// # Safety
/// Call before this process starts any thread that reads the environment (before NVSHMEM init).
pub unsafe fn disable_idle_proxy_by_default() -> bool {
    let transport = std::env::var("NVSHMEM_REMOTE_TRANSPORT").ok();
    let user = std::env::var(ENV_DISABLE_LOCAL_ONLY_PROXY).ok();
    if !proxy_can_be_disabled(transport.as_deref(), user.as_deref()) {
        return false;
    }
    // SAFETY: the caller's contract.
    unsafe { std::env::set_var(ENV_DISABLE_LOCAL_ONLY_PROXY, "1") };
    true
}

/// This process's threads (`/proc/self/task`); empty where that is unavailable.
pub fn threads() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut out: Vec<i32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    out.sort_unstable();
    out
}

/// The CPUs thread `tid` may run on (0: the calling thread).
fn affinity(tid: i32) -> Option<BTreeSet<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        Some((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// Restricts the calling thread to `cpus`.
fn set_affinity(cpus: &BTreeSet<usize>) -> bool {
    // SAFETY: builds a valid set of CPUs below CPU_SETSIZE; affects only the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(text: &str) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|n| n.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => {
                out.insert(a);
            }
            (Some(Ok(a)), Some(Ok(b))) if a <= b => out.extend(a..=b),
            _ => {}
        }
    }
    out
}

/// `cpu` and its SMT siblings.
fn siblings(cpu: usize) -> BTreeSet<usize> {
    let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
    let mut out = std::fs::read_to_string(path).map(|t| parse_cpu_list(&t)).unwrap_or_default();
    out.insert(cpu);
    out
}

/// The CPUs the launching thread should keep: `mine` without the proxy threads' CPUs and their
/// siblings. `None` when that changes nothing or would leave nothing.
pub fn launcher_cpus(mine: &BTreeSet<usize>, proxy_cpus: &BTreeSet<usize>, siblings: impl Fn(usize) -> BTreeSet<usize>) -> Option<BTreeSet<usize>> {
    let busy: BTreeSet<usize> = proxy_cpus.iter().flat_map(|&c| siblings(c)).collect();
    let keep: BTreeSet<usize> = mine.difference(&busy).copied().collect();
    (!keep.is_empty() && keep.len() < mine.len()).then_some(keep)
}

/// After NVSHMEM's initialisation: the threads that appeared since `before` (a [`threads`] list
/// taken just before it) and that run pinned to a single CPU are NVSHMEM's (its proxy); the calling
/// thread, which launches the kernels, is moved off those CPUs and their SMT siblings when others
/// remain. Returns what it did, for the log; `None` when nothing was pinned or
/// [`ENV_PIN_LAUNCHER`] is `0`.
pub fn keep_launcher_off_proxy(before: &[i32]) -> Option<String> {
    if std::env::var(ENV_PIN_LAUNCHER).is_ok_and(|v| v.trim() == "0") {
        return None;
    }
    let proxy_cpus: BTreeSet<usize> =
        threads().into_iter().filter(|t| before.binary_search(t).is_err()).filter_map(affinity).filter(|cpus| cpus.len() == 1).flatten().collect();
    if proxy_cpus.is_empty() {
        return None;
    }
    let mine = affinity(0)?;
    let keep = launcher_cpus(&mine, &proxy_cpus, siblings)?;
    set_affinity(&keep).then(|| {
        format!("NVSHMEM pinned a thread to CPU {proxy_cpus:?}: the launching thread now runs on the {} other CPUs of its {}", keep.len(), mine.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[usize]) -> BTreeSet<usize> {
        v.iter().copied().collect()
    }

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), set(&[0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list("5"), set(&[5]));
        assert_eq!(parse_cpu_list(""), set(&[]));
        assert_eq!(parse_cpu_list("x,3-1,2"), set(&[2]));
    }

    #[test]
    fn the_launcher_leaves_the_proxy_core_and_its_sibling() {
        // 4 cores with SMT: CPU c and c + 4 share a core.
        let smt = |c: usize| set(&[c % 4, c % 4 + 4]);
        let mine = set(&[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(launcher_cpus(&mine, &set(&[5]), smt), Some(set(&[0, 2, 3, 4, 6, 7])));
        // Nothing to change, or nothing left: leave the affinity alone.
        assert_eq!(launcher_cpus(&set(&[0, 2]), &set(&[5]), smt), None);
        assert_eq!(launcher_cpus(&set(&[1, 5]), &set(&[1]), smt), None);
    }

    #[test]
    fn the_proxy_is_disabled_only_without_a_remote_transport_and_without_a_user_choice() {
        assert!(proxy_can_be_disabled(Some("none"), None));
        assert!(proxy_can_be_disabled(Some(" NONE"), None));
        assert!(!proxy_can_be_disabled(Some("ucx"), None));
        assert!(!proxy_can_be_disabled(None, None), "NVSHMEM's default transport is IBRC");
        assert!(!proxy_can_be_disabled(Some("none"), Some("0")), "the user decided");
    }

    #[test]
    fn this_process_has_threads_and_an_affinity() {
        assert!(!threads().is_empty());
        assert!(affinity(0).is_some_and(|c| !c.is_empty()));
    }
}
