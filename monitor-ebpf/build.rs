use which::which;

/// Rebuild the kernel programs when bpf-linker changes: it links them.
fn main() {
    // Missing bpf-linker is reported by rustc at link time with a clearer message than we could give.
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
