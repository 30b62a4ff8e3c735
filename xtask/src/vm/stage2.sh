#!/bin/bash
# PID 1 of the test VM after switch_root, on the host's userland (read-only, with a RAM
# overlay; init.sh mounted everything). Runs the job, prints its exit status on the console
# for `cargo xtask vm` to read, and powers off.
. /run/dm-vm/env
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
read -r uptime _ </proc/uptime
echo "dm-vm: Linux $DM_VM_RELEASE up in $uptime s"
cd "$DM_VM_WORKDIR" || cd /
bash /run/dm-vm/job.sh </dev/null
status=$?
echo "DM-VM-EXIT=$DM_VM_NONCE:$status"
sync
echo o > /proc/sysrq-trigger
sleep 10
