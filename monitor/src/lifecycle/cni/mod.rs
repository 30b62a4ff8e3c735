//! CNI config dirs: which network configs each dir holds, which are valid, which one is the
//! dir's default network, and the lifecycle events when any of that changes
//! (`cni_config_added|changed|removed|invalid`, `cni_default_network_missing|restored`).
//!
//! Rules follow libcni (`ConfFiles`, `ConfFromBytes`, `ConfListFromBytes`) and CRI-O's ocicni:
//! a config is an entry named `*.conf`, `*.conflist` or `*.json` (other names are ignored
//! entirely); the default network of a dir is the first *valid* config by file name (byte
//! order), so an invalid file sorting first never hides a valid one.
//!
//! Three parts: the rules for one entry (`rules.rs`: which names count, validation, looking at
//! an entry), a pure state machine per dir (`dir_state.rs`: facts about files in, events out)
//! and the I/O that feeds it (`watch.rs`, [`start`]), driven by [`crate::lifecycle::dirwatch`]
//! (inotify, no polling). A file read while it was being written, or changed while it was
//! read, is read again or left for its next change (see [`crate::lifecycle::dirwatch`]), so a
//! config rewritten in place does not flap through "invalid".
//!
//! Events and their subjects: a file's events have the file's full path as subject.
//! `cni_default_network_missing` has the dir's previous default file as subject (the dir itself
//! at start-up), `cni_default_network_restored` the new default file. Only the transitions
//! "had a default → has none" and back are reported: a default switching from one valid file
//! to another is told by the added/removed events alone. At start-up existing files are
//! current state, not changes (no `added`), but invalid files are reported, and so is a dir
//! that exists with no valid config. A dir that appears later without a valid config is not
//! reported missing (it never had a default).

mod dir_state;
mod rules;
mod watch;

pub use self::{
    dir_state::{
        CniChangeCount, CniDefault, CniDirSnapshot, CniFileSnapshot, CniSnapshot, MAX_FILE_LABELS, OTHER_FILE_LABEL,
    },
    rules::{MAX_CONFIG_BYTES, is_config_name},
    watch::{CniWatcher, start},
};
