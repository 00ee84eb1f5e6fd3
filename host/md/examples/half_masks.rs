//! How many pair slots a half-cluster mask would skip (no GPU): `cargo run --release -p halo-md
//! --example half_masks -- ATOMS AxBxC`. For every listed (i-cluster, j-cluster) slot of rank 0's
//! local and non-local lists, after the prune at `rlist_inner` (what the force kernel walks between
//! prunes), it counts the slots whose j-atoms 0–3 or 4–7 have no atom pair closer than
//! `rlist_inner` (a half a per-half mask would leave out), and the atom pairs within the cutoff.
use halo::abi::NBNXM_CLUSTER_SIZE;
use halo::decomp::{HaloPlan, RankGrid};
use halo::system::MolecularSystem;
use halo_md::md_reference::{exchange_coordinates_f64, list_atom_pairs, prune_reference};
use halo_md::nbnxm::{ClusterPairList, DEFAULT_DRIFT_TOLERANCE, ListSetup, LocalAtoms, PairSearch, SearchOptions};
use std::collections::HashMap;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let atoms: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(45_000);
    let grid: RankGrid = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(RankGrid { dims: [1, 1, 1] });
    let sys = MolecularSystem::generate(atoms, 13).expect("system");
    let setup = ListSetup::for_system(&sys, 1.0, 0.002, 100, 50, DEFAULT_DRIFT_TOLERANCE).expect("setup");
    let plan = HaloPlan::build(&sys, grid, setup.rlist).expect("plan");
    let coords = exchange_coordinates_f64(&plan, &sys).expect("coordinates");
    let local = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).expect("local atoms");
    let search = PairSearch::build(&local, &SearchOptions::new(setup.rlist)).expect("search");
    println!(
        "{atoms} atoms, {grid}, rank 0, cutoff {} nm, rlist {:.3}, rlist_inner {:.3} (nstlist {}, nstprune {})",
        setup.cutoff, setup.rlist, setup.rlist_inner, setup.nstlist, setup.nstprune
    );
    let half = NBNXM_CLUSTER_SIZE as usize / 2;
    for (name, list) in [("local", &search.local), ("non-local", &search.nonlocal)] {
        let inner =
            ClusterPairList { entries: list.entries.clone(), j_list: prune_reference(&search.grid, list, &coords[0], f64::from(setup.rlist_inner)) };
        // Per (word, i-cluster): whether each half of the j-cluster has a pair within rlist_inner.
        let mut halves: HashMap<(usize, usize), [bool; 2]> = HashMap::new();
        let (rin2, rc2) = (f64::from(setup.rlist_inner).powi(2), f64::from(setup.cutoff).powi(2));
        let mut within_cutoff = 0usize;
        list_atom_pairs(&search.grid, &inner, &coords[0], |p| {
            let h = halves.entry((p.word, p.k)).or_insert([false; 2]);
            if p.r2 < rin2 {
                h[p.tj / half] = true;
            }
            if p.r2 < rc2 {
                within_cutoff += 1;
            }
        });
        let slots = inner.cluster_pairs();
        let empty_halves: usize = halves.values().map(|h| h.iter().filter(|&&b| !b).count()).sum();
        let pair_slots = slots * (NBNXM_CLUSTER_SIZE as usize).pow(2);
        println!(
            "  {name}: {} words, {slots} inner cluster pairs ({pair_slots} pair slots, {within_cutoff} pairs within the cutoff: {:.1} %); \
             halves with no pair within rlist_inner: {empty_halves} of {} ({:.1} %)",
            inner.j_list.len(),
            100.0 * within_cutoff as f64 / pair_slots.max(1) as f64,
            2 * slots,
            100.0 * empty_halves as f64 / (2 * slots).max(1) as f64
        );
    }
}
