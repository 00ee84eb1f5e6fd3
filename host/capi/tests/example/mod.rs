//! The halo of `examples/capi-cpp`, built here the way that program builds it, so that the C API's
//! cost is measured on the exchange the C++ example runs (not on a halo of the test's choosing),
//! and a rank's plan handed to the C API as a C program hands it.
//!
//! Two ranks split a periodic 10 x 3 x 3 nm box along x into slabs; each sends the atoms within
//! 1 nm of its lower face to the rank below (pulse 0, shifted by +10 nm on rank 0) and those within
//! 1 nm of its upper face to the rank above (pulse 1, shifted by -10 nm on rank 1). The home
//! coordinates come from the example's generator (a 64-bit LCG per rank), so the maps, counts and
//! offsets are the example's to the atom; `the_port_has_the_examples_halo` pins them to what the
//! example printed on an H200.

use halo::exchange::{PulseSpec, RankHalo};
use halo_capi::plan::{halo_plan, halo_plan_add_pulse, halo_plan_create, halo_pulse_desc};
use kernels_gpu::abi::Float3;
use std::ptr::null_mut;

const RANKS: usize = 2;
const BOX: [f32; 3] = [10.0, 3.0, 3.0];
const CUTOFF: f32 = 1.0;

/// The example's generator (`Lcg` in main.cpp): the top 24 of 64 bits, as a fraction of 2^24.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) & 0xff_ffff) as f32 / (1u32 << 24) as f32
    }
}

/// Rank `r`'s neighbour for pulse `p`'s coordinates (to) and the one they come from.
fn send_rank(r: usize, p: usize) -> usize {
    if p == 0 { (r + RANKS - 1) % RANKS } else { (r + 1) % RANKS }
}

fn recv_rank(r: usize, p: usize) -> usize {
    send_rank(r, 1 - p)
}

/// Both ranks' halos and home coordinates for `atoms` home atoms in all (`decompose` in main.cpp).
pub fn halos(atoms: usize) -> (Vec<RankHalo>, Vec<Vec<Float3>>) {
    let slab = BOX[0] / RANKS as f32;
    let mut home = Vec::new();
    let mut maps: Vec<[Vec<u32>; 2]> = Vec::new();
    for r in 0..RANKS {
        let mut rng = Lcg(0x5eed_0000 + r as u64);
        let n = atoms / RANKS + usize::from(r < atoms % RANKS);
        // x, y, z drawn in that order, as the C++ brace initialiser evaluates them.
        let x: Vec<Float3> = (0..n)
            .map(|_| {
                let a = slab * (r as f32 + rng.next());
                let b = BOX[1] * rng.next();
                Float3::new(a, b, BOX[2] * rng.next())
            })
            .collect();
        let (lo, hi) = (slab * r as f32, slab * (r + 1) as f32);
        let below = (0..n as u32).filter(|&i| x[i as usize].x - lo < CUTOFF).collect();
        let above = (0..n as u32).filter(|&i| hi - x[i as usize].x < CUTOFF).collect();
        maps.push([below, above]);
        home.push(x);
    }
    let recv = |r: usize, p: usize| maps[recv_rank(r, p)][p].len();
    let offset = |r: usize, p: usize| home[r].len() + if p == 0 { 0 } else { recv(r, 0) };
    let halos = (0..RANKS)
        .map(|r| RankHalo {
            home_atoms: home[r].len(),
            total_atoms: offset(r, 1) + recv(r, 1),
            pulses: (0..2)
                .map(|p| PulseSpec {
                    send_rank: send_rank(r, p),
                    recv_rank: recv_rank(r, p),
                    index_map: maps[r][p].clone(),
                    recv_size: recv(r, p),
                    atom_offset: offset(r, p),
                    peer_atom_offset: offset(send_rank(r, p), p),
                    shift: match (p, r) {
                        (0, 0) => Some(Float3::new(BOX[0], 0.0, 0.0)),
                        (1, r) if r == RANKS - 1 => Some(Float3::new(-BOX[0], 0.0, 0.0)),
                        _ => None,
                    },
                    accumulate_forces: true,
                })
                .collect(),
        })
        .collect();
    (halos, home)
}

/// Rank `h`'s plan through the C API (`halo_plan_create`, one `halo_pulse_desc` per pulse), for the
/// caller to destroy with `halo_plan_destroy`.
pub fn c_plan(h: &RankHalo) -> *mut halo_plan {
    let mut plan = null_mut();
    // SAFETY: `plan` is writable; each descriptor's map lives through its call.
    unsafe {
        super::common::ok(halo_plan_create(h.home_atoms, h.total_atoms, &mut plan), "halo_plan_create");
        for p in &h.pulses {
            let map: Vec<i32> = p.index_map.iter().map(|&m| m as i32).collect();
            let shift = p.shift.unwrap_or(Float3::new(0.0, 0.0, 0.0));
            let desc = halo_pulse_desc {
                send_rank: p.send_rank as i32,
                recv_rank: p.recv_rank as i32,
                index_map: map.as_ptr(),
                send_count: map.len(),
                recv_count: p.recv_size,
                atom_offset: p.atom_offset,
                peer_atom_offset: p.peer_atom_offset,
                has_shift: p.shift.is_some() as i32,
                shift: [shift.x, shift.y, shift.z],
                accumulate_forces: 1,
            };
            super::common::ok(halo_plan_add_pulse(plan, &desc), "halo_plan_add_pulse");
        }
    }
    plan
}
