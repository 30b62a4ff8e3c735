//! One libcni cache file: read it (bounded, never blocking, no symlinks) and parse what it
//! says about one network attachment.

use std::{fs::OpenOptions, io, os::unix::fs::OpenOptionsExt, path::Path};

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Map, Value};

use crate::lifecycle::files;

/// Cache files larger than this are not read: a libcni entry is a few KiB.
pub const MAX_CACHE_FILE_BYTES: u64 = 1 << 20;
/// The only cache format that carries the runtime's arguments (libcni's `CNICacheV1`).
const CACHE_KIND: &str = "cniCacheV1";
/// The CNI_ARGS keys kubelet's runtimes set for a pod sandbox.
const POD_NAMESPACE_ARG: &str = "K8S_POD_NAMESPACE";
const POD_NAME_ARG: &str = "K8S_POD_NAME";
const POD_UID_ARG: &str = "K8S_POD_UID";

/// Why a cache file was not indexed.
#[derive(Debug, thiserror::Error)]
pub enum PodCacheError {
    #[error("{size} bytes: larger than the {max} byte limit for a CNI cache entry")]
    TooLarge { size: u64, max: u64 },
    #[error("not a regular file ({kind})")]
    NotRegular { kind: &'static str },
    #[error("file name is not UTF-8")]
    NonUtf8Name,
    #[error("{op}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("empty file (being written?)")]
    Empty,
    #[error("not JSON")]
    Json(#[source] serde_json::Error),
    #[error("{what} is {found}, not a JSON object")]
    NotAnObject { what: &'static str, found: &'static str },
    #[error("kind {found:?} is not {CACHE_KIND:?} (a legacy result-only cache file, or not a CNI cache entry)")]
    WrongKind { found: Option<String> },
    #[error("field {field}: wrong type")]
    FieldType {
        field: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("field {field} is missing or empty")]
    MissingField { field: &'static str },
    #[error("{field}[{index}]: {address:?} is not an IP address with a prefix length")]
    BadAddress { field: &'static str, index: usize, address: String },
}

/// What one libcni cache file says about one network attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    /// (namespace, name) from `cniArgs` K8S_POD_NAMESPACE and K8S_POD_NAME; None unless
    /// both are present, non-empty and unambiguous.
    pub pod: Option<(String, String)>,
    /// `cniArgs` K8S_POD_UID, when present and unambiguous.
    pub pod_uid: Option<String>,
    /// `containerId`: the pod sandbox (infra container) ID.
    pub container_id: String,
    /// `networkName`: the CNI network (config list) name.
    pub network: String,
    /// `ifName`: the interface name inside the container.
    pub if_name: String,
    /// `result.cniVersion`, when the entry has a result.
    pub cni_version: Option<String>,
    /// Names of `result.interfaces` without a `sandbox`: host-side devices (the pod's veth,
    /// and for the bridge plugin also the bridge).
    pub host_interfaces: Vec<String>,
    /// Network namespace paths: the top-level `netns` (libcni ≥ 1.2), then each distinct
    /// `result.interfaces[].sandbox`.
    pub sandboxes: Vec<String>,
    /// `result.ips[].address` (0.3+), or `result.ip4.ip`/`ip6.ip` (0.1/0.2), as "ip/prefix".
    pub ips: Vec<String>,
}

/// Parses one libcni cache file (`cniCacheV1`). Fields this module does not use are not
/// checked; fields it uses must have libcni's types.
pub fn parse_cache_entry(bytes: &[u8]) -> Result<CacheEntry, PodCacheError> {
    let size = bytes.len() as u64;
    if size > MAX_CACHE_FILE_BYTES {
        return Err(PodCacheError::TooLarge { size, max: MAX_CACHE_FILE_BYTES });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(PodCacheError::Empty);
    }
    let value: Value = serde_json::from_slice(bytes).map_err(PodCacheError::Json)?;
    let object = as_object(value, "the file")?;
    let kind: Option<String> = field(&object, "kind", "kind")?;
    if kind.as_deref() != Some(CACHE_KIND) {
        return Err(PodCacheError::WrongKind { found: kind });
    }
    let container_id = required(&object, "containerId")?;
    let network = required(&object, "networkName")?;
    let if_name = required(&object, "ifName")?;
    let netns: Option<String> = field(&object, "netns", "netns")?;
    let args: Vec<(String, String)> = field(&object, "cniArgs", "cniArgs")?.unwrap_or_default();
    let namespace = pod_arg(&args, POD_NAMESPACE_ARG);
    let name = pod_arg(&args, POD_NAME_ARG);
    let mut entry = CacheEntry {
        pod: namespace.zip(name),
        pod_uid: pod_arg(&args, POD_UID_ARG),
        container_id,
        network,
        if_name,
        cni_version: None,
        host_interfaces: Vec::new(),
        sandboxes: netns.into_iter().filter(|path| !path.is_empty()).collect(),
        ips: Vec::new(),
    };
    if let Some(result) = field::<Value>(&object, "result", "result")? {
        read_result(as_object(result, "result")?, &mut entry)?;
    }
    Ok(entry)
}

/// The result part, any CNI version: fields are recognised by name, not by `cniVersion`.
fn read_result(result: Map<String, Value>, entry: &mut CacheEntry) -> Result<(), PodCacheError> {
    entry.cni_version = field(&result, "cniVersion", "result.cniVersion")?;
    let interfaces: Vec<ResultInterface> = field(&result, "interfaces", "result.interfaces")?.unwrap_or_default();
    for interface in interfaces {
        let (list, value) = match interface.sandbox.filter(|sandbox| !sandbox.is_empty()) {
            Some(sandbox) => (&mut entry.sandboxes, sandbox),
            None => (&mut entry.host_interfaces, interface.name),
        };
        if !value.is_empty() && !list.contains(&value) {
            list.push(value);
        }
    }
    let ips: Vec<ResultIp> = field(&result, "ips", "result.ips")?.unwrap_or_default();
    for (index, ip) in ips.into_iter().enumerate() {
        if let Some(address) = ip.address {
            entry.ips.push(checked_address("result.ips", index, address)?);
        }
    }
    // CNI 0.1.0/0.2.0: one address per family, no interface list.
    for (key, name) in [("ip4", "result.ip4"), ("ip6", "result.ip6")] {
        if let Some(LegacyIp { ip: Some(address) }) = field(&result, key, name)? {
            entry.ips.push(checked_address(name, 0, address)?);
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct ResultInterface {
    #[serde(default)]
    name: String,
    #[serde(default)]
    sandbox: Option<String>,
}

#[derive(Deserialize)]
struct ResultIp {
    #[serde(default)]
    address: Option<String>,
}

#[derive(Deserialize)]
struct LegacyIp {
    #[serde(default)]
    ip: Option<String>,
}

fn as_object(value: Value, what: &'static str) -> Result<Map<String, Value>, PodCacheError> {
    let found = match value {
        Value::Object(object) => return Ok(object),
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
    };
    Err(PodCacheError::NotAnObject { what, found })
}

/// An optional field; JSON null counts as absent (Go's omitempty and nil slices).
fn field<T: DeserializeOwned>(
    object: &Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<Option<T>, PodCacheError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            T::deserialize(value).map(Some).map_err(|source| PodCacheError::FieldType { field: name, source })
        }
    }
}

fn required(object: &Map<String, Value>, name: &'static str) -> Result<String, PodCacheError> {
    field::<String>(object, name, name)?
        .filter(|value| !value.is_empty())
        .ok_or(PodCacheError::MissingField { field: name })
}

/// The value of a CNI argument; None when absent, empty or given twice with different values.
fn pod_arg(args: &[(String, String)], key: &str) -> Option<String> {
    let mut values = args.iter().filter(|(name, _)| name == key).map(|(_, value)| value.as_str());
    let first = values.next().filter(|value| !value.is_empty())?;
    values.all(|value| value == first).then(|| first.to_string())
}

fn checked_address(field: &'static str, index: usize, address: String) -> Result<String, PodCacheError> {
    let valid = address.split_once('/').is_some_and(|(ip, prefix)| match ip.parse::<std::net::IpAddr>() {
        Ok(ip) => prefix.parse::<u8>().is_ok_and(|prefix| prefix <= if ip.is_ipv4() { 32 } else { 128 }),
        Err(_) => false,
    });
    if valid { Ok(address) } else { Err(PodCacheError::BadAddress { field, index, address }) }
}

/// Reads a regular file of at most [`MAX_CACHE_FILE_BYTES`]: O_NONBLOCK so a FIFO cannot
/// block the open, O_NOFOLLOW so a symlink is not followed, then fstat.
pub(super) fn read_bounded(path: &Path) -> Result<Vec<u8>, PodCacheError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => PodCacheError::NotRegular { kind: "symlink" },
            _ => PodCacheError::Io { op: "opening", source },
        })?;
    let metadata = file.metadata().map_err(|source| PodCacheError::Io { op: "stat", source })?;
    if !metadata.is_file() {
        return Err(PodCacheError::NotRegular { kind: files::kind(metadata.file_type()) });
    }
    if metadata.len() > MAX_CACHE_FILE_BYTES {
        return Err(PodCacheError::TooLarge { size: metadata.len(), max: MAX_CACHE_FILE_BYTES });
    }
    // A file that grew since the fstat is still caught.
    files::read_at_most(&file, metadata.len(), MAX_CACHE_FILE_BYTES)
        .map_err(|source| PodCacheError::Io { op: "reading", source })?
        .ok_or(PodCacheError::TooLarge { size: MAX_CACHE_FILE_BYTES + 1, max: MAX_CACHE_FILE_BYTES })
}

/// libcni cache files of every CNI result version, for the unit tests of this module.
#[cfg(test)]
pub(super) mod fixtures {
    /// openshift-sdn style: only the container side, with its sandbox.
    pub(in crate::lifecycle::pods) const V031: &str = r#"{"kind":"cniCacheV1","containerId":"3f2a01","config":"eyJuYW1lIjoib3BlbnNoaWZ0LXNkbiJ9",
        "ifName":"eth0","networkName":"openshift-sdn",
        "cniArgs":[["IgnoreUnknown","1"],["K8S_POD_NAMESPACE","openshift-apiserver"],["K8S_POD_NAME","apiserver-zg25k"],
                   ["K8S_POD_INFRA_CONTAINER_ID","3f2a01"],["K8S_POD_UID","9c1d"]],
        "capabilityArgs":{"portMappings":[]},
        "result":{"cniVersion":"0.3.1",
            "interfaces":[{"name":"eth0","mac":"0a:58:0a:81:00:2b","sandbox":"/var/run/netns/3f2a01"}],
            "ips":[{"version":"4","interface":0,"address":"10.129.0.43/23","gateway":"10.129.0.1"}],
            "routes":[{"dst":"0.0.0.0/0","gw":"10.129.0.1"}],"dns":{}}}"#;

    /// OVN-Kubernetes style: host veth first, then the container side; dual stack.
    pub(in crate::lifecycle::pods) const V040: &str = r#"{"kind":"cniCacheV1","containerId":"0123456789abcdef","config":"","ifName":"eth0",
        "networkName":"ovn-kubernetes",
        "cniArgs":[["K8S_POD_NAMESPACE","default"],["K8S_POD_NAME","web-1"]],
        "result":{"cniVersion":"0.4.0",
            "interfaces":[{"name":"0123456789abcde","mac":"aa:bb:cc:dd:ee:01"},
                          {"name":"eth0","mac":"0a:58:0a:80:00:05","sandbox":"/var/run/netns/a1b2"}],
            "ips":[{"version":"4","interface":1,"address":"10.128.0.5/23","gateway":"10.128.0.1"},
                   {"version":"6","interface":1,"address":"fd01:0:0:1::5/64","gateway":"fd01:0:0:1::1"}],
            "dns":{}}}"#;

    /// Bridge plugin, CNI 1.0.0: bridge, host veth, container side; no ips[].version; the
    /// runtime's netns at the top level (libcni >= 1.2).
    pub(in crate::lifecycle::pods) const V100: &str = r#"{"kind":"cniCacheV1","containerId":"c0ffee","config":"e30=","ifName":"eth0",
        "networkName":"mynet","netns":"/proc/4242/ns/net",
        "cniArgs":[["K8S_POD_NAMESPACE","kube-system"],["K8S_POD_NAME","coredns-x"]],
        "result":{"cniVersion":"1.0.0",
            "interfaces":[{"name":"cni0","mac":"aa:00:00:00:00:01"},{"name":"veth1a2b3c4d","mac":"aa:00:00:00:00:02"},
                          {"name":"eth0","mac":"aa:00:00:00:00:03","sandbox":"/var/run/netns/cni-1234"}],
            "ips":[{"interface":2,"address":"10.88.0.7/16","gateway":"10.88.0.1"}]}}"#;

    /// CNI 0.2.0: no interfaces, one address per family.
    pub(in crate::lifecycle::pods) const V020: &str = r#"{"kind":"cniCacheV1","containerId":"abc","ifName":"eth0","networkName":"old",
        "cniArgs":[["K8S_POD_NAMESPACE","ns"],["K8S_POD_NAME","p"]],
        "result":{"cniVersion":"0.2.0","ip4":{"ip":"10.1.0.9/24","gateway":"10.1.0.1"},"ip6":{"ip":"fd00::9/64"}}}"#;

    /// (namespace, name) as a cache entry and a lookup give them.
    pub(in crate::lifecycle::pods) fn pod(namespace: &str, name: &str) -> Option<(String, String)> {
        Some((namespace.to_string(), name.to_string()))
    }

    pub(in crate::lifecycle::pods) fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| item.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{
        fixtures::{V020, V031, V040, V100, pod, strings},
        *,
    };

    #[test]
    fn parses_results_of_every_cni_version() {
        struct Case {
            json: &'static str,
            pod: Option<(String, String)>,
            network: &'static str,
            version: Option<&'static str>,
            host: &'static [&'static str],
            sandboxes: &'static [&'static str],
            ips: &'static [&'static str],
        }
        let cases = [
            Case {
                json: V031,
                pod: pod("openshift-apiserver", "apiserver-zg25k"),
                network: "openshift-sdn",
                version: Some("0.3.1"),
                host: &[],
                sandboxes: &["/var/run/netns/3f2a01"],
                ips: &["10.129.0.43/23"],
            },
            Case {
                json: V040,
                pod: pod("default", "web-1"),
                network: "ovn-kubernetes",
                version: Some("0.4.0"),
                host: &["0123456789abcde"],
                sandboxes: &["/var/run/netns/a1b2"],
                ips: &["10.128.0.5/23", "fd01:0:0:1::5/64"],
            },
            Case {
                json: V100,
                pod: pod("kube-system", "coredns-x"),
                network: "mynet",
                version: Some("1.0.0"),
                host: &["cni0", "veth1a2b3c4d"],
                sandboxes: &["/proc/4242/ns/net", "/var/run/netns/cni-1234"],
                ips: &["10.88.0.7/16"],
            },
            Case {
                json: V020,
                pod: pod("ns", "p"),
                network: "old",
                version: Some("0.2.0"),
                host: &[],
                sandboxes: &[],
                ips: &["10.1.0.9/24", "fd00::9/64"],
            },
        ];
        for case in cases {
            let entry =
                parse_cache_entry(case.json.as_bytes()).unwrap_or_else(|error| panic!("{}: {error}", case.network));
            assert_eq!(entry.pod, case.pod, "{}", case.network);
            assert_eq!(entry.network, case.network);
            assert_eq!(entry.if_name, "eth0");
            assert_eq!(entry.cni_version.as_deref(), case.version, "{}", case.network);
            assert_eq!(entry.host_interfaces, strings(case.host), "{}", case.network);
            assert_eq!(entry.sandboxes, strings(case.sandboxes), "{}", case.network);
            assert_eq!(entry.ips, strings(case.ips), "{}", case.network);
        }
        let sdn = parse_cache_entry(V031.as_bytes()).expect("0.3.1");
        assert_eq!((sdn.container_id.as_str(), sdn.pod_uid.as_deref()), ("3f2a01", Some("9c1d")));
    }

    #[test]
    fn pod_arguments_must_be_complete_and_unambiguous() {
        let with_args = |args: &str| {
            format!(r#"{{"kind":"cniCacheV1","containerId":"c1","ifName":"eth0","networkName":"n"{args}}}"#)
        };
        let cases = [
            ("", None),
            (r#","cniArgs":null"#, None),
            (r#","cniArgs":[]"#, None),
            (r#","cniArgs":[["K8S_POD_NAMESPACE","ns"]]"#, None),
            (r#","cniArgs":[["K8S_POD_NAME","p"],["K8S_POD_INFRA_CONTAINER_ID","c1"]]"#, None),
            (r#","cniArgs":[["K8S_POD_NAMESPACE",""],["K8S_POD_NAME","p"]]"#, None),
            (r#","cniArgs":[["K8S_POD_NAMESPACE","a"],["K8S_POD_NAMESPACE","b"],["K8S_POD_NAME","p"]]"#, None),
            (r#","cniArgs":[["K8S_POD_NAMESPACE","a"],["K8S_POD_NAMESPACE","a"],["K8S_POD_NAME","p"]]"#, pod("a", "p")),
            // A CNI_ARGS-style string in one pair is not the documented shape: no pod.
            (r#","cniArgs":[["K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",""]]"#, None),
            (r#","cniArgs":[["k8s_pod_namespace","ns"],["k8s_pod_name","p"]]"#, None),
            (r#","cniArgs":[["K8S_POD_NAMESPACE","ns"],["K8S_POD_NAME","p"]],"result":null"#, pod("ns", "p")),
        ];
        for (args, expected) in cases {
            let entry = parse_cache_entry(with_args(args).as_bytes()).unwrap_or_else(|error| panic!("{args}: {error}"));
            assert_eq!(entry.pod, expected, "{args}");
            assert!(entry.ips.is_empty() && entry.host_interfaces.is_empty() && entry.sandboxes.is_empty());
        }
    }

    #[test]
    fn rejects_garbage_and_wrong_types_with_a_reason() {
        let entry = |rest: &str| {
            format!(r#"{{"kind":"cniCacheV1","containerId":"c1","ifName":"eth0","networkName":"n"{rest}}}"#)
        };
        let big = format!(r#"{{"kind":"cniCacheV1","pad":"{}"}}"#, "x".repeat(MAX_CACHE_FILE_BYTES as usize));
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "empty file"),
            (b"  \n".to_vec(), "empty file"),
            (b"\x00\xff\xfegarbage".to_vec(), "not JSON"),
            (b"{\"kind\":\"cniCacheV1\",".to_vec(), "not JSON"),
            (b"[1,2]".to_vec(), "the file is an array"),
            (b"\"cniCacheV1\"".to_vec(), "the file is a string"),
            // A legacy (pre-cniCacheV1) cache file is the bare result.
            (br#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.2/24"}]}"#.to_vec(), "kind None"),
            (br#"{"kind":"cniCacheV2","containerId":"c"}"#.to_vec(), "kind Some(\"cniCacheV2\")"),
            (br#"{"kind":1}"#.to_vec(), "field kind: wrong type"),
            (br#"{"kind":"cniCacheV1","ifName":"eth0","networkName":"n"}"#.to_vec(), "containerId is missing"),
            (
                br#"{"kind":"cniCacheV1","containerId":"","ifName":"eth0","networkName":"n"}"#.to_vec(),
                "containerId is missing",
            ),
            (br#"{"kind":"cniCacheV1","containerId":"c","ifName":"eth0"}"#.to_vec(), "networkName is missing"),
            (
                br#"{"kind":"cniCacheV1","containerId":7,"ifName":"eth0","networkName":"n"}"#.to_vec(),
                "field containerId: wrong type",
            ),
            (entry(r#","cniArgs":"K8S_POD_NAMESPACE=ns""#).into_bytes(), "field cniArgs: wrong type"),
            (entry(r#","cniArgs":[["K8S_POD_NAME"]]"#).into_bytes(), "field cniArgs: wrong type"),
            (entry(r#","cniArgs":[["K8S_POD_NAME","p","x"]]"#).into_bytes(), "field cniArgs: wrong type"),
            (entry(r#","cniArgs":{"K8S_POD_NAME":"p"}"#).into_bytes(), "field cniArgs: wrong type"),
            (entry(r#","netns":5"#).into_bytes(), "field netns: wrong type"),
            (entry(r#","result":"ok""#).into_bytes(), "result is a string"),
            (entry(r#","result":{"interfaces":{"name":"eth0"}}"#).into_bytes(), "field result.interfaces: wrong type"),
            (entry(r#","result":{"interfaces":[{"name":3}]}"#).into_bytes(), "field result.interfaces: wrong type"),
            (entry(r#","result":{"ips":[{"address":10}]}"#).into_bytes(), "field result.ips: wrong type"),
            (entry(r#","result":{"ips":[{"address":"10.0.0.1"}]}"#).into_bytes(), "result.ips[0]: \"10.0.0.1\""),
            (
                entry(r#","result":{"ips":[{"address":"10.0.0.1/24"},{"address":"10.0.0.1/33"}]}"#).into_bytes(),
                "result.ips[1]",
            ),
            (entry(r#","result":{"ips":[{"address":"pod/24"}]}"#).into_bytes(), "is not an IP address"),
            (entry(r#","result":{"ip4":{"ip":"10.0.0.1"}}"#).into_bytes(), "result.ip4[0]"),
            (entry(r#","result":{"cniVersion":1}"#).into_bytes(), "field result.cniVersion: wrong type"),
            (big.into_bytes(), "larger than the 1048576 byte limit"),
        ];
        for (bytes, reason) in cases {
            let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into_owned();
            match parse_cache_entry(&bytes) {
                Ok(entry) => panic!("{shown}: parsed as {entry:?}"),
                Err(error) => {
                    assert!(
                        crate::errors::chain(&error).contains(reason),
                        "{shown}: {} lacks {reason:?}",
                        crate::errors::chain(&error)
                    )
                }
            }
        }
    }

    #[test]
    fn unused_fields_and_unknown_keys_are_not_checked() {
        let json = r#"{"kind":"cniCacheV1","containerId":"c","ifName":"eth0","networkName":"n","config":42,
            "capabilityArgs":"odd","extra":[1],"cniArgs":[["K8S_POD_NAMESPACE","ns"],["K8S_POD_NAME","p"]],
            "result":{"cniVersion":"1.1.0","interfaces":[{"name":"veth0","mtu":1400,"socketPath":"/x","pciID":"0000:01:00.0"},
                {"sandbox":"/var/run/netns/x"},{"name":"","mac":"m"}],"ips":[{"interface":"bogus","gateway":"x"}],
                "routes":"whatever","dns":5}}"#;
        let entry = parse_cache_entry(json.as_bytes()).expect("parses");
        assert_eq!(entry.host_interfaces, ["veth0"]);
        assert_eq!(entry.sandboxes, ["/var/run/netns/x"]);
        assert!(entry.ips.is_empty(), "an ips entry without address adds nothing");
    }
}
