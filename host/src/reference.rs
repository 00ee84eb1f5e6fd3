//! CPU references of what each kernel does to memory. Tests run a kernel and the reference on the
//! same inputs and compare; the references are written for clarity, not speed.

use kernels_gpu::abi::{Float3, PackMode};

/// `out[i] = x[map[i]] (+ shift)`; without a shift the values are copied bit for bit.
pub fn pack(x: &[Float3], map: &[u32], shift: Option<Float3>) -> Vec<Float3> {
    map.iter()
        .map(|&i| {
            let v = x[i as usize];
            match shift {
                Some(s) => Float3::new(v.x + s.x, v.y + s.y, v.z + s.z),
                None => v,
            }
        })
        .collect()
}

/// `dst[map[i]] = buf[i]` (later entries win on repeated targets, which the store kernel forbids).
pub fn unpack_store(buf: &[Float3], map: &[u32], dst: &mut [Float3]) {
    for (v, &i) in buf.iter().zip(map) {
        dst[i as usize] = *v;
    }
}

/// `dst[map[i]] += buf[i]`, in map order.
pub fn unpack_accumulate(buf: &[Float3], map: &[u32], dst: &mut [Float3]) {
    for (v, &i) in buf.iter().zip(map) {
        let d = &mut dst[i as usize];
        *d = Float3::new(d.x + v.x, d.y + v.y, d.z + v.z);
    }
}

/// What `pack_subset` leaves: the selected entries packed (others untouched in `out`), and the
/// number of entries it skipped.
pub fn pack_subset(x: &[Float3], map: &[u32], out: &mut [Float3], shift: Option<Float3>, mode: PackMode, threshold: u32) -> u32 {
    let packed = pack(x, map, shift);
    let mut deferred = 0;
    for (i, &atom) in map.iter().enumerate() {
        if mode.selects(atom, threshold) {
            out[i] = packed[i];
        } else {
            deferred += 1;
        }
    }
    deferred
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs(n: usize) -> Vec<Float3> {
        (0..n).map(|i| Float3::new(i as f32, 10.0 * i as f32, -(i as f32))).collect()
    }

    #[test]
    fn pack_gathers_and_shifts() {
        let x = xs(5);
        assert_eq!(pack(&x, &[4, 0], None), vec![x[4], x[0]]);
        let s = Float3::new(1.0, 2.0, 3.0);
        assert_eq!(pack(&x, &[1], Some(s)), vec![Float3::new(2.0, 12.0, 2.0)]);
        assert!(pack(&x, &[], None).is_empty());
    }

    #[test]
    fn accumulate_adds_repeated_targets() {
        let mut dst = vec![Float3::default(); 3];
        unpack_accumulate(&[Float3::new(1.0, 1.0, 1.0); 3], &[2, 2, 0], &mut dst);
        assert_eq!(dst, vec![Float3::new(1.0, 1.0, 1.0), Float3::default(), Float3::new(2.0, 2.0, 2.0)]);
    }

    #[test]
    fn subset_counts_what_it_skips() {
        let x = xs(10);
        let map = [1, 7, 3, 9];
        let mut out = vec![Float3::new(f32::NAN, 0.0, 0.0); 4];
        assert_eq!(pack_subset(&x, &map, &mut out, None, PackMode::BelowThreshold, 5), 2);
        assert_eq!(out[0], x[1]);
        assert!(out[1].x.is_nan());
        assert_eq!(pack_subset(&x, &map, &mut out, None, PackMode::AtOrAboveThreshold, 5), 2);
        assert_eq!(out, pack(&x, &map, None));
    }
}
