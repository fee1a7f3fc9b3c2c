"""The one loopback rule: pyconcbench binds and connects on this machine only.

``address(host)`` turns "localhost" or a numeric IP into the address to use, and refuses
anything that is not 127.0.0.0/8 or ::1 with ``NotLoopback`` (a ValueError) naming the host.
The server process (``serve``), the harness and the load generator (``loadgen``) all ask it;
the C engine repeats the check on the address it is given (native/pcb_module.c), as the last
line for callers of ``_native.Load`` that bypass ``loadgen``.
"""
from __future__ import annotations

import ipaddress

__all__ = ["NotLoopback", "address"]


class NotLoopback(ValueError):
    """A host that is not a loopback address."""


def address(host: str) -> str:
    """``host`` as a numeric loopback address ("localhost" is 127.0.0.1); NotLoopback else."""
    if not isinstance(host, str):
        raise NotLoopback(f"refusing host {host!r}: not a string")
    if host == "localhost":
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise NotLoopback(f"refusing host {host!r}: not an IP address or 'localhost'") from None
    if not ip.is_loopback:
        raise NotLoopback(f"refusing host {host!r}: not a loopback address (127.0.0.0/8, ::1); "
                          "pyconcbench only measures servers on this machine")
    return str(ip)
