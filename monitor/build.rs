//! Builds the kernel programs (monitor-ebpf) for the bpf target and leaves the object in OUT_DIR.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = format!("{manifest_dir}/../monitor-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package { name: "monitor-ebpf", root_dir: &ebpf_dir, ..Default::default() }],
        aya_build::Toolchain::default(),
    )
    .context("building the kernel programs (run `cargo xtask setup` if the toolchain is missing)")
}
