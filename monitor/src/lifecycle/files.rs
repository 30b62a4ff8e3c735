//! Reading files that other processes put in the dirs the agent watches (CNI configs, the
//! CNI result cache): bounded, and never blocking on a fifo or device.

use std::{
    fs::{File, FileType},
    io::{self, Read as _},
    os::unix::fs::FileTypeExt as _,
};

/// What kind of entry a non-regular file is, for messages.
pub fn kind(file_type: FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else {
        "unknown type"
    }
}

/// Reads `file` (of `len` bytes by its fstat) to the end, but never more than `max + 1`
/// bytes: None when it holds more than `max` (it may have grown since the fstat).
pub fn read_at_most(file: &File, len: u64, max: u64) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::with_capacity(len.min(max) as usize + 1);
    file.take(max + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= max).then_some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    #[test]
    fn reads_up_to_the_bound_and_no_further() {
        let dir = TempDir::new("files");
        let path = dir.0.join("f");
        std::fs::write(&path, b"12345").unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(read_at_most(&file, 5, 5).unwrap(), Some(b"12345".to_vec()));
        let file = File::open(&path).unwrap();
        assert_eq!(read_at_most(&file, 1, 4).unwrap(), None);
        assert_eq!(kind(std::fs::metadata(&dir.0).unwrap().file_type()), "directory");
    }
}
