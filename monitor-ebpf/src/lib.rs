#![no_std]
// The programs live in the `monitor-ebpf` binary (src/main.rs); this lib only lets
// `cargo check --workspace` succeed on the host.
