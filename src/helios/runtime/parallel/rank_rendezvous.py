"""Rank rendezvous: how N ranks find each other, agree that they serve one core, and form a group.

Everything goes through a `torch.distributed` key-value store: a TCPStore served by rank zero (ranks
in other processes or on other hosts connect to HOST:PORT) or a HashStore (ranks that are threads
of one process). The protocol, in order:

1. rank zero publishes the `Launch` before it loads its own model: the `RankIdentity` every rank
   must match (rank count, cache identity, digest of the contract and manifest, wire signature)
   and the startup choices every rank must share (rank zero's startup options, host page slots,
   collective timeout), so every rank loads its weights at the same time;
2. once loaded, rank zero publishes the `Sizing` (physical pages, which only its load decides, and
   the variants it selected), or why it failed to load; a peer loads its programs and weights,
   waits for the sizing, allocates its buffers and compares its variants;
3. each peer takes its rank (given, or the next free one after the local ranks) and claims it
   (``claim``: a rank claimed twice is refused to the second claimant, which never reaches the
   group), compares its own core with the identity and either marks itself ready after loading
   its model or records why it refuses (``reject``); rank zero waits for every rank, failing with
   a typed `LoadError` on a refusal (or an answer it cannot read), a local peer that died, or a
   rank that did not come within the join timeout;
4. once every rank is ready rank zero says so (``publish_formation``; a ready peer waits for it up to
   the join timeout, ``await_formation``: forming the group waits only the collective timeout, and a
   rank that joins later than that after the first must not break the group);
5. every rank forms its process groups (``form_group``): a gloo group, whose timeout bounds every
   CPU collective (rank zero keeps an idle group alive with keepalive exchanges, see
   `helios.runtime.parallel.ranks`), and for a CUDA model also an NCCL group for the programs' collectives.

The store itself (torch's libuv TCPStore server) validates what clients send before it allocates
(a handshake magic, keys of at most 8 KiB) and serves the other clients meanwhile, so a client that
connects and sends nothing, garbage or a huge length changes nothing for the real ranks. The
store's client is less careful: against a server that accepts but never answers (or a rank zero
stopped with SIGSTOP) its calls block for ever, whatever their timeout. A peer therefore makes
every store call in a helper thread that it waits for at most the join timeout (`_bounded`;
`MissingRankError` when it passes), waits for rank zero's records by polling in short slices,
refuses a record it cannot decode with a typed error, and checks the rendezvous address (a port
1..65535, a host that resolves) before it connects.

Gloo carries the control messages in every case, since they are CPU tensors and NCCL moves device
memory only. Gloo collectives work for ranks that are threads of one process as long as each rank
creates its own ProcessGroup object (never the process-global default group), which is what this
module does; NCCL ranks are processes (`helios.runtime.parallel.rank_devices` says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from helios.abi.collectives import RankGroup
from helios.contract import StartupOptions
from helios.contract.settings import SamplingOptions
from helios.errors import LoadError
from helios.runtime.parallel.rank_devices import RankBackend
from helios.runtime.parallel.rank_wire import wire_signature

_LAUNCH, _SIZING, _NEXT_REMOTE, _FORM = "helios/launch", "helios/sizing", "helios/next_remote", "helios/form"
_POLL_S = 0.05
_FORM_MARGIN_S = 30.0  # past the group's own timeout, which bounds forming it: a safety net only
_REASON_BYTES = 4096  # of a peer's refusal, as sent and as read


class RankJoinError(LoadError):
    """A rank could not join: wrong core, wrong rank count, version mismatch or a refusal."""


class MissingRankError(LoadError):
    """A rank did not join (or died) before the join timeout."""


@dataclass(frozen=True)
class RankIdentity:
    """What every rank's core must agree on."""

    ranks: int
    cache_identity: str
    contract_digest: str
    wire: str

    @classmethod
    def of(cls, prepared) -> "RankIdentity":
        contract, manifest = prepared.encode()
        digest = hashlib.sha256(contract + b"\0" + manifest).hexdigest()
        return cls(prepared.manifest.ranks, prepared.contract.cache_identity, digest, wire_signature())

    def mismatch(self, other: "RankIdentity") -> str | None:
        """Why `other` (a peer's) cannot join a group of `self`, or None when it can."""
        if other.wire != self.wire:
            return "it runs another helios version (rank wire signature differs)"
        if other.ranks != self.ranks:
            return f"its core is prepared for {other.ranks} ranks, rank zero's for {self.ranks}"
        if other.cache_identity != self.cache_identity:
            return f"its core has cache identity {other.cache_identity}, rank zero's {self.cache_identity}"
        if other.contract_digest != self.contract_digest:
            return "its core's contract or manifest differs from rank zero's"
        return None


@dataclass(frozen=True)
class Launch:
    """Rank zero's startup choices that every rank loads with."""

    identity: RankIdentity
    startup: StartupOptions  # rank zero's, as given: every rank resolves the same settings from them
    host_pages: int
    first_remote_rank: int  # ranks below it run on rank zero's host; the others join from elsewhere
    collective_timeout_s: float
    backend: str = RankBackend.GLOO.value  # of the programs' collectives: rank zero's device decides
    cuda_graphs: bool = False  # every rank captures its programs into CUDA graphs once the group is formed
    join_timeout_s: float = 300.0  # how long a peer waits for rank zero's `Sizing` (rank zero loading)
    symmetric_all_reduce: bool = False  # every rank sets up the one-shot symmetric all-reduce (CUDA)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> "Launch":
        fields = json.loads(data.decode("utf-8"))
        fields["identity"] = RankIdentity(**fields["identity"])
        startup = fields["startup"]
        fields["startup"] = replace(StartupOptions(**startup), sampling=SamplingOptions(**startup["sampling"]))
        launch = cls(**fields)
        launch._check()
        return launch

    def _check(self) -> None:
        """Raises ValueError for values no rank zero publishes (a peer then refuses the launch)."""
        identity = self.identity
        if not (_is_int(identity.ranks) and identity.ranks >= 1
                and all(isinstance(v, str) for v in (identity.cache_identity, identity.contract_digest, identity.wire))):
            raise ValueError("the launch's identity has values of the wrong kind")
        if not (_is_int(self.host_pages) and self.host_pages >= 0
                and _is_int(self.first_remote_rank) and 1 <= self.first_remote_rank <= self.ranks):
            raise ValueError("the launch's host pages or first remote rank are out of range")
        if not all(_is_seconds(v) for v in (self.collective_timeout_s, self.join_timeout_s)):
            raise ValueError("the launch's timeouts are not positive finite seconds")
        if self.backend not in {b.value for b in RankBackend} or not all(
                isinstance(v, bool) for v in (self.cuda_graphs, self.symmetric_all_reduce)):
            raise ValueError("the launch's backend or flags are not of this version")

    @property
    def ranks(self) -> int:
        return self.identity.ranks


@dataclass(frozen=True)
class Sizing:
    """What rank zero's own load decided, published once it has loaded (or failed to)."""

    num_pages: int
    variants: tuple[str, ...]
    error: str = ""  # rank zero failed to load: every peer gives up with this reason

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> "Sizing":
        fields = json.loads(data.decode("utf-8"))
        fields["variants"] = tuple(fields["variants"])
        sizing = cls(**fields)
        if not (_is_int(sizing.num_pages) and sizing.num_pages >= 0 and isinstance(sizing.error, str)
                and all(isinstance(name, str) for name in sizing.variants)):
            raise ValueError("the sizing has values of the wrong kind")
        return sizing


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


class AddressError(RankJoinError):
    """A rendezvous address that is not HOST:PORT with a port 1..65535, or whose host does not resolve."""


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of a rendezvous to join: a port 1..65535 (no port 0: a joiner needs rank zero's)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not _is_port(port) or not 1 <= int(port) <= 65535:
        raise AddressError(f"rendezvous address {address!r} is not HOST:PORT with a port 1..65535")
    return host, int(port)


def _is_port(text: str) -> bool:
    """Whether `text` is a port number that `int` reads: ASCII digits, at most five (`str.isdigit`
    also takes '²', which `int` refuses, and other scripts' digits; `int` refuses 4,300 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 5


def serve_address(address: str) -> tuple[str, int]:
    """(host, port) rank zero can serve a rendezvous on: HOST:PORT with a port 0..65535 (0: any free
    one) and a host that is an address of this machine (or 0.0.0.0 / ::), checked by binding a
    probe socket to it; `AddressError` otherwise, at once (the store itself would wait its whole
    timeout for a host that is not this machine's)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not _is_port(port) or not 0 <= int(port) <= 65535:
        raise AddressError(f"rendezvous address {address!r} is not HOST:PORT with a port 0..65535")
    try:
        family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except (OSError, UnicodeError) as error:
        raise AddressError(f"cannot serve the rendezvous on {host!r}: {getattr(error, 'strerror', None) or error} "
                           "(give an address of this machine)") from None
    return host, int(port)


def resolve_address(address: str) -> tuple[str, int]:
    """`parse_address`, and the host must resolve (`AddressError` at once otherwise)."""
    host, port = parse_address(address)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise AddressError(f"rendezvous host {host!r} does not resolve: {error}") from None
    return host, port


class Rendezvous:
    """The store shared by the ranks, and the address this rank's gloo device listens on."""

    def __init__(self, store, device_host: str | None, address: str = "in-process",
                 call_timeout_s: float | None = None):
        self.symmetric_refusal: str | None = None  # why `form_group(symmetric=True)` kept NCCL only
        self.store = store
        self.call_timeout_s = call_timeout_s  # a joiner's bound on each store call (None: rank zero's own store)
        self.device_host = device_host  # None: gloo's default device for this host
        self.address = address

    @classmethod
    def in_process(cls) -> "Rendezvous":
        return cls(dist.HashStore(), "127.0.0.1")

    @classmethod
    def serve(cls, host: str, port: int, timeout: timedelta) -> "Rendezvous":
        """Rank zero's store on host:port (port 0: any free port); `AddressError` when it cannot
        serve there (checked by `serve_address`, or a taken port)."""
        host, port = serve_address(f"{host}:{port}")
        listener = _listen(host, port)
        bound = listener.getsockname()[1]
        fd = listener.detach()  # the store's server owns the socket from here, and closes it (also when it fails)
        try:
            store = dist.TCPStore(host, bound, None, True, timeout, wait_for_workers=False, master_listen_fd=fd)
        except (RuntimeError, OSError) as error:  # DistNetworkError is a RuntimeError
            raise AddressError(f"cannot serve the rendezvous on {host}:{port}: {_first_line(error)}") from error
        device = None if host in ("0.0.0.0", "::", "") else host
        return cls(store, device, f"{host}:{store.port}")

    @classmethod
    def join(cls, address: str, timeout: timedelta) -> "Rendezvous":
        """A peer's store client. Waits up to `timeout` for rank zero to listen, in short
        connection attempts (a signal is handled between them), then connects the store."""
        host, port = resolve_address(address)
        timeout_s = timeout.total_seconds()
        _await_listener(host, port, address, timeout_s)
        try:
            store = _bounded(lambda: dist.TCPStore(host, port, None, False, timeout), timeout_s + 1.0,
                             f"rank zero at {address} accepted the connection but never answered")
        except (RuntimeError, OSError) as error:  # DistStoreError is a RuntimeError
            raise MissingRankError(f"cannot reach rank zero at {address}: {_first_line(error)}") from error
        return cls(store, _route_to(host), address, timeout_s)

    def for_thread(self, timeout: timedelta) -> "Rendezvous":
        """The rendezvous of a peer that is a thread of this process: its own client of a served
        store (the connection of a store client is held by one call at a time, and gloo's group
        formation holds it while it waits for the other ranks, so two ranks of this process on one
        client never formed a group), the same in-process store otherwise."""
        if isinstance(self.store, dist.HashStore):
            return self
        host, port = parse_address(self.address)
        try:
            store = dist.TCPStore(host, port, None, False, timeout)
        except (RuntimeError, OSError) as error:
            raise MissingRankError(f"a local rank cannot reach the rendezvous {self.address}: "
                                   f"{_first_line(error)}") from error
        return Rendezvous(store, self.device_host, self.address)

    def _call(self, call, what: str):
        """`_bounded_call`, where a broken connection (rank zero is gone) is a `MissingRankError`
        as a silent rank zero is, not the store's own DistNetworkError (`helios rank` exits 8, not 1)."""
        try:
            return self._bounded_call(call, what)
        except RuntimeError as error:
            raise MissingRankError(f"rank zero at {self.address} went away ({what}): {_first_line(error)}") from error

    def _bounded_call(self, call, what: str):
        """`call()` (a store call), bounded by `call_timeout_s` for a joiner."""
        if self.call_timeout_s is None:
            return call()
        return _bounded(call, self.call_timeout_s, f"rank zero at {self.address} stopped answering ({what})")

    def publish(self, launch: Launch) -> None:
        self.store.set(_LAUNCH, launch.encode())

    def read_launch(self, timeout: timedelta) -> Launch:
        data = self._await(_LAUNCH, timeout.total_seconds(), "published no launch")
        try:
            return Launch.decode(data)
        except (ValueError, TypeError, KeyError, AttributeError) as error:  # another version's launch record
            raise RankJoinError(f"rank zero at {self.address} runs another helios version: {error}") from None

    def publish_sizing(self, sizing: Sizing) -> None:
        self.store.set(_SIZING, sizing.encode())

    def read_sizing(self, timeout: timedelta) -> Sizing:
        """A peer: rank zero's sizing, waiting up to `timeout` for it to load; raises
        `RankJoinError` when rank zero failed to load, `MissingRankError` when it never answered."""
        data = self._await(_SIZING, timeout.total_seconds(), "did not finish loading")
        try:
            sizing = Sizing.decode(data)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise RankJoinError(f"rank zero at {self.address} published a sizing this rank cannot read "
                                f"(another helios version?): {error}") from None
        if sizing.error:
            raise RankJoinError(f"rank zero failed to load: {sizing.error}")
        return sizing

    def _await(self, key: str, timeout_s: float, missing: str) -> bytes:
        """The value of `key` once rank zero set it, polled in short slices up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self._bounded_call(lambda: self.store.check([key]), key):
                if time.monotonic() >= deadline:
                    raise MissingRankError(f"rank zero at {self.address} {missing} within {timeout_s:g} s")
                time.sleep(_POLL_S)
            return self._bounded_call(lambda: self.store.get(key), key)
        except RuntimeError as error:  # the store's connection broke: rank zero is gone
            raise MissingRankError(f"rank zero at {self.address} {missing}: it went away "
                                   f"({_first_line(error)})") from error

    def next_remote_rank(self, first_remote: int) -> int:
        return first_remote + self._call(lambda: self.store.add(_NEXT_REMOTE, 1), _NEXT_REMOTE) - 1

    def claim(self, rank: int) -> None:
        """Takes `rank` for this peer; `RankJoinError` when another peer claimed it first (two
        ranks of one number would break the group for every rank)."""
        if self._call(lambda: self.store.add(f"helios/claim/{rank}", 1), "claim") != 1:
            raise RankJoinError(f"rank {rank} is already taken by another peer of {self.address}")

    def mark_ready(self, rank: int) -> None:
        self._call(lambda: self.store.set(f"helios/ready/{rank}", b"ok"), "ready")

    def reject(self, rank: int, reason: str) -> None:
        """Tells rank zero why `rank` does not join; best effort (rank zero may be gone, which the
        caller's own error then says). The reason is cut to what the store takes."""
        with contextlib.suppress(RuntimeError, MissingRankError):
            self._call(lambda: self.store.set(f"helios/ready/{rank}", b"reject:" + reason.encode("utf-8")[:_REASON_BYTES]),
                       "refusal")

    def publish_formation(self, go: bool = True) -> None:
        """Rank zero, once every rank is ready: the peers may form the group now; or (`go` False,
        best effort) it gave up starting, and the peers that wait for the others leave."""
        if go:
            self.store.set(_FORM, b"go")
            return
        with contextlib.suppress(RuntimeError):
            self.store.set(_FORM, b"stop")

    def await_formation(self, timeout: timedelta) -> None:
        """A ready peer: returns once rank zero saw every rank ready (`publish_formation`), waiting
        up to `timeout` (rank zero's join timeout) for the others; `MissingRankError` when it does
        not come, `RankJoinError` when rank zero gave up."""
        if self._await(_FORM, timeout.total_seconds(), "did not see every rank join") != b"go":
            raise RankJoinError(f"rank zero at {self.address} gave up starting the group")

    def wait_ready(self, ranks: range, timeout_s: float, lost: Callable[[], str | None]) -> None:
        """Rank zero: returns once every rank in `ranks` is ready; `lost()` names a dead local peer."""
        deadline, waiting = time.monotonic() + timeout_s, set(ranks)
        while waiting:
            for rank in sorted(waiting):
                key = f"helios/ready/{rank}"
                if not self.store.check([key]):
                    continue
                answer = self.store.get(key)
                if answer.startswith(b"reject:"):
                    reason = answer[7:7 + _REASON_BYTES].decode("utf-8", "replace")  # a peer's text: bounded
                    raise RankJoinError(f"rank {rank} refused to join: {reason}")
                if answer != b"ok":
                    raise RankJoinError(f"rank {rank} answered {answer[:64]!r}, which is neither ready nor a refusal "
                                        "(another helios version?)")
                waiting.discard(rank)
            reason = lost()
            if reason is not None:
                raise MissingRankError(reason)
            if waiting and time.monotonic() > deadline:
                raise MissingRankError(f"rank(s) {sorted(waiting)} did not join {self.address} within {timeout_s:g} s")
            if waiting:
                time.sleep(_POLL_S)

    def form_group(self, rank: int, size: int, timeout: timedelta,
                   device: torch.device | None = None, symmetric: bool = False) -> RankGroup:
        """This rank's groups; blocks until every rank calls it. `timeout` bounds forming the groups
        and every later CPU collective. With a CUDA `device` (this rank's) the group also gets an
        NCCL process group, connected here with one all_reduce so that a rank that cannot reach
        the others fails startup, not its first step (or a CUDA graph capture). `symmetric`: also
        set up the one-shot symmetric-memory all-reduce (`helios.abi.symmetric_reduce`); the
        group has it only when every rank could set it up and it agreed with NCCL on a probe
        (the ranks agree over gloo, so all take the same path)."""
        options = dist.ProcessGroupGloo._Options()
        host = (dist.ProcessGroupGloo.create_device(hostname=self.device_host) if self.device_host
                else dist.ProcessGroupGloo.create_default_device())
        options._devices = [host]
        options._timeout = timeout
        # In a helper thread that this one waits for: gloo waits for every rank in native code,
        # where a stop signal's handler cannot run (rank zero's SIGINT waited out the timeout).
        timeout_s = timeout.total_seconds()
        try:
            group = _bounded(lambda: dist.ProcessGroupGloo(dist.PrefixStore("helios/group", self.store), rank, size,
                                                           options), timeout_s + _FORM_MARGIN_S,
                             f"rank {rank} could not form the group of {size}")
        except RuntimeError as error:
            raise MissingRankError(f"rank {rank} could not form the group of {size}: {_first_line(error)}") from error
        if device is None or device.type == "cpu":
            return RankGroup(group, rank, size, timeout)
        formed = RankGroup(group, rank, size, timeout, self._nccl_group(rank, size, timeout, device))
        if not symmetric:
            return formed
        reducer, self.symmetric_refusal = _symmetric_reducer(formed, self.store, device)
        return replace(formed, reducer=reducer)

    def _nccl_group(self, rank: int, size: int, timeout: timedelta, device: torch.device):
        # On a collective past `timeout` NCCL's watchdog aborts the communicator without ending
        # the process (2 = CleanUpOnly; torch's default tears the whole process down, here the
        # serving process); later calls on it raise, which the runtime reports as a lost rank.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        try:
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore("helios/nccl", self.store), rank, size, options)
            with torch.cuda.device(device):
                probe = torch.ones(1, device=device)
                nccl.allreduce([probe]).wait(timeout)  # startup only: blocking here is fine
                torch.cuda.synchronize(device)
        except RuntimeError as error:
            raise MissingRankError(f"rank {rank} could not connect NCCL on {device} to the group of {size}: "
                                   f"{_first_line(error)}") from error
        return nccl


def _symmetric_reducer(group: RankGroup, store, device: torch.device):
    """(reducer, None) when every rank set one up and it sums a probe as NCCL does, else (None,
    why not). Collective over the group's gloo group: every rank decides alike."""
    from helios.abi.symmetric_reduce import SymmetricMemoryUnavailable, open_symmetric_reducer

    reducer, reason = None, ""
    try:
        reducer = open_symmetric_reducer(group.device_group, "helios-tp", group.rank, group.size,
                                         dist.PrefixStore("helios/symmetric", store), device)
    except SymmetricMemoryUnavailable as error:
        reason = f"rank {group.rank}: {error}"
    if not _all_ranks(group, reducer is not None):
        return None, reason or "another rank could not set up symmetric memory"
    with torch.cuda.device(device):
        probe = (torch.arange(4096, dtype=torch.float32, device=device) * (group.rank + 1) / 7).to(torch.bfloat16)
        nccl = probe.clone()
        group.device_group.allreduce([nccl]).wait(group.timeout)
        agrees = torch.equal(reducer.all_reduce(probe), nccl)
        torch.cuda.synchronize(device)
    if not _all_ranks(group, agrees):
        return None, "the symmetric all-reduce disagreed with NCCL on a probe"
    return reducer, None


def _all_ranks(group: RankGroup, flag: bool) -> bool:
    votes = torch.tensor([int(flag)], dtype=torch.int64)
    group.all_reduce(votes)  # gloo: a CPU tensor
    return int(votes) == group.size


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _bounded(call: Callable[[], object], timeout_s: float, why: str):
    """`call()` in a helper thread, waited for at most `timeout_s`: its result or its exception,
    or `MissingRankError(why)` when it has not returned by then (the thread is left behind, blocked
    on a connection that its process's exit or the peer's closing ends)."""
    box: list = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            box.append((False, error))

    helper = threading.Thread(target=run, name="helios-rendezvous-call", daemon=True)
    helper.start()
    helper.join(timeout_s)
    if not box:
        raise MissingRankError(f"{why}: no answer within {timeout_s:g} s")
    done, value = box[0]
    if not done:
        raise value
    return value


def _await_listener(host: str, port: int, address: str, timeout_s: float) -> None:
    """Returns once something accepts connections on host:port, trying every 0.2 s up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(1.0, deadline - time.monotonic()))):
                return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise MissingRankError(f"cannot reach rank zero at {address} within {timeout_s:g} s: "
                                       f"{error.strerror or error}") from None
        time.sleep(0.2)


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port only, for the store's server: given a host, the server
    would itself listen on every interface of the machine, and the store is unauthenticated.
    `AddressError` when it cannot (a taken port)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own server does
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
    except OSError as error:
        listener.close()
        raise AddressError(f"cannot serve the rendezvous on {host}:{port}: {error.strerror or error}") from None
    return listener


def _route_to(host: str) -> str:
    """The local address that reaches `host` (loopback for a loopback rendezvous), of the family
    rank zero's gloo device takes for `host` (gloo pairs addresses of one family only): an IPv6
    rendezvous gets an IPv6 address. A wildcard rendezvous (rank zero on gloo's default device)
    is reached over IPv4 loopback."""
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
