"""The `rackflow` command (`rackflow.cli.main`, also `python -m rackflow`).

gRPC's core logs through absl, whose default writes INFO lines to stderr in a format of its own: a failed
TLS handshake (a plaintext client, a port scan, a load balancer probing in plaintext) wrote `I1206
07:11:56.005056 29596 ssl_transport_security.cc:2563] Handshake failed …` between `rackflow serve`'s log
lines, a line that is not JSON in a `--log-format json` log. Its core reads GRPC_VERBOSITY once, when
grpc is imported, so it is set here, before any module of the command imports grpc: errors only. An
operator's own GRPC_VERBOSITY (INFO, DEBUG, to look into a connection) wins.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
