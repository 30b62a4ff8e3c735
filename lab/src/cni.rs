//! What the lab's stand-in CNI leaves on disk: the openshift-sdn network config the sdn writes
//! when ready, and one libcni result cache entry (`cniCacheV1`) per pod, as CRI-O's libcni
//! writes them, so datapath-monitor can name the pods behind the veths. Also the names a CNI
//! plugin would give: `veth` + 8 hex host-side veths and 64-hex sandbox container IDs.

use serde_json::{Value, json};

/// The network name of the lab's (and openshift-sdn's) CNI config.
pub const NETWORK_NAME: &str = "openshift-sdn";
/// The file openshift-sdn writes when ready and deletes on TERM.
pub const CONFIG_FILE: &str = "80-openshift-network.conf";
/// The pod-side interface name.
pub const POD_IFNAME: &str = "eth0";

/// The CNI network config openshift-sdn writes (`80-openshift-network.conf`).
pub fn network_config() -> String {
    format!("{{\"cniVersion\":\"0.3.1\",\"name\":\"{NETWORK_NAME}\",\"type\":\"openshift-sdn\"}}\n")
}

/// 64-bit FNV-1a of `data`, seeded.
fn fnv64(seed: u64, data: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ seed;
    for byte in data {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The host-side veth name of pod `namespace/pod`: `veth` + 8 hex, stable per pod.
pub fn veth_name(namespace: &str, pod: &str) -> String {
    format!("veth{:08x}", fnv64(0, format!("{namespace}/{pod}").as_bytes()) as u32)
}

/// The pod sandbox (infra container) ID of pod `namespace/pod`: 64 hex, stable per pod.
pub fn container_id(namespace: &str, pod: &str) -> String {
    let key = format!("sandbox:{namespace}/{pod}");
    (0..4u64).map(|part| format!("{:016x}", fnv64(part.wrapping_mul(0x9e37_79b9_7f4a_7c15), key.as_bytes()))).collect()
}

/// The libcni cache file name of a pod's entry: `<networkName>-<containerID>-<ifName>`.
pub fn cache_file_name(container_id: &str) -> String {
    format!("{NETWORK_NAME}-{container_id}-{POD_IFNAME}")
}

/// Standard base64 (with padding), as Go's encoding/json writes a `[]byte`.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What a pod's cache entry describes.
pub struct CacheEntry<'a> {
    /// Pod namespace (`K8S_POD_NAMESPACE`).
    pub namespace: &'a str,
    /// Pod name (`K8S_POD_NAME`).
    pub pod: &'a str,
    /// Host-side veth name.
    pub veth: &'a str,
    /// The pod's network namespace name under /var/run/netns.
    pub netns: &'a str,
    /// Pod IP (no prefix).
    pub ip: &'a str,
    /// Prefix length of the pod subnet.
    pub prefix: u8,
    /// Gateway (tun0's address).
    pub gateway: &'a str,
}

/// The libcni `cniCacheV1` JSON of a pod's ADD result. openshift-sdn's result lists only the
/// container side (with its sandbox); the lab lists the host veth too, as the bridge plugin does.
pub fn cache_entry(entry: &CacheEntry<'_>) -> Value {
    let sandbox_id = container_id(entry.namespace, entry.pod);
    let pod_uid = {
        let id = container_id(entry.pod, entry.namespace);
        format!("{}-{}-{}-{}-{}", &id[0..8], &id[8..12], &id[12..16], &id[16..20], &id[20..32])
    };
    json!({
        "kind": "cniCacheV1",
        "containerId": sandbox_id,
        "config": base64(network_config().as_bytes()),
        "ifName": POD_IFNAME,
        "networkName": NETWORK_NAME,
        "netns": format!("/var/run/netns/{}", entry.netns),
        "cniArgs": [
            ["IgnoreUnknown", "1"],
            ["K8S_POD_NAMESPACE", entry.namespace],
            ["K8S_POD_NAME", entry.pod],
            ["K8S_POD_INFRA_CONTAINER_ID", sandbox_id],
            ["K8S_POD_UID", pod_uid],
        ],
        "result": {
            "cniVersion": "0.3.1",
            "interfaces": [
                { "name": entry.veth },
                { "name": POD_IFNAME, "sandbox": format!("/var/run/netns/{}", entry.netns) },
            ],
            "ips": [{
                "version": "4",
                "interface": 1,
                "address": format!("{}/{}", entry.ip, entry.prefix),
                "gateway": entry.gateway,
            }],
            "dns": {},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_look_like_a_cni_plugins() {
        let veth = veth_name("openshift-apiserver", "apiserver-zg25k");
        assert_eq!(veth.len(), 12);
        assert!(veth.starts_with("veth") && veth[4..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(veth, veth_name("openshift-apiserver", "apiserver-zg25k"));
        assert_ne!(veth, veth_name("web", "web-1"));
        let id = container_id("web", "web-1");
        assert_eq!(id.len(), 64);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(cache_file_name(&id), format!("openshift-sdn-{id}-eth0"));
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, encoded) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn network_config_is_valid_cni_json() {
        let config: Value = serde_json::from_str(&network_config()).unwrap();
        assert_eq!(config["cniVersion"], "0.3.1");
        assert_eq!(config["name"], NETWORK_NAME);
        assert_eq!(config["type"], "openshift-sdn");
    }

    #[test]
    fn cache_entry_has_the_libcni_shape() {
        let value = cache_entry(&CacheEntry {
            namespace: "openshift-apiserver",
            pod: "apiserver-zg25k",
            veth: "veth1a2b3c4d",
            netns: "dml-pod-apiserver",
            ip: "10.129.0.43",
            prefix: 23,
            gateway: "10.129.0.1",
        });
        assert_eq!(value["kind"], "cniCacheV1");
        assert_eq!(value["containerId"].as_str().unwrap().len(), 64);
        assert_eq!(value["ifName"], "eth0");
        assert_eq!(value["networkName"], "openshift-sdn");
        let args = value["cniArgs"].as_array().unwrap();
        assert!(args.iter().any(|arg| arg[0] == "K8S_POD_NAMESPACE" && arg[1] == "openshift-apiserver"));
        assert!(args.iter().any(|arg| arg[0] == "K8S_POD_NAME" && arg[1] == "apiserver-zg25k"));
        let interfaces = value["result"]["interfaces"].as_array().unwrap();
        assert_eq!(interfaces[0]["name"], "veth1a2b3c4d");
        assert!(interfaces[0].get("sandbox").is_none());
        assert_eq!(interfaces[1]["sandbox"], "/var/run/netns/dml-pod-apiserver");
        assert_eq!(value["result"]["ips"][0]["address"], "10.129.0.43/23");
        assert_eq!(value["result"]["ips"][0]["interface"], 1);
        assert_eq!(value["config"], base64(network_config().as_bytes()));
    }
}
