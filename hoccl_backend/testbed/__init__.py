"""Real hosts on one machine (network, IPC, mount, PID and UTS namespaces joined by a bridge),
for the multi-host tests and `python -m hoccl_backend.bench --hosts N`. See hosts.py."""
