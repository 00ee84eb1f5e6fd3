//! The bit-exactness promise of `jacobi7`, checked in its PTX (no GPU needed): every floating
//! operation is rounded on its own (`add.rn`/`mul.rn`, which ptxas must not contract into an FMA),
//! no `fma`, and no flush-to-zero. Needs the PTX (`cargo xtask test` builds it first), like the
//! host crate's PTX tests: a missing PTX fails, it does not skip.

#[test]
fn jacobi7_has_no_fma_and_no_flush_to_zero() {
    let artifacts = halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
    let ptx = String::from_utf8(artifacts.ptx().expect("reading the PTX").into_owned()).expect("PTX is text");
    let start = ptx.find(".entry jacobi7(").expect("jacobi7 is missing from the PTX: rebuild with `cargo xtask build-ptx`");
    let rest = &ptx[start..];
    let body = &rest[..rest.find("\n}").expect("end of jacobi7")];
    let float_ops: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| l.contains(".f32") && !l.starts_with(".param") && !l.starts_with("ld.") && !l.starts_with("st."))
        .collect();
    assert!(!float_ops.is_empty(), "no f32 arithmetic found in jacobi7:\n{body}");
    for op in &float_ops {
        assert!(!op.starts_with("fma"), "jacobi7 uses a fused multiply-add ({op}): the CPU reference would differ");
        assert!(!op.contains(".ftz"), "jacobi7 flushes subnormals ({op})");
        if op.starts_with("add") || op.starts_with("mul") || op.starts_with("sub") {
            assert!(op.contains(".rn."), "jacobi7 has an arithmetic op without an explicit rounding mode, which ptxas may contract: {op}");
        }
    }
}
