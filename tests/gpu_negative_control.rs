//! The negative control of the halo checks: one received atom corrupted, or left at the previous
//! step's value (dropped), on the GPU after the coordinate halo (`HALO_FAULT=corrupt-atom:...` /
//! `drop-atom:...`, `halo::exchange::perturb::Fault`), and every check that compares the halo must
//! fail and name the atom, the rank and the pulse: the reference comparison and the integrity
//! checksums on the exchange itself, the MD step's checks (`halo verify`'s engine), and `halo
//! exchange-check` (the built binary: `$HALO_BIN`, else `../halo` beside this test's directory).
//! The layout is 2x2x1 with one pulse per dimension, so pulse 1 forwards atoms that its sender
//! received in pulse 0: the corrupted atom is one received directly from its owner (pulse 0), the
//! dropped one is forwarded (pulse 1, received by its sender in pulse 0).

use halo::abi::Float3;
use halo::decomp::RankGrid;
use halo::exchange::perturb::{CORRUPT_VALUE, Fault, InjectedAtom, Perturbation, Perturbed};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Exchange, Placement, RankHalo, ReceivedAt, Transport, reference};
use halo::integrity::{self, IntegrityError, RankChecksums};
use halo::testing::{GpuFixture, gpu_or_skip, run_captured};
use halo_md::{self as md, MdConfig};
use std::path::PathBuf;
use std::time::Duration;

/// The seed and home atoms of the synthetic layout, the same for `halo exchange-check --seed
/// SEED --home-atoms HOME --grid 2x2x1`.
const SEED: u64 = 11;
const HOME: usize = 3000;

fn control_halos() -> Vec<RankHalo> {
    synthetic::halos(SyntheticShape { grid: [2, 2, 1], pulses_per_dim: 1, home_atoms: HOME, send_fraction: 0.35, box_len: 7.7 }, SEED)
}

/// Global ids of every local atom: home atom `k` of rank `r` is `r * 1_000_000 + k`; a received
/// atom carries the id of what its pulse sent there (pulses in order, as the halo moves them).
fn control_ids(halos: &[RankHalo]) -> Vec<Vec<u32>> {
    let mut ids: Vec<Vec<u32>> = halos
        .iter()
        .enumerate()
        .map(|(r, h)| (0..h.total_atoms).map(|k| if k < h.home_atoms { (r * 1_000_000 + k) as u32 } else { u32::MAX }).collect())
        .collect();
    for p in 0..halos[0].pulses.len() {
        for r in 0..halos.len() {
            let spec = &halos[r].pulses[p];
            let sent: Vec<u32> = spec.index_map.iter().map(|&i| ids[r][i as usize]).collect();
            ids[spec.send_rank][spec.peer_atom_offset..spec.peer_atom_offset + sent.len()].copy_from_slice(&sent);
        }
    }
    ids
}

/// A slot of `rank`'s receive range of `pulse` whose atom the sender owns (`forwarded == false`)
/// or itself received in an earlier pulse and forwards (`true`).
fn pick_slot(halos: &[RankHalo], rank: usize, pulse: usize, forwarded: bool) -> usize {
    let from = halos[rank].pulses[pulse].recv_rank;
    let (sender, sent) = (&halos[from], &halos[from].pulses[pulse]);
    assert_eq!(sent.send_rank, rank, "rank {from}'s pulse {pulse} feeds rank {rank}");
    sent.index_map
        .iter()
        .position(|&i| (i as usize >= sender.home_atoms) == forwarded)
        .unwrap_or_else(|| panic!("rank {rank} pulse {pulse} has no slot with forwarded = {forwarded}"))
}

/// Every rank's coordinates after one step's halo, and the CPU reference's.
type Step = (Vec<Vec<Float3>>, Vec<Vec<Float3>>);

/// Runs the coordinate halo of the control layout with `fault` on one GPU in one process, steps
/// `0..steps`, fresh random home coordinates each step; per step, what every rank holds after the
/// halo and the CPU reference.
fn faulted_exchange(g: &GpuFixture, halos: &[RankHalo], fault: Fault, steps: u64) -> (Vec<InjectedAtom>, Vec<Step>) {
    let p = Perturbation::new(None, Some(fault)).expect("a fault");
    let inner = Placement::Local(vec![g.module.clone()]).exchange::<Float3>(halos.to_vec()).expect("the exchange");
    let mut x = Perturbed::new(inner, p.clone()).expect("the wrapper");
    x.set_wait_timeout(Duration::from_secs(5));
    let order: Vec<usize> = x.local_ranks().iter().map(|r| r.rank()).collect();
    assert_eq!(order, (0..halos.len()).collect::<Vec<_>>(), "one process holds every rank, in order");
    let mut out = Vec::new();
    for step in 0..steps {
        let home = synthetic::random_values(halos, 500 + step, true);
        for (r, rank) in x.local_ranks().iter().enumerate() {
            rank.upload_coordinates(&home[r]).expect("upload");
        }
        x.exchange_forward(Transport::Fused).expect("the halo");
        x.finish().expect("the halo finished");
        out.push((x.read_forward().expect("read back"), reference::coordinates(halos, &home)));
    }
    (p.injected(), out)
}

/// Every rank's coordinates against the reference (what `exchange-check` and `verify` compare)
/// and the integrity checksums across ranks: both must find `injected` alone and name its rank,
/// pulse, sender and local index. Returns the largest coordinate error.
fn assert_caught(test: &str, halos: &[RankHalo], got: &[Vec<Float3>], want: &[Vec<Float3>], injected: &InjectedAtom) -> f64 {
    let at: ReceivedAt = injected.place.received.unwrap_or_else(|| panic!("{test}: the injected atom is a received one: {injected}"));
    let mut worst = 0.0f64;
    for r in 0..halos.len() {
        let d = reference::coordinate_differences(&halos[r], &got[r], &want[r]);
        if r == injected.rank {
            assert_eq!((d.atoms, d.first), (1, Some(injected.place)), "{test}: the reference comparison finds the injected atom alone: {d}");
            let text = d.to_string();
            assert!(
                text.contains(&format!(
                    "local atom {} (received in pulse {} from rank {}, slot {} of that pulse)",
                    injected.place.local, at.pulse, at.from, at.slot
                )),
                "{test}: {text}"
            );
            worst = d.max_abs;
        } else {
            assert_eq!(d.atoms, 0, "{test}: rank {r} is untouched: {d}");
        }
    }
    // The integrity checksums (forces are not compared across ranks; the coordinates stand in).
    let ids = control_ids(halos);
    let sums: Vec<RankChecksums> =
        (0..halos.len()).map(|r| RankChecksums::compute(r, &halos[r], &ids[r], &got[r], &got[r]).expect("checksums")).collect();
    let err = integrity::compare_across_ranks(halos, &sums).expect_err("the integrity checksums must see the injected atom");
    let IntegrityError::HaloMismatch { rank, pulse, from, lo, hi, .. } = err.clone() else { panic!("{test}: {err}") };
    assert_eq!((rank, pulse, from), (injected.rank, at.pulse, at.from), "{test}: {err}");
    assert!((lo..hi).contains(&injected.place.local), "{test}: {err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("rank {rank} holds atoms")) && msg.contains(&format!("pulse {pulse}, from rank {from}")), "{test}: {msg}");
    let sent = RankChecksums::pulse_atoms(from, &halos[from], pulse, &ids[from], &got[from]).expect("sender's hashes");
    let held = RankChecksums::pulse_atoms(rank, &halos[rank], pulse, &ids[rank], &got[rank]).expect("receiver's hashes");
    assert_eq!(integrity::differing_atoms(lo, &sent.sent, &held.received), vec![injected.place.local], "{test}: the per-atom hashes name the atom");
    eprintln!("{test}: caught {injected}: {msg}; max abs coordinate error {worst:.3e} nm");
    worst
}

/// `halo`: `$HALO_BIN` (the bundle's runner sets it), else the one Cargo built beside this test.
fn halo_bin(test: &str) -> PathBuf {
    if let Some(p) = std::env::var_os("HALO_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let built = exe.parent().and_then(|d| d.parent()).map(|d| d.join("halo"));
    built.filter(|p| p.is_file()).unwrap_or_else(|| panic!("{test}: no `halo` binary: set HALO_BIN or build it (cargo build -p halo-cli)"))
}

/// `halo exchange-check` on the control layout in one process with `fault`: it must fail, and its
/// error must name the rank, the pulse, the sender and the local atom.
fn assert_exchange_check_fails(test: &str, fault: &str, injected: &InjectedAtom, steps: u64) {
    let at = injected.place.received.expect("a received atom");
    let mut cmd = std::process::Command::new(halo_bin(test));
    let (seed, home, steps) = (SEED.to_string(), HOME.to_string(), steps.to_string());
    cmd.args([
        "exchange-check",
        "--grid",
        "2x2x1",
        "--seed",
        &seed,
        "--home-atoms",
        &home,
        "--transport",
        "fused",
        "--phase",
        "x",
        "--steps",
        &steps,
        "--fault",
        fault,
    ]);
    let run = run_captured(cmd, Duration::from_secs(120)).expect("starting halo");
    let all = format!("--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr);
    assert!(run.code.is_some_and(|c| c != 0), "{test}: exchange-check must fail\n{all}");
    let named = format!(
        "rank {}: 1 atom(s) differ from the reference, the first is local atom {} (received in pulse {} from rank {}, slot {} of that pulse)",
        injected.rank, injected.place.local, at.pulse, at.from, at.slot
    );
    assert!(run.stderr.contains(&named), "{test}: exchange-check names the atom ({named})\n{all}");
    assert!(run.stderr.contains("fused step"), "{test}: and the step\n{all}");
    eprintln!("{test}: exchange-check failed as it must:\n{}", run.stderr.trim());
}

/// The MD step (what `halo verify` runs) with `fault`: it must fail and name the atom, the rank
/// and the pulse. Returns the error's text.
fn assert_md_fails(test: &str, g: &GpuFixture, fault: Fault, steps: u64) -> String {
    let p = Perturbation::new(None, Some(fault)).expect("a fault");
    let cfg = MdConfig { steps, nstlist: 100, seed: 5, fault: Some(p.clone()), ..MdConfig::new(6000, RankGrid::new([2, 2, 1]).expect("grid")) };
    let e = match md::run_local(&cfg, std::slice::from_ref(&g.module), |_, _| {}) {
        Ok(o) => panic!("{test}: the MD checks passed with an injected atom ({:?}; injected {:?})", o.worst, p.injected()),
        Err(e) => e.to_string(),
    };
    let injected = p.injected();
    assert_eq!(injected.len(), 1, "{test}: one atom injected: {injected:?}\n{e}");
    let (i, at) = (injected[0], injected[0].place.received.expect("a received atom"));
    let named = format!(
        "rank {}: 1 atom(s) differ from the reference, the first is local atom {} (received in pulse {} from rank {}, slot",
        i.rank, i.place.local, at.pulse, at.from
    );
    assert!(e.contains("verification failed") && e.contains(&named), "{test}: the MD check names the atom ({named}): {e}");
    eprintln!("{test}: the MD checks failed as they must: {e}");
    e
}

/// The largest coordinate error an MD check's message reports (`max abs coordinate error X nm`).
fn reported_coordinate_error(e: &str) -> f64 {
    let tail = e.split("max abs coordinate error ").nth(1).unwrap_or_else(|| panic!("no coordinate error in: {e}"));
    tail.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number after the coordinate error in: {e}"))
}

#[test]
fn corrupted_halo_atom_is_caught() {
    let test = "corrupted_halo_atom_is_caught";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = control_halos();
    // An outer-shell atom: received in pulse 0, straight from its owner.
    let (rank, pulse) = (3, 0);
    let slot = pick_slot(&halos, rank, pulse, false);
    let fault = Fault::CorruptAtom { rank, pulse, slot: Some(slot), step: 0 };
    let (injected, steps) = faulted_exchange(&g, &halos, fault, 1);
    assert_eq!(injected.len(), 1, "{test}: {injected:?}");
    let i = injected[0];
    assert_eq!((i.rank, i.step, i.place.received), (rank, 0, Some(ReceivedAt { pulse, from: halos[rank].pulses[pulse].recv_rank, slot })), "{test}");
    let (got, want) = &steps[0];
    assert_eq!(got[rank][i.place.local].x, CORRUPT_VALUE, "{test}: the GPU holds the corrupted value");
    let worst = assert_caught(test, &halos, got, want, &i);
    assert!(worst > 1000.0, "{test}: the coordinate error is the corruption's ({worst})");
    assert_exchange_check_fails(test, &format!("corrupt-atom:rank={rank},pulse={pulse},slot={slot},step=0"), &i, 3);
    // `halo verify`'s checks: a non-zero coordinate error in the report.
    let e = assert_md_fails(test, &g, Fault::CorruptAtom { rank: 1, pulse: 0, slot: None, step: 0 }, 2);
    let reported = reported_coordinate_error(&e);
    assert!(reported > 0.0 && reported.is_finite(), "{test}: coordinate error {reported} in: {e}");
}

#[test]
fn dropped_halo_atom_is_caught() {
    let test = "dropped_halo_atom_is_caught";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = control_halos();
    // A forwarded atom: received in pulse 1 from a rank that received it in pulse 0.
    let (rank, pulse) = (3, 1);
    let slot = pick_slot(&halos, rank, pulse, true);
    let fault = Fault::DropAtom { rank, pulse, slot: Some(slot), step: 1 };
    let (injected, steps) = faulted_exchange(&g, &halos, fault, 2);
    // Step 0 ran clean: the checks pass without the fault.
    let (got, want) = &steps[0];
    for r in 0..halos.len() {
        assert_eq!(reference::coordinate_differences(&halos[r], &got[r], &want[r]).atoms, 0, "{test}: step 0, rank {r}");
    }
    assert_eq!(injected.len(), 1, "{test}: {injected:?}");
    let i = injected[0];
    assert_eq!((i.rank, i.step, i.place.received), (rank, 1, Some(ReceivedAt { pulse, from: halos[rank].pulses[pulse].recv_rank, slot })), "{test}");
    let (got1, want1) = &steps[1];
    let l = i.place.local;
    assert_eq!(got1[rank][l], steps[0].0[rank][l], "{test}: the slot still holds step 0's value");
    assert_ne!(want1[rank][l], got1[rank][l], "{test}: which is not step 1's");
    assert_caught(test, &halos, got1, want1, &i);
    assert_exchange_check_fails(test, &format!("drop-atom:rank={rank},pulse={pulse},slot={slot},step=1"), &i, 3);
    assert_md_fails(test, &g, Fault::DropAtom { rank: 2, pulse: 1, slot: None, step: 1 }, 3);
}

/// The checks above on the CPU alone (no GPU): the reference's own output with one atom changed
/// as each fault changes it must be caught and named the same way.
#[test]
fn the_control_checks_catch_a_simulated_change_on_the_cpu() {
    let halos = control_halos();
    let want = reference::coordinates(&halos, &synthetic::random_values(&halos, 7, true));
    for (rank, pulse, forwarded) in [(3, 0, false), (3, 1, true), (0, 1, false)] {
        let slot = pick_slot(&halos, rank, pulse, forwarded);
        let local = halos[rank].pulses[pulse].atom_offset + slot;
        let mut got = want.clone();
        got[rank][local].x = CORRUPT_VALUE;
        let fault = Fault::CorruptAtom { rank, pulse, slot: Some(slot), step: 0 };
        let injected = InjectedAtom { fault, rank, step: 0, place: halos[rank].place_of(local) };
        assert!(assert_caught("simulated", &halos, &got, &want, &injected) > 1000.0);
    }
    // A forwarded slot really is one: its sender received it in pulse 0.
    let slot = pick_slot(&halos, 3, 1, true);
    let from = halos[3].pulses[1].recv_rank;
    let source = halos[from].pulses[1].index_map[slot] as usize;
    assert_eq!(halos[from].place_of(source).received.map(|r| r.pulse), Some(0));
}
