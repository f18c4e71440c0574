"""The ICE candidates of a WebRTC offer that the server will try: its ICE agent sends STUN to every
address an offer names, so a client could make it probe the server's own network (loopback, the
cloud's link-local metadata address, private hosts) or resolve names for it (mDNS `.local`, DNS).

`public` keeps only candidates whose address is a globally routable IP; `any` keeps them all (a
server for a LAN, or the operator's own on loopback). Either way an offer naming more than
MAX_OFFER_CANDIDATES is refused: each costs checks and packets.
"""

from __future__ import annotations

import ipaddress

MAX_OFFER_CANDIDATES = 32  # a browser offers a few per interface and server; bundled, one m-line has them
MODES = ("auto", "public", "any")


class TooManyCandidates(ValueError):
    pass


def _public(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # a name (mDNS `.local`, DNS): resolving it is what we must not do for a client
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def filter_offer(sdp: str, public_only: bool) -> tuple[str, int]:
    """The offer with the candidates the server may not try removed, and how many were removed.
    Raises TooManyCandidates when it names more than MAX_OFFER_CANDIDATES."""
    lines = sdp.split("\n")
    candidates = [ln for ln in lines if ln.startswith("a=candidate:")]
    if len(candidates) > MAX_OFFER_CANDIDATES:
        raise TooManyCandidates(f"the offer names {len(candidates)} ICE candidates; at most {MAX_OFFER_CANDIDATES} "
                                "are tried")
    if not public_only:
        return sdp, 0
    kept = [ln for ln in lines if not ln.startswith("a=candidate:") or _allowed(ln)]
    return "\n".join(kept), len(lines) - len(kept)


def _allowed(line: str) -> bool:
    fields = line.split()
    return len(fields) >= 8 and _public(fields[4])  # foundation component transport priority ADDRESS port typ T
