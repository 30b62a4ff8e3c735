//! What the drop and retransmit tracers need to know about this kernel, read at run time:
//! struct offsets and drop reason names from BTF, and the classic tracepoint's record layout.
//!
//! rustc emits no CO-RE relocations, so offsets resolved here reach the programs as globals.

use std::{collections::BTreeMap, fs, path::Path};

use btf_rs::{Btf, Type};

use super::DatapathError;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offsets the drop tracer follows from `struct sk_buff *` to its device and netns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropTracerOffsets {
    /// `sk_buff.dev` (inside anonymous unions on current kernels).
    pub skb_dev: u32,
    /// `net_device.ifindex`.
    pub dev_ifindex: u32,
    /// `net_device.nd_net.net`.
    pub dev_net: u32,
    /// `net.ns.inum`.
    pub net_inum: u32,
    /// `sk_buff.head`, `sk_buff.network_header` and `sk_buff.protocol`: a dropped packet's
    /// destination address, to credit drops on host devices to the pod they were meant for.
    pub skb_head: u32,
    pub skb_network_header: u32,
    pub skb_protocol: u32,
}

/// Byte offsets the retransmit tracer follows from `struct sock *` (through its leading
/// `struct sock_common`) and from the retransmitted `struct sk_buff *`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketOffsets {
    /// `sock_common.skc_net.net`.
    pub net: u32,
    /// `sock_common.skc_state`.
    pub state: u32,
    /// `sock_common.skc_family`.
    pub family: u32,
    /// `sock_common.skc_daddr` (inside anonymous unions).
    pub daddr: u32,
    /// `sock_common.skc_v6_daddr`.
    pub v6_daddr: u32,
    /// `sk_buff.cb`, where TCP keeps its `struct tcp_skb_cb`.
    pub skb_cb: u32,
    /// `tcp_skb_cb.tcp_gso_segs`: the skb's segment count.
    pub gso_segs: u32,
    /// The `tcp_retransmit_skb` tracepoint has an `err` argument (6.13+).
    pub has_err: bool,
}

impl SocketOffsets {
    pub fn resolve(btf: &Btf) -> Result<Self, DatapathError> {
        // struct sock begins with its sock_common; the sum keeps us honest if it ever moves.
        let common = member_offset(btf, "sock", &["__sk_common"])?;
        let field = |path: &[&str]| member_offset(btf, "sock_common", path).map(|offset| common + offset);
        Ok(Self {
            net: field(&["skc_net", "net"])?,
            state: field(&["skc_state"])?,
            family: field(&["skc_family"])?,
            daddr: field(&["skc_daddr"])?,
            v6_daddr: field(&["skc_v6_daddr"])?,
            skb_cb: member_offset(btf, "sk_buff", &["cb"])?,
            gso_segs: member_offset(btf, "tcp_skb_cb", &["tcp_gso_segs"])?,
            has_err: tracepoint_arguments(btf, "tcp_retransmit_skb")? >= 3,
        })
    }
}

/// Arguments of a tp_btf tracepoint, from its `btf_trace_<name>` typedef (whose function
/// prototype has a leading `void *` context besides the tracepoint's own arguments).
fn tracepoint_arguments(btf: &Btf, name: &str) -> Result<usize, DatapathError> {
    let typedef = format!("btf_trace_{name}");
    let missing = || btf_error(typedef.clone());
    let types = btf.resolve_types_by_name(&typedef).map_err(|_| missing())?;
    let Some(Type::Typedef(typedef_type)) = types.into_iter().find(|t| matches!(t, Type::Typedef(_))) else {
        return Err(missing());
    };
    let pointer = btf.resolve_chained_type(&typedef_type).map_err(|_| missing())?;
    let Type::Ptr(pointer) = pointer else { return Err(missing()) };
    let Ok(Type::FuncProto(prototype)) = btf.resolve_chained_type(&pointer) else { return Err(missing()) };
    Ok(prototype.parameters.len().saturating_sub(1))
}

/// Layout of the classic `skb:kfree_skb` tracepoint record, from its format file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracepointLayout {
    pub skbaddr: u32,
    /// None on kernels before 5.17, whose tracepoint has no reason field.
    pub reason: Option<u32>,
}

/// Kernel facts from BTF.
pub struct KernelLayout {
    pub offsets: DropTracerOffsets,
    /// Why not, when the retransmit tracer cannot run on this kernel: then only it is skipped.
    pub socket_offsets: Result<SocketOffsets, String>,
    /// `enum skb_drop_reason` (plus subsystem enums such as OVS's), prefix stripped.
    pub drop_reasons: BTreeMap<u32, String>,
    pub btf: Btf,
}

impl KernelLayout {
    pub fn from_vmlinux() -> Result<Self, DatapathError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    pub fn from_file(path: &Path) -> Result<Self, DatapathError> {
        let btf = Btf::from_file(path).map_err(|source| DatapathError::Btf {
            what: format!("reading {}", path.display()),
            source: source.into(),
        })?;
        let offsets = DropTracerOffsets {
            skb_dev: member_offset(&btf, "sk_buff", &["dev"])?,
            dev_ifindex: member_offset(&btf, "net_device", &["ifindex"])?,
            dev_net: member_offset(&btf, "net_device", &["nd_net", "net"])?,
            net_inum: member_offset(&btf, "net", &["ns", "inum"])?,
            skb_head: member_offset(&btf, "sk_buff", &["head"])?,
            skb_network_header: member_offset(&btf, "sk_buff", &["network_header"])?,
            skb_protocol: member_offset(&btf, "sk_buff", &["protocol"])?,
        };
        let socket_offsets = SocketOffsets::resolve(&btf).map_err(|error| crate::errors::chain(&error));
        let mut drop_reasons = drop_reasons(&btf);
        if path == Path::new(VMLINUX_BTF) {
            for (value, name) in module_drop_reasons(&btf, Path::new(MODULES_BTF_DIR)) {
                drop_reasons.entry(value).or_insert(name);
            }
        }
        Ok(Self { offsets, socket_offsets, drop_reasons, btf })
    }

    /// Drop reasons exist since 5.17, together with the tracepoint's reason argument.
    pub fn has_drop_reasons(&self) -> bool {
        !self.drop_reasons.is_empty()
    }
}

fn btf_error(what: String) -> DatapathError {
    DatapathError::Btf { what, source: "not found in BTF".into() }
}

/// Byte offset of `path` (member names, one per nesting level) inside `struct name`.
/// Anonymous structs and unions are searched through, as C lets code name their members directly.
pub fn member_offset(btf: &Btf, name: &str, path: &[&str]) -> Result<u32, DatapathError> {
    let describe = || format!("struct {name}.{}", path.join("."));
    let mut current = find_struct(btf, name).ok_or_else(|| btf_error(describe()))?;
    let mut bits = 0u32;
    for (depth, field) in path.iter().enumerate() {
        let (offset, member_type) = find_member(btf, &current, field).ok_or_else(|| btf_error(describe()))?;
        bits += offset;
        if depth + 1 < path.len() {
            current = match strip_modifiers(btf, member_type) {
                Some(Type::Struct(s) | Type::Union(s)) => s,
                _ => return Err(btf_error(describe())),
            };
        }
    }
    if !bits.is_multiple_of(8) {
        return Err(DatapathError::Btf { what: describe(), source: "is a bitfield".into() });
    }
    Ok(bits / 8)
}

fn find_struct(btf: &Btf, name: &str) -> Option<btf_rs::Struct> {
    btf.resolve_types_by_name(name).ok()?.into_iter().find_map(|t| match t {
        // Forward declarations and empty duplicates carry no members.
        Type::Struct(s) if !s.members.is_empty() => Some(s),
        _ => None,
    })
}

/// (bit offset, type) of the member named `field`, looking inside anonymous members.
fn find_member(btf: &Btf, parent: &btf_rs::Struct, field: &str) -> Option<(u32, Type)> {
    for member in &parent.members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        let member_type = btf.resolve_chained_type(member).ok()?;
        if member_name == field {
            return Some((member.bit_offset(), member_type));
        }
        if member_name.is_empty()
            && let Type::Struct(inner) | Type::Union(inner) = &member_type
            && let Some((offset, found)) = find_member(btf, inner, field)
        {
            return Some((member.bit_offset() + offset, found));
        }
    }
    None
}

/// Follows typedefs and qualifiers to the type they name.
fn strip_modifiers(btf: &Btf, mut current: Type) -> Option<Type> {
    for _ in 0..16 {
        current = match &current {
            Type::Typedef(t) => btf.resolve_chained_type(t).ok()?,
            Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => btf.resolve_chained_type(t).ok()?,
            Type::TypeTag(t) => btf.resolve_chained_type(t).ok()?,
            _ => return Some(current),
        };
    }
    None
}

/// Where the kernel publishes module BTF (split on vmlinux's), one file per loaded module.
const MODULES_BTF_DIR: &str = "/sys/kernel/btf";
/// Modules whose BTF holds a subsystem's drop reasons: OVS's `enum ovs_drop_reason` lives in
/// `openvswitch.ko`, not in vmlinux.
const DROP_REASON_MODULES: [&str; 2] = ["openvswitch", "mac80211"];

/// Drop reason names from the BTF of the modules in [`DROP_REASON_MODULES`] that are loaded
/// (a module loaded after start-up is named by [`subsystem_reason_name`]).
fn module_drop_reasons(vmlinux: &Btf, dir: &Path) -> BTreeMap<u32, String> {
    let mut reasons = BTreeMap::new();
    for module in DROP_REASON_MODULES {
        let path = dir.join(module);
        if !path.exists() {
            continue;
        }
        match Btf::from_split_file(&path, vmlinux) {
            Ok(btf) => reasons.extend(drop_reasons(&btf)),
            Err(error) => {
                tracing::warn!(%error, module, "cannot read the module's BTF; its drop reasons stay numbered")
            }
        }
    }
    reasons
}

/// Drop reason names of the modules loaded now (parses vmlinux's BTF, their base, once).
pub fn module_reason_names() -> BTreeMap<u32, String> {
    match Btf::from_file(VMLINUX_BTF) {
        Ok(vmlinux) => module_drop_reasons(&vmlinux, Path::new(MODULES_BTF_DIR)),
        Err(error) => {
            tracing::warn!(%error, "cannot read {VMLINUX_BTF}; module drop reasons stay numbered");
            BTreeMap::new()
        }
    }
}

/// The function of openvswitch.ko whose one `kfree_skb` frees the packet of a failed upcall.
const UPCALL_SITE_FUNCTION: &str = "ovs_dp_process_packet";

/// Where OVS's kernel datapath frees the packet of a failed upcall: [start, end) of
/// `ovs_dp_process_packet` and of its cold part (`.cold`, else an empty range), read from
/// `kallsyms` (/proc/kallsyms, opened at start-up, when the agent could still read addresses:
/// the kernel decides that at open).
pub fn ovs_upcall_site(kallsyms: &mut std::fs::File) -> Result<[u64; 4], String> {
    use std::io::{BufRead as _, Seek as _};
    let reading = |error: std::io::Error| format!("reading /proc/kallsyms: {error}");
    kallsyms.seek(std::io::SeekFrom::Start(0)).map_err(reading)?;
    // Line by line: the whole file is megabytes.
    let lines: Result<Vec<String>, _> = std::io::BufReader::new(kallsyms)
        .lines()
        .filter(|line| line.as_ref().map_or(true, |line| line.ends_with("[openvswitch]")))
        .collect();
    upcall_site_in(lines.map_err(reading)?.iter().map(String::as_str))
}

/// [`ovs_upcall_site`] from the lines of /proc/kallsyms. A function ends where the module's
/// next text symbol begins.
fn upcall_site_in<'a>(kallsyms: impl Iterator<Item = &'a str>) -> Result<[u64; 4], String> {
    let cold = format!("{UPCALL_SITE_FUNCTION}.cold");
    let (mut start, mut cold_start, mut text) = (None, None, Vec::new());
    for line in kallsyms {
        let mut fields = line.split_whitespace();
        let (Some(address), Some(kind), Some(name), Some("[openvswitch]")) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !matches!(kind, "t" | "T") {
            continue;
        }
        let Ok(address) = u64::from_str_radix(address, 16) else { continue };
        if name == UPCALL_SITE_FUNCTION {
            start = Some(address);
        } else if name == cold {
            cold_start = Some(address);
        }
        text.push(address);
    }
    let start = start.ok_or_else(|| format!("no {UPCALL_SITE_FUNCTION} of openvswitch.ko in /proc/kallsyms"))?;
    if start == 0 {
        return Err("/proc/kallsyms hides addresses from this agent (kptr_restrict; CAP_SYSLOG)".into());
    }
    let end_of = |start: u64| text.iter().copied().filter(|address| *address > start).min();
    let end = end_of(start).ok_or_else(|| format!("no symbol after {UPCALL_SITE_FUNCTION} in openvswitch.ko"))?;
    let (cold_start, cold_end) = cold_start.and_then(|cold| Some((cold, end_of(cold)?))).unwrap_or_default();
    Ok([start, end, cold_start, cold_end])
}

/// `SKB_DROP_REASON_SUBSYS_OPENVSWITCH`: OVS's own drop reasons are `3 << 16 | n`.
const SUBSYS_OPENVSWITCH: u32 = 3;

/// Whether OVS's own drops are named on this kernel ("btf": `enum ovs_drop_reason` from
/// openvswitch.ko's BTF), else why not, as status and `/readyz` say it.
pub fn ovs_drop_reasons(reasons: &BTreeMap<u32, String>) -> Result<&'static str, String> {
    if reasons.keys().any(|reason| reason >> 16 == SUBSYS_OPENVSWITCH) {
        return Ok("btf");
    }
    if Path::new(MODULES_BTF_DIR).join("openvswitch").exists() {
        Err("openvswitch.ko on this kernel has no drop reasons of its own (enum ovs_drop_reason came with \
             Linux 6.4): the datapath's drops are NOT_SPECIFIED or freed as consumed, unseen; failed upcalls \
             are still named OVS_UPCALL_FAILED"
            .into())
    } else {
        Err("openvswitch.ko is not loaded (looked for again every 10 s)".into())
    }
}

/// A label for a drop reason no BTF named: a subsystem's (`reason >> 16`, the kernel's
/// `SKB_DROP_REASON_SUBSYS_SHIFT`) gets the subsystem's name and its number in it, e.g.
/// `OPENVSWITCH_1` when openvswitch.ko was loaded after the agent started.
pub fn subsystem_reason_name(reason: u32) -> Option<String> {
    let subsystem = match reason >> 16 {
        1 => "MAC80211_UNUSABLE",
        2 => "MAC80211_MONITOR",
        3 => "OPENVSWITCH",
        _ => return None,
    };
    Some(format!("{subsystem}_{}", reason & 0xffff))
}

/// Reason names by value, from `enum skb_drop_reason` and the subsystem enums that extend it.
fn drop_reasons(btf: &Btf) -> BTreeMap<u32, String> {
    const ENUMS: &[(&str, &str)] =
        &[("skb_drop_reason", "SKB_DROP_REASON_"), ("ovs_drop_reason", ""), ("mac80211_drop_reason", "")];
    let mut reasons = BTreeMap::new();
    for (enum_name, prefix) in ENUMS {
        let Ok(types) = btf.resolve_types_by_name(enum_name) else { continue };
        for t in types {
            let Type::Enum(e) = t else { continue };
            for member in &e.members {
                let Ok(name) = btf.resolve_name(member) else { continue };
                // Markers, not reasons.
                if name.ends_with("_MAX") || name.ends_with("SUBSYS_MASK") || name.starts_with("__") {
                    continue;
                }
                let name = name.strip_prefix(prefix).unwrap_or(&name).to_string();
                reasons.entry(member.val()).or_insert(name);
            }
        }
    }
    reasons
}

/// Offset of `field` in a tracepoint `format` file's record, if the record has it.
pub fn tracepoint_field_offset(format: &str, field: &str) -> Option<u32> {
    for line in format.lines() {
        let Some(rest) = line.trim().strip_prefix("field:") else { continue };
        let mut declaration = "";
        let mut offset = None;
        for part in rest.split(';') {
            let part = part.trim();
            if let Some(value) = part.strip_prefix("offset:") {
                offset = value.trim().parse::<u32>().ok();
            } else if declaration.is_empty() {
                declaration = part;
            }
        }
        // "void * skbaddr" names skbaddr; "char comm[16]" names comm; "bool group_dead" names group_dead.
        let name = declaration.rsplit([' ', '*']).next().unwrap_or_default();
        let name = name.split('[').next().unwrap_or_default();
        if name == field {
            return offset;
        }
    }
    None
}

/// Reads a tracepoint's format file from tracefs (either mount point).
pub fn read_tracepoint_format(category: &str, name: &str) -> Result<String, String> {
    let candidates = [
        format!("/sys/kernel/tracing/events/{category}/{name}/format"),
        format!("/sys/kernel/debug/tracing/events/{category}/{name}/format"),
    ];
    for path in &candidates {
        if let Ok(text) = fs::read_to_string(path) {
            return Ok(text);
        }
    }
    Err(format!("no readable format file at {}", candidates.join(" or ")))
}

/// Parses a tracepoint `format` file into the offsets of `skbaddr` and `reason`.
pub fn parse_kfree_skb_format(format: &str) -> Result<TracepointLayout, DatapathError> {
    let skbaddr = tracepoint_field_offset(format, "skbaddr")
        .ok_or_else(|| DatapathError::Tracepoint { what: "kfree_skb format has no skbaddr field".into() })?;
    Ok(TracepointLayout { skbaddr, reason: tracepoint_field_offset(format, "reason") })
}

/// Reads the classic tracepoint's format from tracefs (either mount point).
pub fn read_kfree_skb_format() -> Result<TracepointLayout, DatapathError> {
    read_tracepoint_format("skb", "kfree_skb")
        .map_err(|what| DatapathError::Tracepoint { what })
        .and_then(|text| parse_kfree_skb_format(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upcall_site_is_the_function_and_its_cold_part_up_to_the_next_symbols() {
        let kallsyms = "ffffffff81000000 T _stext
ffffffffc0a01000 t ovs_dp_upcall_helper\t[openvswitch]
ffffffffc0a01230 T ovs_dp_process_packet\t[openvswitch]
ffffffffc0a01100 d ovs_net_id\t[openvswitch]
ffffffffc0a01400 t queue_userspace_packet\t[openvswitch]
ffffffffc0a09000 t ovs_dp_process_packet.cold\t[openvswitch]
ffffffffc0a09080 t ovs_vport_receive.cold\t[openvswitch]
ffffffffc0b00000 t other_function\t[nf_conntrack]
";
        assert_eq!(
            upcall_site_in(kallsyms.lines()),
            Ok([0xffffffffc0a01230, 0xffffffffc0a01400, 0xffffffffc0a09000, 0xffffffffc0a09080])
        );
        // No cold part: an empty second range.
        let plain: String = kallsyms.lines().filter(|l| !l.contains(".cold")).map(|l| format!("{l}\n")).collect();
        assert_eq!(upcall_site_in(plain.lines()), Ok([0xffffffffc0a01230, 0xffffffffc0a01400, 0, 0]));
        // Addresses hidden from an unprivileged reader read as zeroes.
        let hidden = "0000000000000000 T ovs_dp_process_packet\t[openvswitch]\n0000000000000000 t x\t[openvswitch]\n";
        assert!(upcall_site_in(hidden.lines()).is_err_and(|e| e.contains("hides addresses")));
        assert!(
            upcall_site_in("ffffffff81000000 T _stext\n".lines())
                .is_err_and(|e| e.contains("no ovs_dp_process_packet"))
        );
    }

    // From a 6.18 kernel (rx_sk arrived in 6.11).
    const FORMAT_6_18: &str = "name: kfree_skb
ID: 1510
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:void * location;\toffset:16;\tsize:8;\tsigned:0;
\tfield:void * rx_sk;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned short protocol;\toffset:32;\tsize:2;\tsigned:0;
\tfield:enum skb_drop_reason reason;\toffset:36;\tsize:4;\tsigned:0;
";

    // From a 6.1 kernel: no rx_sk, so reason sits earlier.
    const FORMAT_6_1: &str = "\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:void * location;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned short protocol;\toffset:24;\tsize:2;\tsigned:0;
\tfield:enum skb_drop_reason reason;\toffset:28;\tsize:4;\tsigned:0;
";

    // Before 5.17: no reason at all.
    const FORMAT_5_10: &str = "\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:void * location;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned short protocol;\toffset:24;\tsize:2;\tsigned:0;
";

    #[test]
    fn tracepoint_layouts_across_kernels() {
        let cases = [
            (FORMAT_6_18, TracepointLayout { skbaddr: 8, reason: Some(36) }),
            (FORMAT_6_1, TracepointLayout { skbaddr: 8, reason: Some(28) }),
            (FORMAT_5_10, TracepointLayout { skbaddr: 8, reason: None }),
        ];
        for (format, expected) in cases {
            assert_eq!(parse_kfree_skb_format(format).unwrap(), expected);
        }
    }

    #[test]
    fn tracepoint_format_without_skbaddr_is_an_error() {
        assert!(parse_kfree_skb_format("garbage\nfield:int x;\toffset:4;").is_err());
    }

    /// This machine's own kernel: offsets must match what pahole-style dumps show.
    #[test]
    fn resolves_offsets_and_reasons_from_running_kernel() {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("no {VMLINUX_BTF}: skipped");
            return;
        }
        let layout = KernelLayout::from_vmlinux().unwrap();
        // sk_buff.dev follows next and prev pointers on every kernel since 4.x.
        assert_eq!(layout.offsets.skb_dev, 16);
        assert!(layout.offsets.dev_ifindex > 0);
        assert!(layout.offsets.net_inum > 0);
        // Inside the `headers` group: protocol, then the header offsets; head after the group.
        let o = layout.offsets;
        assert!(o.skb_dev < o.skb_protocol && o.skb_protocol < o.skb_network_header, "{o:?}");
        assert!(o.skb_network_header < o.skb_head && o.skb_head.is_multiple_of(8), "{o:?}");
        assert_eq!(layout.drop_reasons.get(&2).map(String::as_str), Some("NOT_SPECIFIED"));
        assert!(layout.drop_reasons.values().any(|r| r == "NO_SOCKET"));
        assert!(layout.drop_reasons.values().any(|r| r == "NETFILTER_DROP"));
        // With openvswitch.ko loaded (the 6.12 test VM), OVS's own reasons are named from its
        // BTF: OVS_DROP_LAST_ACTION is (SKB_DROP_REASON_SUBSYS_OPENVSWITCH << 16) | 1.
        if Path::new(MODULES_BTF_DIR).join("openvswitch").exists() {
            let ovs = layout.drop_reasons.get(&((3 << 16) | 1)).map(String::as_str);
            assert!(ovs.is_none_or(|name| name == "OVS_DROP_LAST_ACTION"), "{ovs:?}");
            eprintln!("openvswitch.ko: reason 196609 is {ovs:?}");
        }
    }

    #[test]
    fn subsystem_reasons_without_btf_names_are_labelled_by_subsystem() {
        assert_eq!(subsystem_reason_name((3 << 16) | 1).as_deref(), Some("OPENVSWITCH_1"));
        assert_eq!(subsystem_reason_name((2 << 16) | 7).as_deref(), Some("MAC80211_MONITOR_7"));
        assert_eq!(subsystem_reason_name(77), None);
        assert_eq!(subsystem_reason_name(9 << 16), None);
        let no_modules = std::env::temp_dir().join("dm-no-module-btf");
        if Path::new(VMLINUX_BTF).exists() {
            let vmlinux = Btf::from_file(VMLINUX_BTF).unwrap();
            assert!(module_drop_reasons(&vmlinux, &no_modules).is_empty());
        }
    }

    /// The retransmit tracer's offsets on this machine's kernel, checked against facts of
    /// `struct sock_common` that hold on every 64-bit kernel since 4.x.
    #[test]
    fn resolves_socket_offsets_from_running_kernel() {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("no {VMLINUX_BTF}: skipped");
            return;
        }
        let layout = KernelLayout::from_vmlinux().unwrap();
        let sock = layout.socket_offsets.unwrap();
        // skc_addrpair (skc_daddr, then skc_rcv_saddr) opens the struct.
        assert_eq!(sock.daddr, 0);
        // After the address pair (8), the hash (4) and the port pair (4).
        assert_eq!(sock.family, 16);
        assert_eq!(sock.state, 18);
        assert!(sock.net > sock.state, "{sock:?}");
        assert!(sock.v6_daddr > sock.net, "{sock:?}");
        assert!(sock.skb_cb > 0, "{sock:?}");
        // tcp_skb_cb: seq (4), end_seq (4), then tcp_gso_segs.
        assert_eq!(sock.gso_segs, 8);
        // This kernel (6.18) passes err to the tracepoint.
        assert!(sock.has_err);
    }
}
