//! The PTX must contain every kernel, and each device wrapper must still lower to the instruction
//! its contract names: a silent change of memory ordering or scope fails here, without a GPU.
//! Needs the PTX (`cargo xtask build-ptx`; `cargo xtask test` builds it first).

use halo::abi;
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use std::collections::HashMap;

fn artifacts() -> KernelArtifacts {
    KernelArtifacts::locate(DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"))
}

/// Entry name -> its PTX body (up to the next entry or function).
fn entries(ptx: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut current: Option<(String, String)> = None;
    for line in ptx.lines() {
        let starts_entry = line.contains(".entry ");
        let starts_func = line.contains(".func ");
        if starts_entry || starts_func {
            if let Some((name, body)) = current.take() {
                out.insert(name, body);
            }
            if starts_entry {
                let name = line.split(".entry ").nth(1).unwrap_or("").trim().trim_end_matches('(').to_string();
                current = Some((name, String::new()));
            }
            continue;
        }
        if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((name, body)) = current {
        out.insert(name, body);
    }
    out
}

fn ptx_text() -> String {
    let a = artifacts();
    String::from_utf8(a.ptx().expect("reading the PTX").into_owned()).expect("PTX is text")
}

#[track_caller]
fn assert_lowers(bodies: &HashMap<String, String>, kernel: &str, instructions: &[&str]) {
    let body = bodies.get(kernel).unwrap_or_else(|| panic!("kernel {kernel} missing from the PTX"));
    for ins in instructions {
        assert!(body.contains(ins), "{kernel} no longer contains `{ins}`");
    }
}

#[test]
fn every_kernel_entry_exists_and_nothing_else() {
    let bodies = entries(&ptx_text());
    let mut found: Vec<_> = bodies.keys().cloned().collect();
    found.sort();
    let mut listed: Vec<_> = abi::KERNEL_ENTRIES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed);
}

#[test]
fn module_targets_hopper_and_keeps_its_globals() {
    let ptx = ptx_text();
    assert!(ptx.contains(".target sm_90"), "PTX not built for sm_90");
    assert!(ptx.contains(".version 8.0"), "PTX ISA is not 8.0");
    for global in ["HALO_ABI_VERSION", "nvshmemi_device_state_d", "nvshmemi_device_lib_version_d"] {
        assert!(ptx.lines().any(|l| l.starts_with(".visible") && l.contains(global)), "{global} not exported");
    }
}

#[track_caller]
fn assert_absent(bodies: &HashMap<String, String>, kernel: &str, instructions: &[&str]) {
    let body = bodies.get(kernel).unwrap_or_else(|| panic!("kernel {kernel} missing from the PTX"));
    for ins in instructions {
        assert!(!body.contains(ins), "{kernel} now contains `{ins}`");
    }
}

/// The instructions of a PTX body in order, each without its predicate guard (`@%p1`), comment
/// or `;`: directives (`.reg`, `.param`, ...), labels and braces left out.
fn instructions(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in body.lines() {
        let code = line.split("//").next().unwrap_or("");
        for stmt in code.split(';') {
            let mut s = stmt.trim().trim_start_matches(['{', '}']).trim();
            if let Some(rest) = s.strip_prefix('@') {
                s = rest.split_once(char::is_whitespace).map_or("", |(_, ins)| ins.trim());
            }
            if s.is_empty() || s.starts_with('.') || s.starts_with(')') || s.ends_with(':') {
                continue;
            }
            out.push(s.to_string());
        }
    }
    out
}

/// Whether `ins` may touch global memory: a load, store, atomic, reduction, bulk copy or
/// prefetch in the global or the generic state space (a generic address may be global), or a
/// call (its callee may). `.param`, `.shared`, `.local` and `.const` accesses do not.
fn touches_global_memory(ins: &str) -> bool {
    let opcode = ins.split_whitespace().next().unwrap_or("");
    let mut parts = opcode.split('.');
    let base = parts.next().unwrap_or("");
    if base.starts_with("call") {
        return true;
    }
    if !["ld", "ldu", "st", "atom", "red", "cp", "prefetch", "prefetchu", "multimem"].contains(&base) {
        return false;
    }
    let spaces: Vec<&str> = parts.collect();
    if spaces.contains(&"global") {
        return true;
    }
    !spaces.iter().any(|p| ["param", "shared", "local", "const"].iter().any(|s| p.starts_with(s)))
}

/// `kernel` waits for the kernel it may overlap (`griddepcontrol.wait`) before its first access
/// to global or generic memory (any [`touches_global_memory`] instruction), in instruction order.
#[track_caller]
fn assert_nothing_touches_memory_before_the_wait(kernel: &str, body: &str) {
    let ins = instructions(body);
    let wait =
        ins.iter().position(|i| i.starts_with("griddepcontrol.wait")).unwrap_or_else(|| panic!("{kernel} never waits for the previous kernel"));
    if let Some(early) = ins[..wait].iter().find(|i| touches_global_memory(i)) {
        panic!("{kernel} touches memory before it waits for the previous kernel: `{early}`");
    }
}

/// `kernel` loads low-latency words, each with a relaxed system-scope 8-byte load (the tag
/// `// ll word` marks the word wrapper's instruction in the PTX).
#[track_caller]
fn assert_word_loads(bodies: &HashMap<String, String>, kernel: &str) {
    let body = bodies.get(kernel).unwrap_or_else(|| panic!("kernel {kernel} missing from the PTX"));
    let words: Vec<&str> = body.lines().filter(|l| l.contains("// ll word")).map(str::trim).collect();
    assert!(!words.is_empty(), "{kernel} loads no low-latency words");
    for w in words {
        assert!(w.starts_with("ld.relaxed.sys.global.u64 "), "{kernel}: a word load lowers to `{w}`");
    }
}

#[test]
fn the_instruction_scan_sees_every_early_memory_access() {
    // The check above must be able to fail: each kind of access before the wait is caught,
    // whatever its position on the line, and the harmless ones are not.
    let wait = "\tgriddepcontrol.wait;\n\tld.global.u32 %r1, [%rd1];\n";
    for early in [
        "st.global.u32 [%rd1], %r2;",
        "@%p1 st.relaxed.sys.global.u64 [%rd1], %rd2;",
        "atom.global.add.u32 %r3, [%rd1], 1;",
        "red.relaxed.gpu.global.add.f32 [%rd1], %f1;",
        "ld.u64 %rd3, [%rd2];",
        "st.b64 [%rd4], %rd8;",
        "mov.b64 %rd1, %rd2; ld.volatile.u32 %r1, [%rd1];",
        "cp.async.bulk.global.shared::cta.bulk_group [%rd1], [%r1], 16;",
        "call.uni f, ();",
    ] {
        let body = format!("\tmov.u32 %r9, %tid.x;\n\t{early}\n{wait}");
        let caught = std::panic::catch_unwind(|| assert_nothing_touches_memory_before_the_wait("k", &body));
        assert!(caught.is_err(), "`{early}` before the wait went unnoticed");
    }
    let fine = format!(
        "\tld.param.b64 %rd1, [k_param_0];\n\tcvta.to.global.u64 %rd2, %rd1;\n\tst.shared.u32 [%r1], 0;\n\tld.const.b32 %r2, [s+32];\n\
         \t{{ // callseq\n\t.param .b64 param0;\n\t}}\n$L__BB0_1:\n{wait}"
    );
    assert_nothing_touches_memory_before_the_wait("k", &fine);
}

/// Issue 39, defect 7 (`fence_before_put_credit`): a credit that goes by NVSHMEM put (the
/// per-pulse put kernel's, at its start and at the end of the launch) releases the reads of the
/// data it frees with a `fence.acq_rel.sys` of its own before `nvshmem_fence` (whose `membar.sys`
/// NVSHMEM promises only for the ordering of puts) and the put.
#[test]
fn fence_before_put_credit() {
    let b = entries(&ptx_text());
    for sfx in ["", "_f32", "_f64", "_f32x4"] {
        let k = format!("{}{sfx}", abi::PULSE_PACK_PUT_SIGNAL);
        let ins = instructions(&b[&k]);
        let fences: Vec<usize> = ins.iter().enumerate().filter(|(_, i)| i.starts_with("fence.acq_rel.sys")).map(|(n, _)| n).collect();
        // One before the credit of the previous launch, one before the end-of-launch credit.
        assert!(fences.len() >= 2, "{k}: {} `fence.acq_rel.sys` before its put credits", fences.len());
        for at in fences {
            // Then nvshmem_fence (its membar.sys, the transfer fence's call before it), then the
            // 8-byte put: a store for a mapped PE or the transport's call.
            let rest = &ins[at + 1..];
            let membar = rest.iter().position(|i| i.starts_with("membar.sys")).unwrap_or_else(|| panic!("{k}: no nvshmem_fence after the fence"));
            assert!(
                rest[..membar].iter().all(|i| !touches_global_memory(i) || i.contains("nvshmemi_transfer_fence")),
                "{k}: memory access between the fence and nvshmem_fence"
            );
            let put = rest[membar + 1..]
                .iter()
                .find(|i| touches_global_memory(i) && !i.starts_with("ld"))
                .unwrap_or_else(|| panic!("{k}: no put after the fence"));
            assert!(
                put.starts_with("st.b64") || put.contains("nvshmemi_transfer_rma_p"),
                "{k}: the fence is followed by `{put}`, not the credit's put"
            );
        }
    }
}

/// The bounded wait (`wait_signal`): a relaxed system-scope spin, `%globaltimer` and the timeout
/// flag (a relaxed GPU-scope load) looked at between batches of polls, one acquire re-read at the
/// end, and the CAS that reports a timeout.
const WAIT: &[&str] =
    &["ld.relaxed.sys.global.u64", "ld.acquire.sys.global.u64", "%globaltimer", "ld.relaxed.gpu.global.u32", "atom.relaxed.gpu.global.cas.b32"];

/// No full fence on the signalling path of the kernels that only store to mapped peers (the
/// put-path kernels contain NVSHMEM's `membar.sys`, off the direct path).
const NO_FULL_FENCE: &[&str] = &["fence.acq_rel.sys", "fence.sc.sys", "membar.sys", "membar.gl"];

#[test]
fn signalling_wrappers_keep_their_memory_order() {
    let b = entries(&ptx_text());
    // Last-block election, release signal to the peer, the bounded wait, block barriers.
    for k in [abi::FUSED_COORDS, abi::PULSE_PACK_STORE_SIGNAL, abi::FUSED_COORDS_TMA, abi::FUSED_FORCES] {
        assert_lowers(&b, k, &["atom.acq_rel.gpu.global.inc.u32", "st.release.sys.global.u64"]);
        assert!(b[k].contains("bar.sync") || b[k].contains("bar.red.or.pred"), "{k}: no block barrier");
        assert_lowers(&b, k, WAIT);
    }
    // The coordinate credit gates the writes into the peer: the block votes on thread 0's wait
    // (a barrier with an OR), and a credit that did not come writes nothing there. The per-pulse
    // kernels vote three times (the credit, the last block's election, its signal decision), the
    // bulk kernel once (the credit).
    let votes = |k: &str| b[k].matches("bar.red.or.pred").count();
    for sfx in ["", "_f32", "_f64", "_f32x4"] {
        for k in [abi::PULSE_PACK_STORE_SIGNAL, abi::PULSE_PACK_PUT_SIGNAL] {
            assert_eq!(votes(&format!("{k}{sfx}")), 3, "{k}{sfx}: block votes");
        }
        assert_eq!(votes(&format!("{}{sfx}", abi::FUSED_COORDS_TMA)), 1, "fused_coords_tma{sfx}: the credit's vote");
    }
    for k in [abi::PULSE_PACK_STORE_SIGNAL, abi::FUSED_COORDS_TMA, abi::SIGNAL_PING_PONG] {
        assert_absent(&b, k, NO_FULL_FENCE);
    }
    // Dependency pass: block-wide vote with a barrier.
    assert_lowers(&b, abi::FUSED_COORDS, &["bar.red.or.pred"]);
    // Reverse chain: per-pulse completion counters waited for with a relaxed spin and one acquire,
    // forces pushed with 16-byte stores, accumulated with atomics.
    assert_lowers(
        &b,
        abi::FUSED_FORCES,
        &[
            "atom.acq_rel.gpu.global.add.u32",
            "ld.relaxed.gpu.global.u32",
            "ld.acquire.gpu.global.u32",
            "st.global.v4.b32",
            "red.relaxed.gpu.global.add.f32",
            "st.release.sys.global.u64",
        ],
    );
    assert_lowers(&b, "fused_forces_f64", &["red.relaxed.gpu.global.add.f64"]);
    // Low-latency words between mapped peers: one strong 8-byte store per word, and the word
    // loads themselves (their wrapper tags them `// ll word`: a signal wait's spin lowers to the
    // same instruction) relaxed too (the flag rides in the same word: no fence, no acquire on
    // that path).
    for base in [abi::FUSED_COORDS, abi::FUSED_FORCES] {
        for sfx in ["", "_f32", "_f64", "_f32x4"] {
            let k = format!("{base}{sfx}");
            assert_lowers(&b, &k, &["st.relaxed.sys.global.u64"]);
            assert_word_loads(&b, &k);
        }
    }
    // The fused kernels may overlap the kernel before them: they wait for it before anything
    // else, and let the next one start its blocks.
    for base in [abi::FUSED_COORDS, abi::FUSED_FORCES] {
        for sfx in ["", "_f32", "_f64", "_f32x4", "_timeline"] {
            let k = format!("{base}{sfx}");
            assert_lowers(&b, &k, &["griddepcontrol.launch_dependents"]);
            assert_nothing_touches_memory_before_the_wait(&k, &b[&k]);
        }
    }
    // The MD step's local-stream kernels (every nbnxm design's forces, forces with energy and
    // prune, and the integrator) may be launched to overlap the kernel before them: each waits
    // for it before anything else. They let no kernel after them start early.
    let step_kernels = abi::NBNXM_KERNELS.iter().flatten().copied().chain([abi::LEAPFROG, abi::LEAPFROG_ENERGY]);
    for k in step_kernels {
        let body = b.get(k).unwrap_or_else(|| panic!("kernel {k} missing from the PTX"));
        assert_nothing_touches_memory_before_the_wait(k, body);
        assert_absent(&b, k, &["griddepcontrol.launch_dependents"]);
    }
    // And so does every other kernel that waits for the kernel before it.
    for (k, body) in &b {
        if body.contains("griddepcontrol.wait") {
            assert_nothing_touches_memory_before_the_wait(k, body);
        }
    }
    // The kernels that send plain values behind a release signal store no words.
    for k in [abi::FUSED_COORDS_TMA, abi::PULSE_PACK_STORE_SIGNAL] {
        assert_absent(&b, k, &["st.relaxed.sys.global.u64"]);
    }
    assert_lowers(&b, abi::UNPACK_ACCUMULATE, &["red.relaxed.gpu.global.add.f32"]);
    assert_lowers(&b, abi::PACK_SUBSET, &["red.relaxed.gpu.global.add.u32"]);
}

#[test]
fn the_latency_probe_uses_the_exchange_wait() {
    // `signal_ping_pong` calls the same `wait_signal` as the exchange kernels: the same
    // instructions, and nothing the exchange's wait does not do.
    let b = entries(&ptx_text());
    assert_lowers(&b, abi::SIGNAL_PING_PONG, WAIT);
    assert_lowers(&b, abi::SIGNAL_PING_PONG, &["st.release.sys.global.u64"]);
}

#[test]
fn the_delay_kernel_only_reads_the_global_timer() {
    // The jitter's GPU delay: a spin on `%globaltimer`, no memory access at all (it must not
    // disturb the exchange it delays).
    let b = entries(&ptx_text());
    assert_lowers(&b, abi::SPIN_DELAY, &["%globaltimer"]);
    assert_absent(&b, abi::SPIN_DELAY, &["ld.global", "st.global", "atom.", "red."]);
}

#[test]
fn bulk_copy_wrappers_lower_to_hopper_instructions() {
    let b = entries(&ptx_text());
    assert_lowers(
        &b,
        abi::FUSED_COORDS_TMA,
        &[
            "fence.proxy.async.shared::cta;",
            "cp.async.bulk.global.shared::cta.bulk_group",
            "cp.async.bulk.commit_group;",
            "cp.async.bulk.wait_group.read 0;",
            "cp.async.bulk.wait_group 0;",
            "cvta.to.shared.u64",
            "vote.sync.any.pred",
            "bar.warp.sync",
            "%laneid",
            // Warps aggregate their arrival per block in shared memory, then one GPU-scope arrival.
            "atom.acq_rel.cta.shared::cta.add.u32",
            "atom.acq_rel.gpu.global.inc.u32",
            "st.release.sys.global.u64",
        ],
    );
}

/// The instructions of the bulk-copy path (`bulk_pulse`), in whichever kernel runs it.
const BULK: &[&str] = &[
    "fence.proxy.async.shared::cta;",
    "cp.async.bulk.global.shared::cta.bulk_group",
    "cp.async.bulk.commit_group;",
    "cp.async.bulk.wait_group.read 0;",
    "cp.async.bulk.wait_group 0;",
    "atom.acq_rel.cta.shared::cta.add.u32",
];

/// Issue 17: one fused launch mixes paths per pulse. The fused coordinate kernel of every element
/// type holds the three: the stores' block election and release signal, the put path's NVSHMEM
/// calls, and the bulk copies it shares with the TMA kernel (one function, `bulk_pulse`), whose
/// per-pulse branch reads the pulse's `path` word.
#[test]
fn the_fused_kernel_mixes_stores_puts_and_bulk_copies_per_pulse() {
    let b = entries(&ptx_text());
    for sfx in ["", "_f32", "_f64", "_f32x4"] {
        let k = format!("{}{sfx}", abi::FUSED_COORDS);
        assert_lowers(&b, &k, BULK);
        assert_lowers(&b, &k, &["bar.red.or.pred", "st.release.sys.global.u64", "nvshmemi_transfer_put_signal", "nvshmemi_transfer_rma_p"]);
        assert_lowers(&b, &format!("{}{sfx}", abi::FUSED_COORDS_TMA), BULK);
        // The TMA kernel's copy of the body is instantiated without puts.
        assert!(!b[&format!("{}{sfx}", abi::FUSED_COORDS_TMA)].contains("nvshmemi_device_state_d"), "fused_coords_tma{sfx} uses NVSHMEM");
    }
    // The branch reads the path word of the pulse's metadata (offset 132, next to signal_mode at 128).
    assert_eq!(std::mem::offset_of!(abi::PulseMeta, path), 132);
    assert!(b[abi::FUSED_COORDS].contains("+132]"), "fused_coords never reads PulseMeta::path");
    assert!(!b[abi::FUSED_COORDS_TMA].contains("+132]"), "fused_coords_tma branches on the path it does not need");
}

#[test]
fn put_variants_call_nvshmem() {
    let ptx = ptx_text();
    let b = entries(&ptx);
    // Both signalling modes of the put path are reached from every put-path kernel: put+signal
    // (`putmem_signal_nbi_block`), and the fenced put (`putmem_nbi_block`, `nvshmem_fence`, which
    // is a `membar.sys` plus a proxy fence, and `nvshmem_uint64_p`), which also carries credits.
    for k in [abi::PULSE_PACK_PUT_SIGNAL, abi::FUSED_COORDS, abi::FUSED_FORCES] {
        assert_lowers(
            &b,
            k,
            &["nvshmemi_transfer_put_signal", "nvshmemi_transfer_rma_nbi", "nvshmemi_transfer_fence", "membar.sys", "nvshmemi_transfer_rma_p"],
        );
    }
    // And the direct-store-only kernels do not.
    for k in [abi::PULSE_PACK_STORE_SIGNAL, abi::FUSED_COORDS_TMA, abi::PACK_COORDS, abi::SIGNAL_PING_PONG] {
        assert!(!b[k].contains("nvshmemi_device_state_d"), "{k} unexpectedly uses NVSHMEM");
    }
}

#[test]
fn ptxas_reports_no_spills() {
    let a = artifacts();
    let report = a.ptxas_report().expect("reading the ptxas report");
    // Each entry's "Function properties" block is followed by its stack/spill line.
    let mut checked = 0;
    let mut lines = report.lines();
    while let Some(line) = lines.next() {
        if let Some(name) = line.split("Function properties for ").nth(1) {
            let props = lines.next().unwrap_or_default();
            if abi::KERNEL_ENTRIES.contains(&name.trim()) {
                assert!(props.contains("0 bytes spill stores, 0 bytes spill loads"), "{name} spills: {props}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, abi::KERNEL_ENTRIES.len(), "ptxas report lacks some kernels:\n{report}");
}

#[test]
fn nbnxm_kernels_reduce_in_registers_and_add_once_per_cluster() {
    let b = entries(&ptx_text());
    for [forces, energy, prune] in abi::NBNXM_KERNELS {
        // `_pfw` adds its i-forces warp by warp: no barrier before them, an atomic site per
        // i-cluster (8) and the energy's per warp.
        let per_warp = forces.ends_with("_pfw");
        for k in [forces, energy] {
            // Pairs: the fast reciprocal and fused multiply-adds, no IEEE division; the LJ table in
            // shared memory, one 8-byte load per pair of the unrolled i-cluster loop (16 pairs, on
            // the common and the self-cluster-pair path); the i-atoms staged with one 16-byte store
            // per slot and read with one 16-byte load per i-cluster and path; j-list words by ballot
            // and broadcast.
            assert_lowers(&b, k, &["rcp.approx.ftz.f32", "fma.rn.f32", "vote.sync.ballot.b32", "shfl.sync.idx.b32", "st.shared.b32"]);
            assert!(!b[k].contains("div.rn.f32"), "{k}: an IEEE division in the pair loop");
            let count = |ins: &str| b[k].matches(ins).count();
            assert_eq!(count("ld.shared.b64"), 32, "{k}: 8-byte shared loads, not one per pair of both paths");
            assert_eq!(count("ld.shared.v4"), 16, "{k}: 16-byte i-atom loads");
            assert_eq!(count("st.shared.v4"), 1, "{k}: 16-byte staging stores");
            // Two block barriers: after the staging, before the sum of the warps' partial i-forces
            // (`_pfw`: the staging's only).
            assert_eq!(count("bar.sync"), if per_warp { 1 } else { 2 }, "{k}: block barriers");
            // The reductions: 9 butterfly shuffles for a j-cluster's forces over the i-lanes (3
            // components x 3 steps, the first splitting the two j-atoms between even and odd
            // lanes), 48 for the i-forces over the j-lanes (8 i-clusters x 3 components x 2
            // steps), 5 for the energy. No atomic per pair: one atomic site for the j-forces, one
            // for the block's summed i-forces (`_pfw`: one per i-cluster, the warp's sums), one f64
            // add per block (`_pfw`: per warp) for the energy.
            let energy_shuffles = if k == energy { 5 } else { 0 };
            assert_eq!(count("shfl.sync.bfly.b32"), 9 + 48 + energy_shuffles, "{k}: butterfly shuffles");
            assert_eq!(count("red.relaxed.gpu.global.add.f32"), if per_warp { 1 + 8 } else { 2 }, "{k}: force atomic sites");
            // The per-warp sums skip the partials in shared memory: the only 4-byte shared stores
            // are the staging's slot indices and the LJ table's two columns (the block sums add 8
            // per i-cluster's partials, and one for the energy).
            let partial_stores = if per_warp { 0 } else { 8 + usize::from(k == energy) };
            assert_eq!(count("st.shared.b32"), 3 + partial_stores, "{k}: 4-byte shared stores");
            let f64_adds = count("red.relaxed.gpu.global.add.f64");
            assert_eq!(f64_adds, usize::from(k == energy), "{k}: energy atomics (the force-only kernel touches no energy)");
            assert!(!b[k].contains("atom.") && !b[k].contains(".local"), "{k}: another atomic, or local memory");
        }
        // The prune: the kept masks by one OR-reduction per j-cluster, one store site, one barrier
        // (after the staging), no atomics.
        assert_lowers(&b, prune, &["vote.sync.ballot.b32", "shfl.sync.idx.b32", "ld.shared.v4"]);
        let count = |ins: &str| b[prune].matches(ins).count();
        assert_eq!(count("redux.sync.or.b32"), 1, "{prune}");
        assert_eq!(count("bar.sync"), 1, "{prune}");
        assert_eq!(count("st.global"), 1, "{prune}");
        assert_absent(&b, prune, &["red.relaxed", "red.global", "atom.", "shfl.sync.bfly", ".local"]);
    }
}

/// `(registers, stack frame bytes)` of every kernel in the ptxas report.
fn ptxas_resources() -> HashMap<String, (u32, u32)> {
    let report = artifacts().ptxas_report().expect("reading the ptxas report");
    let mut out = HashMap::new();
    let mut current: Option<(String, u32)> = None;
    for line in report.lines() {
        if let Some(name) = line.split("Function properties for ").nth(1) {
            current = Some((name.trim().to_string(), 0));
        } else if let Some(frame) = line.trim().split(" bytes stack frame").next().filter(|_| line.contains("bytes stack frame")) {
            if let Some((_, f)) = current.as_mut() {
                *f = frame.trim().parse().unwrap_or(u32::MAX);
            }
        } else if let Some(regs) = line.split("Used ").nth(1).and_then(|r| r.split(" registers").next())
            && let Some((name, frame)) = current.take()
        {
            out.insert(name, (regs.trim().parse().unwrap_or(u32::MAX), frame));
        }
    }
    out
}

#[test]
fn nbnxm_kernels_fit_registers_without_local_memory() {
    let r = ptxas_resources();
    // No stack frame (an array indexed at run time would land in local memory). Registers: the
    // force kernels at most 80 (24 warps per multiprocessor, what `WarpsPerEntry::auto` assumes),
    // with the energy at most 88, the prune at most 40.
    for [forces, energy, prune] in abi::NBNXM_KERNELS {
        for (k, most) in [(forces, 80), (energy, 88), (prune, 40)] {
            let (regs, frame) = *r.get(k).unwrap_or_else(|| panic!("{k} not in the ptxas report"));
            assert!(regs <= most, "{k}: {regs} registers, more than {most}");
            assert_eq!(frame, 0, "{k}: {frame} bytes of stack frame");
        }
    }
}

/// The timeline probe's stamp (`device::stamp_time` in kernels-gpu): the latest time of a point
/// kept with `max`, the earliest block entry with `min`.
const STAMPS: &[&str] = &["red.relaxed.gpu.global.max.u64", "red.relaxed.gpu.global.min.u64"];

#[test]
fn timeline_stamps_reach_only_the_instrumented_kernels() {
    use halo::abi::timeline as tl;
    let b = entries(&ptx_text());
    let timeline = [tl::FUSED_COORDS_TIMELINE, tl::FUSED_FORCES_TIMELINE];
    for k in abi::KERNEL_ENTRIES.iter().filter(|k| !timeline.contains(k)) {
        assert_absent(&b, k, STAMPS);
    }
    // Every clock read of an exchange kernel belongs to a bounded wait: one `%globaltimer` read per
    // wait site, each with its timeout report (the CAS). The plain fused kernels are the `Off`
    // instantiation of the generic code the probe instruments: a stamp that leaked into them, or a
    // clock read left behind by one, breaks this count.
    let count = |k: &str, ins: &str| b[k].matches(ins).count();
    for base in ["fused_coords", "fused_forces", "fused_coords_tma", "pulse_pack_store_signal", "pulse_pack_put_signal"] {
        for sfx in ["", "_f32", "_f64", "_f32x4"] {
            let k = format!("{base}{sfx}");
            let (clock, cas) = (count(&k, "%globaltimer"), count(&k, "atom.relaxed.gpu.global.cas.b32"));
            assert!(clock > 0 && clock == cas, "{k}: {clock} %globaltimer reads, {cas} timeout reports");
        }
    }
    // The instrumented kernels: the same protocol (election, release signal, bounded wait), the
    // earliest entry kept once, the latest of every other point: entry, end, and the points of a
    // pulse where each path passes them (coordinates: credit, packed x2, dependencies x2,
    // delivered x3, elected, received x2; forces: chain, pushed x2, signalled x2, elected entry,
    // received x2, accumulated, row done).
    for (k, latest) in [(timeline[0], 13), (timeline[1], 12)] {
        assert_lowers(&b, k, &["atom.acq_rel.gpu.global.inc.u32", "st.release.sys.global.u64", "bar.sync"]);
        assert_lowers(&b, k, WAIT);
        assert_eq!(count(k, STAMPS[1]), 1, "{k}: earliest-entry stamps");
        assert_eq!(count(k, STAMPS[0]), latest, "{k}: latest-point stamps");
        assert!(count(k, "%globaltimer") > count(k, "atom.relaxed.gpu.global.cas.b32"), "{k} reads the clock only in its waits");
    }
    assert_lowers(&b, tl::FUSED_COORDS_TIMELINE, &["bar.red.or.pred"]);
    assert_lowers(&b, tl::FUSED_FORCES_TIMELINE, &["st.global.v4.b32", "red.relaxed.gpu.global.add.f32", "ld.acquire.gpu.global.u32"]);
    // The resolution probe reads the clock and writes its result, nothing else.
    assert_lowers(&b, tl::GLOBALTIMER_RESOLUTION, &["%globaltimer", "st.global"]);
    assert_absent(&b, tl::GLOBALTIMER_RESOLUTION, &["atom.", "red.", "ld.global"]);
}

#[test]
fn leapfrog_energy_reduces_per_warp_and_the_plain_update_touches_no_energy() {
    let b = entries(&ptx_text());
    // Kinetic energy: summed per thread, butterfly-reduced per warp, one f64 atomic per warp.
    assert_lowers(&b, abi::LEAPFROG_ENERGY, &["shfl.sync.bfly.b32", "red.relaxed.gpu.global.add.f64"]);
    assert_eq!(b[abi::LEAPFROG_ENERGY].matches("red.relaxed.gpu.global.add.f64").count(), 1);
    for ins in ["red.", "atom.", "shfl."] {
        assert!(!b[abi::LEAPFROG].contains(ins), "the plain leapfrog contains `{ins}`");
    }
    // The ABI: `(x, v, f, inv_mass, n, dt, clear_from, clear_n)`, and `kinetic` for the energy
    // update (the host launches them with exactly these arguments).
    for (k, params) in [(abi::LEAPFROG, 8), (abi::LEAPFROG_ENERGY, 9)] {
        assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), params, "{k}'s parameters");
    }
}

#[test]
fn the_bounded_gathers_are_plain_gathers_with_their_bound_checked() {
    let b = entries(&ptx_text());
    // `inverse_masses` and `types_by_id` (one gather, instantiated for `f32` and `u32`), with the
    // constant each writes for an index past its table: NaN, `u32::MAX`.
    for (k, missing) in [(abi::INVERSE_MASSES, "0f7FC00000"), (abi::TYPES_BY_ID, "-1;")] {
        // A plain table load per atom: no atomics, no shuffles, no shared memory.
        for ins in ["red.", "atom.", "shfl.", ".shared"] {
            assert!(!b[k].contains(ins), "{k} contains `{ins}`");
        }
        // Unsigned compares only: the grid-stride loop's two (entry and back edge) and the
        // index's against the table's length before the table is read (so no index past it,
        // however large, is read). Two global loads: the index, the table entry.
        let unsigned = b[k].matches("setp.ge.u32").count() + b[k].matches("setp.lt.u32").count();
        assert!(unsigned >= 3, "{k}: {unsigned} unsigned compares, the index's bound check missing");
        assert!(!b[k].contains("setp.ge.s32") && !b[k].contains("setp.lt.s32"), "{k}: a signed compare");
        assert!(b[k].contains(missing), "{k}: no `{missing}` constant for an index past the table");
        assert_eq!(b[k].matches("ld.global").count(), 2, "{k}: the index and the table entry, nothing else");
        // The ABI: `(index, n, table, len, out)`.
        assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), 5, "{k}'s parameters");
    }
}

#[test]
fn the_gpu_search_computes_like_the_host_and_compacts_with_a_ballot() {
    let b = entries(&ptx_text());
    for k in [abi::NBNXM_SEARCH_COUNT, abi::NBNXM_SEARCH_WRITE] {
        // The host's f32 arithmetic exactly: separate roundings (no fused multiply-add), an IEEE
        // division and a truncating conversion for the column index.
        assert!(!b[k].contains("fma.rn"), "{k}: a fused multiply-add differs from the host's rounding");
        assert_lowers(&b, k, &["div.rn.f32", "cvt.rzi.u32.f32", "max.f32", "vote.sync.ballot.b32", "bar.warp.sync", "st.shared.b32", "popc.b32"]);
        assert!(!b[k].contains("div.approx"), "{k}: an approximate division");
    }
    // The ABI (14): `(super_bbox, cluster_bbox, super_zone, zones, n_zones, column_start, shifts,
    // n_shifts, n_super, info, rl, rl2, counts)`, and `(.., offsets, j_local, j_nonlocal)` for the
    // write pass: the grid's count comes from the device's `info` word, `n_super` is the bound.
    for (k, params) in [(abi::NBNXM_SEARCH_COUNT, 13), (abi::NBNXM_SEARCH_WRITE, 15)] {
        assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), params, "{k}'s parameters");
    }
}

#[test]
fn the_gpu_grid_wraps_and_bins_like_the_host() {
    let b = entries(&ptx_text());
    // The wrap and the column index in the host's f32 operations: separate roundings (no fused
    // multiply-add anywhere in the grid passes), IEEE divisions, `floor` and the saturating
    // truncation of `as i32`.
    for k in [abi::NBNXM_GRID_BIN, abi::NBNXM_GRID_COLUMNS, abi::NBNXM_GRID_SCATTER, abi::NBNXM_GRID_SORT, abi::NBNXM_GRID_FILL] {
        assert!(!b[k].contains("fma.rn"), "{k}: a fused multiply-add differs from the host's rounding");
        assert!(!b[k].contains("div.approx") && !b[k].contains(".ftz"), "{k}: approximate or flushed arithmetic");
        assert_absent(&b, k, &[".local"]);
    }
    assert_lowers(
        &b,
        abi::NBNXM_GRID_BIN,
        &[
            "div.rn.f32",
            "mul.rn.f32",
            "sub.rn.f32",
            "add.rn.f32",
            "cvt.rmi.f32.f32",
            "cvt.rzi.s32.f32",
            // Counts, the first bad atom and the largest type, each one reduction without a return.
            "red.relaxed.gpu.global.add.u32",
            "red.relaxed.gpu.global.min.u32",
            "red.relaxed.gpu.global.max.u32",
            // The atom's zone (a byte) and its entry among the zones present (a population count).
            "ld.global.b8",
            "popc.b32",
        ],
    );
    // Each supercluster's zone from its first atom's.
    assert_lowers(&b, abi::NBNXM_GRID_FILL, &["ld.global.b8"]);
    // Places claimed with a returning atomic; sorted by rank through a shared tile; the chunk's
    // ranks per warp; the scan by one block.
    assert_lowers(&b, abi::NBNXM_GRID_SCATTER, &["atom.relaxed.gpu.global.add.u32", "st.global.b64"]);
    assert_lowers(&b, abi::NBNXM_GRID_SORT, &["bar.sync", "ld.shared.b64", "setp.lt.u64"]);
    assert_lowers(&b, abi::NBNXM_GRID_FILL, &["bar.warp.sync", "ld.shared.b64", "min.f32", "max.f32"]);
    assert_absent(&b, abi::NBNXM_GRID_FILL, &["bar.sync", "atom.", "red.relaxed", "red.global"]);
    assert_lowers(&b, abi::NBNXM_GRID_COLUMNS, &["bar.sync", "st.shared.b32"]);
    let count = |k: &str, ins: &str| b[k].matches(ins).count();
    // Three wraps (one division each) and two column indices.
    assert_eq!(count(abi::NBNXM_GRID_BIN, "div.rn.f32"), 5, "{}", abi::NBNXM_GRID_BIN);
    assert_eq!(count(abi::NBNXM_GRID_BIN, "cvt.rmi.f32.f32"), 3);
}

#[test]
fn the_gpu_layout_scans_in_shared_memory_without_atomics() {
    let b = entries(&ptx_text());
    // Deterministic: block scans through shared memory (64-bit running sums, no sum can wrap),
    // no atomics, nothing in local memory.
    for k in [abi::NBNXM_LAYOUT_TILES, abi::NBNXM_LAYOUT_SCAN, abi::NBNXM_LAYOUT_WRITE] {
        assert_lowers(&b, k, &["bar.sync", "st.shared.b64", "ld.shared.b64"]);
        assert_absent(&b, k, &["atom.", "red.relaxed", "red.global", ".local"]);
    }
    // One 16-byte store per entry.
    assert_lowers(&b, abi::NBNXM_LAYOUT_WRITE, &["st.global.v4.b32"]);
}

#[test]
fn the_gpu_launch_order_ranks_with_match_any_without_atomics() {
    let b = entries(&ptx_text());
    // Deterministic: a warp's lanes of one key by `match.any` and ranked by a population count, the
    // per-warp counts scanned in shared memory; the tiles' counts by one block scan. No atomics,
    // nothing in local memory.
    for k in [abi::NBNXM_ORDER_TILES, abi::NBNXM_ORDER_WRITE] {
        assert_lowers(&b, k, &["match.any.sync.b32", "popc.b32", "bar.sync", "st.shared.b32", "ld.shared.b32"]);
    }
    assert_lowers(&b, abi::NBNXM_ORDER_SCAN, &["bar.sync", "st.shared.b32", "ld.shared.b32"]);
    for k in [abi::NBNXM_ORDER_TILES, abi::NBNXM_ORDER_SCAN, abi::NBNXM_ORDER_WRITE] {
        assert_absent(&b, k, &["atom.", "red.relaxed", "red.global", ".local"]);
    }
    // Blocks of 1,024 threads launch only with at most 64 registers per thread.
    let r = ptxas_resources();
    for k in [abi::NBNXM_ORDER_TILES, abi::NBNXM_ORDER_SCAN, abi::NBNXM_ORDER_WRITE] {
        let (regs, frame) = *r.get(k).unwrap_or_else(|| panic!("{k} not in the ptxas report"));
        assert!(regs <= 64 && frame == 0, "{k}: {regs} registers, {frame} bytes of stack frame");
    }
}

#[test]
fn the_gpu_migration_wraps_and_assigns_like_the_host_and_compacts_in_order() {
    let b = entries(&ptx_text());
    let passes = [abi::MIGRATE_COUNT, abi::MIGRATE_SCAN, abi::MIGRATE_SCATTER];
    for k in passes {
        // The host's f32 arithmetic exactly: separate roundings, IEEE divisions, nothing flushed;
        // nothing in local memory.
        assert!(!b[k].contains("fma.rn"), "{k}: a fused multiply-add differs from the host's rounding");
        assert!(!b[k].contains("div.approx") && !b[k].contains(".ftz"), "{k}: approximate or flushed arithmetic");
        assert_absent(&b, k, &[".local"]);
    }
    // The wrap (`decomp::wrap_position`: one IEEE division and one floor per coordinate) and the
    // owner (`CellEdges::rank_of`: `x >= threshold`, an ordered f32 comparison), in both passes
    // that decide, so both decide alike; the ranks by ballot and population count.
    for k in [abi::MIGRATE_COUNT, abi::MIGRATE_SCATTER] {
        assert_lowers(
            &b,
            k,
            &[
                "div.rn.f32",
                "mul.rn.f32",
                "sub.rn.f32",
                "add.rn.f32",
                "cvt.rmi.f32.f32",
                "setp.ge.f32",
                "vote.sync.ballot.b32",
                "popc.b32",
                "bar.sync",
            ],
        );
        assert_eq!(b[k].matches("div.rn.f32").count(), 3, "{k}: one division per coordinate");
        assert_eq!(b[k].matches("cvt.rmi.f32.f32").count(), 3, "{k}: one floor per coordinate");
    }
    // Only the first bad atom is an atomic (a min); places come from the scan, never from atomics.
    assert_lowers(&b, abi::MIGRATE_COUNT, &["red.relaxed.gpu.global.min.u32"]);
    let atomics = |k: &str| ["atom.", "red.relaxed", "red.global"].iter().map(|ins| b[k].matches(ins).count()).sum::<usize>();
    assert_eq!(atomics(abi::MIGRATE_COUNT), 1, "{}", abi::MIGRATE_COUNT);
    assert_eq!(atomics(abi::MIGRATE_SCAN) + atomics(abi::MIGRATE_SCATTER), 0);
    assert_lowers(&b, abi::MIGRATE_SCAN, &["bar.sync", "st.shared.b32", "ld.shared.b32"]);
    // The ABI (15, unchanged in 17): `(x, n, geo, block_counts, info)`, `(block_counts, n_blocks, info)` and
    // `(x, v, ids, n, geo, block_starts, x_out, v_out, ids_out, leavers)`.
    for (k, params) in [(abi::MIGRATE_COUNT, 5), (abi::MIGRATE_SCAN, 3), (abi::MIGRATE_SCATTER, 10)] {
        assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), params, "{k}'s parameters");
    }
    let r = ptxas_resources();
    for k in passes {
        let (regs, frame) = *r.get(k).unwrap_or_else(|| panic!("{k} not in the ptxas report"));
        assert!(regs <= 64 && frame == 0, "{k}: {regs} registers, {frame} bytes of stack frame");
    }
}

#[test]
fn the_gpu_merge_places_by_binary_search_without_atomics() {
    let b = entries(&ptx_text());
    let k = abi::MIGRATE_MERGE;
    // Places from two binary searches (a stayer's in the arrivals, an arrival's in the stayers),
    // inlined in the entry (no calls): each a loop halving its range (`shr.u32`) on an unsigned
    // comparison of ids, branch-free inside. No atomics decide a place or set a flag (plain stores
    // of 1), no barriers, nothing in shared or local memory.
    assert_lowers(&b, k, &["shr.u32", "setp.lt.u32", "selp.b32", "st.global.b32", "ld.global.b32"]);
    assert_eq!(b[k].matches("shr.u32").count(), 2, "{k}: one binary search per kind of thread");
    assert_absent(&b, k, &["atom.", "red.", "bar.sync", ".local", ".shared"]);
    assert!(!b[k].lines().any(|l| l.trim_start().starts_with("call")), "{k}: a search is called, not inlined");
    // The order checks: neighbours compared (`<=`), an arrival's found stayer compared (`!=`), the
    // three flags stored as constants.
    assert_lowers(&b, k, &["setp.le.u32", "setp.ne.b32"]);
    assert_eq!(b[k].lines().filter(|l| l.contains("st.global.b32") && l.trim_end().ends_with(", 1;")).count(), 3, "{k}: three flags");
    // The ABI (16): `(stay_ids, stay_x, stay_v, n_stay, arrivals, n_arrivals, ids_out, x_out, v_out, info)`.
    assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), 10, "{k}'s parameters");
    let (regs, frame) = *ptxas_resources().get(k).unwrap_or_else(|| panic!("{k} not in the ptxas report"));
    assert!(regs <= 64 && frame == 0, "{k}: {regs} registers, {frame} bytes of stack frame");
}

#[test]
fn the_gpu_selection_tests_like_the_host_in_f64_and_compacts_in_order() {
    let b = entries(&ptx_text());
    let passes = [abi::SELECT_COUNT, abi::SELECT_SCAN, abi::SELECT_SCATTER];
    for k in passes {
        // No fused multiply-add (the host rounds the square and the sum apart), nothing
        // approximate or flushed, nothing in local memory, no atomics (places come from the scan).
        assert_absent(&b, k, &["fma.rn", "fma.", ".approx", ".ftz", ".local", "atom.", "red.relaxed", "red.global"]);
    }
    // The host's `sent` over `excess2`, in both passes that decide, so both decide alike: per slot
    // and dimension `lo - v` and `v - hi` (`sub.rn.f64`), the larger by an ordered comparison and
    // a select (`max_or_second`; `max.f64` differs where the second is NaN), the larger of that
    // and 0 (`max.f64` with 0, which is `max_or_second` for every input but the sign of a zero
    // result, which the square erases), the square (`mul.rn.f64`), the sum in order
    // (`add.rn.f64`; the first term added to 0.0 is the term), below `rc2` (`setp.lt.f64`).
    for k in [abi::SELECT_COUNT, abi::SELECT_SCATTER] {
        assert_lowers(
            &b,
            k,
            &[
                "cvt.f64.f32",
                "sub.rn.f64",
                "setp.gt.f64",
                "selp.f64",
                "mul.rn.f64",
                "add.rn.f64",
                "setp.lt.f64",
                "vote.sync.ballot.b32",
                "popc.b32",
                "bar.sync",
            ],
        );
        let count = |ins: &str| b[k].matches(ins).count();
        // Three slots of three dimensions (the kernel takes up to three decomposed dimensions).
        assert_eq!(count("cvt.f64.f32"), 3, "{k}: one exact widening per coordinate");
        assert_eq!(count("sub.rn.f64"), 18, "{k}: two differences per slot and dimension");
        assert_eq!((count("setp.gt.f64"), count("selp.f64")), (9, 9), "{k}: the larger difference by comparison and select");
        assert_eq!(count("mul.rn.f64"), 9, "{k}: one square per slot and dimension");
        assert_eq!(count("add.rn.f64"), 6, "{k}: the terms summed");
        assert_eq!(count("setp.lt.f64"), 3, "{k}: one test against rc2 per slot");
        for line in b[k].lines().filter(|l| l.contains("max.f64")) {
            assert!(line.trim_end().ends_with(", 0d0000000000000000;"), "{k}: a max.f64 other than with 0: {line}");
        }
        assert!(count("max.f64") <= 9, "{k}");
    }
    assert_lowers(&b, abi::SELECT_SCAN, &["bar.sync", "st.shared.b32", "ld.shared.b32"]);
    // The ABI (17): `(x, n, geo, block_counts)`, `(block_counts, n_blocks, info)` and
    // `(x, ids, n, geo, block_starts, map, atoms)`.
    for (k, params) in [(abi::SELECT_COUNT, 4), (abi::SELECT_SCAN, 3), (abi::SELECT_SCATTER, 7)] {
        assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), params, "{k}'s parameters");
    }
    let r = ptxas_resources();
    for k in passes {
        let (regs, frame) = *r.get(k).unwrap_or_else(|| panic!("{k} not in the ptxas report"));
        assert!(regs <= 64 && frame == 0, "{k}: {regs} registers, {frame} bytes of stack frame");
    }
}

#[test]
fn the_gpu_extent_folds_per_warp_with_shuffles_and_no_shared_state() {
    let b = entries(&ptx_text());
    let k = abi::POSITION_EXTENT;
    // Six values folded over the warp, five butterfly steps each, and one vote for NaN; the
    // folds are ordered comparisons and selects, as the host scan's (no `min.f32`/`max.f32`,
    // whose NaN and zero rules differ); NaN found by an unordered comparison.
    assert_eq!(b[k].matches("shfl.sync.bfly.b32").count(), 30, "{k}: butterfly steps");
    assert_lowers(&b, k, &["vote.sync.any.pred", "setp.lt.f32", "setp.gt.f32", "selp.f32", "setp.nan.f32"]);
    assert_absent(&b, k, &["min.f32", "max.f32", "atom.", "red.", "bar.sync", ".local", ".shared"]);
    // The ABI: `(x, n, parts)`.
    assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), 3, "{k}'s parameters");
}

#[test]
fn the_gpu_id_facts_fold_per_warp_with_shuffles_and_no_shared_state() {
    let b = entries(&ptx_text());
    let k = abi::HOME_ID_FACTS;
    // Two 64-bit sums folded over the warp, five butterfly steps each moving both 32-bit halves
    // (`warp::sum_u64`), and one vote for an id out of order; the sums are integer arithmetic
    // (64-bit adds of the 32-bit scrambles and of their 64-bit squares).
    assert_eq!(b[k].matches("shfl.sync.bfly.b32").count(), 20, "{k}: butterfly steps");
    assert_lowers(&b, k, &["vote.sync.any.pred", "add.s64", "mul.wide.u32"]);
    assert_absent(&b, k, &["atom.", "red.", "bar.sync", ".local", ".shared", ".f32"]);
    // The ABI: `(ids, n, parts)`.
    assert_eq!(b[k].lines().filter(|l| l.trim_start().starts_with(".param ")).count(), 3, "{k}'s parameters");
}
