#!/bin/bash
# PID 1 of the test VM after switch_root, on the host's userland (read-only, with a RAM
# overlay). Mounts what the agent and the tests expect on a node, runs the job, prints its
# exit status on the console for `cargo xtask vm` to read, and powers off.
. /run/dm-vm/env
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
ln -sf /proc/self/fd /dev/fd

# The kernel package's modules, where modprobe (and the kernel's module autoloading) look.
mkdir -p "/lib/modules/$DM_VM_RELEASE"
mount --bind "$DM_VM_MODULES" "/lib/modules/$DM_VM_RELEASE"
echo /sbin/modprobe > /proc/sys/kernel/modprobe
for module in $DM_VM_PRELOAD; do
    modprobe "$module" 2>/dev/null || echo "dm-vm: module $module not loaded"
done

hostname "$DM_VM_HOSTNAME"
ip link set lo up
if [ -n "$DM_VM_NET" ] && ip link show eth0 >/dev/null 2>&1; then
    # QEMU's user network: the host reaches forwarded guest ports on 127.0.0.1.
    ip addr add 10.0.2.15/24 dev eth0
    ip link set eth0 up
    ip route add default via 10.0.2.2
fi

echo "dm-vm: Linux $(uname -r) up in $(cut -d' ' -f1 /proc/uptime) s"
cd "$DM_VM_WORKDIR" || cd /
bash /run/dm-vm/job.sh </dev/null
status=$?
echo "DM-VM-EXIT=$DM_VM_NONCE:$status"
sync
echo o > /proc/sysrq-trigger
sleep 10
