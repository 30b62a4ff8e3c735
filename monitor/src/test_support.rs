//! Helpers shared by the unit tests.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

/// A fresh directory under the system temp dir, removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "dm-{tag}-{}-{unique}-{}",
            std::process::id(),
            crate::lifecycle::clock::monotonic_ns()
        ));
        std::fs::create_dir_all(&path).expect("creating a temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
