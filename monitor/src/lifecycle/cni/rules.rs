//! libcni's rules for one config entry: which names count, whether the content loads, and
//! looking at an entry without ever blocking on it or reading more than a bound.

use std::{
    collections::BTreeMap,
    ffi::{OsStr, OsString},
    fs::{self, File},
    hash::{DefaultHasher, Hasher},
    io,
    os::unix::{ffi::OsStrExt, fs::OpenOptionsExt},
    path::Path,
};

use serde_json::{Map, Value};

use crate::lifecycle::{dirwatch, files};

/// Largest config read. Larger files are invalid; never more than this plus one byte is read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Whether libcni would consider an entry of this name (`.conf`, `.conflist`, `.json`).
pub fn is_config_name(name: &OsStr) -> bool {
    let name = name.as_bytes();
    [b".conf".as_slice(), b".conflist", b".json"].iter().any(|suffix| name.ends_with(suffix))
}

/// What one config file amounts to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Loadable; `network` is the network name ("" when a `.conf` has none).
    Valid { network: String },
    /// Not loadable, and why.
    Invalid { reason: String },
}

/// Everything the state machine needs to know about one config entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileFacts {
    /// Hash of the content and its length; None when the content was not read.
    pub(crate) fingerprint: Option<u64>,
    pub(crate) verdict: Verdict,
}

impl FileFacts {
    pub(super) fn invalid(reason: impl Into<String>) -> Self {
        Self { fingerprint: None, verdict: Verdict::Invalid { reason: reason.into() } }
    }
}

/// Validates config bytes as libcni would load them, `.conflist` as a network list, anything
/// else as a single network config.
pub(crate) fn validate(name: &OsStr, bytes: &[u8]) -> Verdict {
    let checked = match serde_json::from_slice::<Value>(bytes) {
        Err(error) => Err(format!("not valid JSON: {error}")),
        Ok(Value::Object(object)) => {
            if name.as_bytes().ends_with(b".conflist") {
                check_list(&object)
            } else {
                check_conf(&object)
            }
        }
        Ok(_) => Err("not a JSON object".to_string()),
    };
    match checked {
        Ok(network) => Verdict::Valid { network },
        Err(reason) => Verdict::Invalid { reason },
    }
}

fn check_list(object: &Map<String, Value>) -> Result<String, String> {
    check_version(object)?;
    let network = match object.get("name") {
        None | Some(Value::Null) => return Err("missing name".into()),
        Some(Value::String(name)) if name.is_empty() => return Err("empty name".into()),
        Some(Value::String(name)) => name.clone(),
        Some(_) => return Err("name is not a string".into()),
    };
    let plugins = match object.get("plugins") {
        None | Some(Value::Null) => return Err("missing plugins".into()),
        Some(Value::Array(plugins)) if plugins.is_empty() => return Err("empty plugins".into()),
        Some(Value::Array(plugins)) => plugins,
        Some(_) => return Err("plugins is not an array".into()),
    };
    for (index, plugin) in plugins.iter().enumerate() {
        let Value::Object(plugin) = plugin else { return Err(format!("plugin {index} is not an object")) };
        check_type(plugin).map_err(|reason| format!("plugin {index}: {reason}"))?;
    }
    Ok(network)
}

fn check_conf(object: &Map<String, Value>) -> Result<String, String> {
    check_version(object)?;
    check_type(object)?;
    match object.get("name") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(name)) => Ok(name.clone()),
        Some(_) => Err("name is not a string".into()),
    }
}

fn check_type(object: &Map<String, Value>) -> Result<(), String> {
    match object.get("type") {
        None | Some(Value::Null) => Err("missing type".into()),
        Some(Value::String(kind)) if kind.is_empty() => Err("empty type".into()),
        Some(Value::String(_)) => Ok(()),
        Some(_) => Err("type is not a string".into()),
    }
}

fn check_version(object: &Map<String, Value>) -> Result<(), String> {
    match object.get("cniVersion") {
        None | Some(Value::Null | Value::String(_)) => Ok(()),
        Some(_) => Err("cniVersion is not a string".into()),
    }
}

fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write_usize(bytes.len());
    hasher.write(bytes);
    hasher.finish()
}

/// An I/O error as short text: "Permission denied", without the "(os error 13)".
fn describe(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_string(),
        None => error.to_string(),
    }
}

/// What [`examine`] found at a config entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Examined {
    /// No such entry.
    Absent,
    /// Someone has it open for writing: what could be read may be partial; its close is
    /// reported later.
    BeingWritten,
    /// `checked`: nobody had it open for writing once it was read (false: could not tell, see
    /// [`dirwatch::open_for_writing`]).
    Found { facts: FileFacts, checked: bool },
}

/// Looks at one config entry `dir/name` (following symlinks). Never blocks on a fifo or device
/// (metadata first, then `O_NONBLOCK`), never reads more than [`MAX_CONFIG_BYTES`] + 1 bytes.
pub(crate) fn examine(dir: &Path, name: &OsStr) -> Examined {
    let path = dir.join(name);
    let invalid = |reason: String| Examined::Found { facts: FileFacts::invalid(reason), checked: true };
    let unreadable = |error: &io::Error| invalid(format!("unreadable: {}", describe(error)));
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Examined::Absent,
        Err(error) => return unreadable(&error),
    };
    let meta = if meta.file_type().is_symlink() {
        match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(error) if error.raw_os_error() == Some(libc::ELOOP) => return invalid("symlink loop".into()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return invalid("dangling symlink".into()),
            Err(error) => return unreadable(&error),
        }
    } else {
        meta
    };
    if !meta.is_file() {
        return invalid(format!("not a regular file ({})", files::kind(meta.file_type())));
    }
    let file = match File::options().read(true).custom_flags(libc::O_NONBLOCK).open(&path) {
        Ok(file) => file,
        // Gone since the metadata: its removal event follows.
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Examined::Absent,
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => return invalid("symlink loop".into()),
        Err(error) => return unreadable(&error),
    };
    // What the fd refers to: the path may have been swapped since the metadata.
    let meta = match file.metadata() {
        Ok(meta) if meta.is_file() => meta,
        Ok(meta) => return invalid(format!("not a regular file ({})", files::kind(meta.file_type()))),
        Err(error) => return unreadable(&error),
    };
    let verdict = if meta.len() > MAX_CONFIG_BYTES {
        FileFacts::invalid(format!("over 1 MiB ({} bytes)", meta.len()))
    } else {
        match files::read_at_most(&file, meta.len(), MAX_CONFIG_BYTES) {
            Err(error) => FileFacts::invalid(format!("unreadable: {}", describe(&error))),
            Ok(None) => FileFacts::invalid(format!("over 1 MiB (more than {MAX_CONFIG_BYTES} bytes)")),
            Ok(Some(bytes)) => FileFacts { fingerprint: Some(fingerprint(&bytes)), verdict: validate(name, &bytes) },
        }
    };
    // Asked after reading: a writer that overlapped the read either still has the file open, or
    // has closed it and its events are queued (see `dirwatch`).
    match dirwatch::open_for_writing(&file) {
        Some(true) => Examined::BeingWritten,
        Some(false) => Examined::Found { facts: verdict, checked: true },
        None => Examined::Found { facts: verdict, checked: false },
    }
}

/// A dir's config entries, as listed now.
#[derive(Debug)]
pub(crate) enum Listing {
    /// Every config entry found (never [`Examined::Absent`]).
    Entries(BTreeMap<OsString, Examined>),
    /// The dir does not exist (or is not a dir).
    Missing,
    /// It exists but cannot be listed.
    Unreadable(String),
}

/// Lists and examines every config entry of `dir`.
pub(crate) fn list_dir(dir: &Path) -> Listing {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => return Listing::Missing,
        Err(error) => return Listing::Unreadable(describe(&error)),
    };
    let mut files = BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !is_config_name(&name) {
            continue;
        }
        match examine(dir, &name) {
            Examined::Absent => {}
            examined => {
                files.insert(name, examined);
            }
        }
    }
    Listing::Entries(files)
}

/// Facts and a valid config, for the unit tests of this module.
#[cfg(test)]
pub(super) mod fixtures {
    use super::{FileFacts, Verdict};

    /// A valid config list.
    pub(in crate::lifecycle::cni) const VALID: &str =
        r#"{"cniVersion":"0.4.0","name":"openshift-sdn","plugins":[{"type":"openshift-sdn"}]}"#;

    pub(in crate::lifecycle::cni) fn valid(network: &str, content: u64) -> FileFacts {
        FileFacts { fingerprint: Some(content), verdict: Verdict::Valid { network: network.into() } }
    }

    pub(in crate::lifecycle::cni) fn invalid(reason: &str, content: u64) -> FileFacts {
        FileFacts { fingerprint: Some(content), verdict: Verdict::Invalid { reason: reason.into() } }
    }
}

#[cfg(test)]
mod tests {
    use super::{fixtures::VALID, *};
    use crate::test_support::TempDir;

    #[test]
    fn names_that_count() {
        for name in ["a.conf", "a.conflist", "a.json", ".conf", "10-x.y.conf"] {
            assert!(is_config_name(OsStr::new(name)), "{name}");
        }
        for name in ["a.conf.tmp", "a.CONF", "a.yaml", ".a.conf.swp", "conf", "a.conflist~"] {
            assert!(!is_config_name(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn validation_rules() {
        let ok_list = r#"{"cniVersion":"0.4.0","name":"openshift-sdn","plugins":[{"type":"openshift-sdn"}]}"#;
        let cases: &[(&str, &str, Result<&str, &str>)] = &[
            ("a.conflist", ok_list, Ok("openshift-sdn")),
            ("a.conf", r#"{"cniVersion":"0.3.1","name":"n","type":"bridge"}"#, Ok("n")),
            ("a.json", r#"{"type":"bridge"}"#, Ok("")),
            ("a.conf", "", Err("not valid JSON: EOF while parsing a value at line 1 column 0")),
            ("a.conf", "garbage", Err("not valid JSON: expected value at line 1 column 1")),
            ("a.conf", r#"{"type":"x"} trailing"#, Err("not valid JSON: trailing characters at line 1 column 14")),
            ("a.conf", "[1]", Err("not a JSON object")),
            ("a.conf", r#"{"name":"n"}"#, Err("missing type")),
            ("a.conf", r#"{"type":""}"#, Err("empty type")),
            ("a.conf", r#"{"type":5}"#, Err("type is not a string")),
            ("a.conf", r#"{"type":"x","name":5}"#, Err("name is not a string")),
            ("a.conf", r#"{"type":"x","cniVersion":1}"#, Err("cniVersion is not a string")),
            // A single config named .conflist is not a list.
            ("a.conflist", r#"{"name":"n","type":"bridge"}"#, Err("missing plugins")),
            ("a.conflist", r#"{"plugins":[{"type":"x"}]}"#, Err("missing name")),
            ("a.conflist", r#"{"name":"","plugins":[{"type":"x"}]}"#, Err("empty name")),
            ("a.conflist", r#"{"name":["n"],"plugins":[{"type":"x"}]}"#, Err("name is not a string")),
            ("a.conflist", r#"{"name":"n","plugins":[]}"#, Err("empty plugins")),
            ("a.conflist", r#"{"name":"n","plugins":{"type":"x"}}"#, Err("plugins is not an array")),
            ("a.conflist", r#"{"name":"n","plugins":[{"type":"x"},"y"]}"#, Err("plugin 1 is not an object")),
            (
                "a.conflist",
                r#"{"name":"n","plugins":[{"type":"x"},{"type":7}]}"#,
                Err("plugin 1: type is not a string"),
            ),
            ("a.conflist", r#"{"name":"n","plugins":[{}]}"#, Err("plugin 0: missing type")),
        ];
        for (name, content, want) in cases {
            let want = match want {
                Ok(network) => Verdict::Valid { network: network.to_string() },
                Err(reason) => Verdict::Invalid { reason: reason.to_string() },
            };
            assert_eq!(validate(OsStr::new(name), content.as_bytes()), want, "{name}: {content}");
        }
        // Deep nesting is an error, not a stack overflow.
        let deep = "[".repeat(100_000);
        assert!(matches!(validate(OsStr::new("a.conf"), deep.as_bytes()), Verdict::Invalid { .. }));
    }

    #[test]
    fn io_errors_read_short() {
        assert_eq!(describe(&io::Error::from_raw_os_error(libc::EACCES)), "Permission denied");
    }

    fn reason(examined: Examined) -> Option<String> {
        match examined {
            Examined::Absent => None,
            Examined::BeingWritten => Some("being written".into()),
            Examined::Found { facts, checked } => {
                assert!(checked, "leases work here");
                match facts.verdict {
                    Verdict::Valid { network } => Some(format!("valid {network}")),
                    Verdict::Invalid { reason } => Some(reason),
                }
            }
        }
    }

    #[test]
    fn examines_odd_entries_without_blocking() {
        let tmp = TempDir::new("examine");
        let dir = &tmp.0;
        fs::write(dir.join("ok.conflist"), VALID).unwrap();
        fs::write(dir.join("big.conf"), vec![b' '; 5 << 20]).unwrap();
        fs::create_dir(dir.join("x.conf")).unwrap();
        nix::unistd::mkfifo(&dir.join("fifo.conf"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::os::unix::fs::symlink("loop.conf", dir.join("loop.conf")).unwrap();
        std::os::unix::fs::symlink("nowhere", dir.join("dangling.conf")).unwrap();
        std::os::unix::fs::symlink("ok.conflist", dir.join("link.conflist")).unwrap();
        let check = |name: &str| reason(examine(dir, OsStr::new(name)));
        assert_eq!(check("ok.conflist").as_deref(), Some("valid openshift-sdn"));
        assert_eq!(check("link.conflist").as_deref(), Some("valid openshift-sdn"));
        assert_eq!(check("big.conf").as_deref(), Some("over 1 MiB (5242880 bytes)"));
        assert_eq!(check("x.conf").as_deref(), Some("not a regular file (directory)"));
        assert_eq!(check("fifo.conf").as_deref(), Some("not a regular file (fifo)"));
        assert_eq!(check("loop.conf").as_deref(), Some("symlink loop"));
        assert_eq!(check("dangling.conf").as_deref(), Some("dangling symlink"));
        assert_eq!(check("absent.conf"), None);
        let busy = |dir: &Path| {
            let Listing::Entries(files) = list_dir(dir) else { panic!("listing failed") };
            let busy = files.iter().filter(|(_, e)| **e == Examined::BeingWritten).map(|(name, _)| name.clone());
            (files.len(), busy.collect::<Vec<_>>())
        };
        assert_eq!(busy(dir), (7, vec![]));
        // A file someone has open for writing is not taken at its word.
        let writer = File::options().append(true).open(dir.join("ok.conflist")).unwrap();
        assert_eq!(check("ok.conflist").as_deref(), Some("being written"));
        assert_eq!(check("big.conf").as_deref(), Some("over 1 MiB (5242880 bytes)"));
        assert_eq!(busy(dir), (7, vec![OsString::from("link.conflist"), OsString::from("ok.conflist")]));
        drop(writer);
        assert!(matches!(list_dir(&dir.join("absent")), Listing::Missing));
        assert!(matches!(list_dir(&dir.join("ok.conflist")), Listing::Missing));
        // Identical bytes, identical fingerprint; different bytes, different fingerprint.
        let first = examine(dir, OsStr::new("ok.conflist"));
        fs::write(dir.join("ok.conflist"), VALID).unwrap();
        assert_eq!(examine(dir, OsStr::new("ok.conflist")), first);
        fs::write(dir.join("ok.conflist"), VALID.replace("0.4.0", "1.0.0")).unwrap();
        assert_ne!(examine(dir, OsStr::new("ok.conflist")), first);
    }
}
