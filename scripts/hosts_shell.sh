#!/usr/bin/env bash
# Open an interactive shell on host 0 of COUNT isolated hosts made by hoccl_backend/testbed/hosts.py,
# for trying multi-host runs by hand. Leaving the shell tears every host down.
#
#   scripts/hosts_shell.sh [COUNT] [LINK_GBIT]
#
# It prints how to enter the other hosts, their addresses and a torchrun line.
set -euo pipefail
count="${1:-2}"
gbit="${2:-}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
code="$(cat <<'PY'
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from hoccl_backend.testbed.hosts import Hosts

count, gbit = int(sys.argv[2]), (float(sys.argv[3]) if sys.argv[3] else None)
with Hosts(count=count, link_gbit=gbit) as hosts:
    for h in range(count):
        enter = " ".join(hosts.command(h, ["bash"]))
        print(f"  host {h}: {hosts.names[h]} {hosts.addr(h)} on {hosts.ifname(h)}; enter: {enter}")
    print(f"  e.g. torchrun --nnodes {count} --node_rank H --nproc_per_node 2 "
          f"--rdzv-backend c10d --rdzv-endpoint {hosts.addr(0)}:29400 script.py")
    print("  (exit the shell to tear the hosts down)", flush=True)
    subprocess.run(hosts.command(0, ["bash", "-i"]), env=hosts.env_for(0))
PY
)"
exec python3 -c "$code" "$repo" "$count" "$gbit"
